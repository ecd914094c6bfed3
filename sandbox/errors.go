package sandbox

import (
	"errors"

	"github.com/airlock-sandbox/airlock/spec"
)

// Error classes. Wrap them with %w; each wire maps them to codes in one place.
var (
	ErrNotFound         = errors.New("not found")
	ErrUnsupported      = errors.New("unsupported")
	ErrRefused          = errors.New("refused")
	ErrDeadlineExceeded = errors.New("deadline exceeded")
	ErrOutcomeUnknown   = errors.New("outcome unknown")
	ErrUnreachable      = errors.New("unreachable")
	ErrInvalid          = spec.ErrInvalid // one class for a bad declaration and a bad request
	ErrUnauthenticated  = errors.New("unauthenticated")
	ErrForbidden        = errors.New("forbidden")
	ErrConflict         = errors.New("conflict")
	ErrTooLarge         = errors.New("too large")
)
