// Package sbtypes holds the sandbox error classes and the types the agent and its clients share,
// importing only the standard library so the in-sandbox agent links nothing heavy; package
// sandbox re-exports all of it.
package sbtypes

import "errors"

// Error classes. Wrap them with %w; each wire maps them to codes in one place. sandbox.ErrX and
// spec.ErrInvalid are these same values.
var (
	ErrNotFound         = errors.New("not found")
	ErrUnsupported      = errors.New("unsupported")
	ErrRefused          = errors.New("refused")
	ErrDeadlineExceeded = errors.New("deadline exceeded")
	ErrOutcomeUnknown   = errors.New("outcome unknown")
	ErrUnreachable      = errors.New("unreachable")
	ErrInvalid          = errors.New("invalid") // one class for a bad declaration and a bad request
	ErrUnauthenticated  = errors.New("unauthenticated")
	ErrForbidden        = errors.New("forbidden")
	ErrConflict         = errors.New("conflict")
	ErrTooLarge         = errors.New("too large")
)
