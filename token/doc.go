// Package token mints and verifies Ed25519 capability tokens scoped to one sandbox session.
package token
