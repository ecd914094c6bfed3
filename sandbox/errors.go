package sandbox

import "errors"

// Error classes. Wrap them with %w; each wire maps them to codes in one place.
var (
	ErrNotFound         = errors.New("not found")
	ErrUnsupported      = errors.New("unsupported")
	ErrRefused          = errors.New("refused")
	ErrDeadlineExceeded = errors.New("deadline exceeded")
	ErrOutcomeUnknown   = errors.New("outcome unknown")
	ErrUnreachable      = errors.New("unreachable")
	ErrInvalid          = errors.New("invalid")
	ErrUnauthenticated  = errors.New("unauthenticated")
	ErrForbidden        = errors.New("forbidden")
	ErrConflict         = errors.New("conflict")
	ErrTooLarge         = errors.New("too large")
)
