// Package tools pins the code generators and chart tools the repository's tests run; a module of
// its own so that their dependencies stay out of airlock's binaries and go.mod.
package tools
