package sandbox

import "github.com/airlock-sandbox/airlock/sandbox/sbtypes"

// Error classes, defined in sbtypes (which the lean agent links instead of this package). Wrap
// them with %w; each wire maps them to codes in one place.
var (
	ErrNotFound         = sbtypes.ErrNotFound
	ErrUnsupported      = sbtypes.ErrUnsupported
	ErrRefused          = sbtypes.ErrRefused
	ErrDeadlineExceeded = sbtypes.ErrDeadlineExceeded
	ErrOutcomeUnknown   = sbtypes.ErrOutcomeUnknown
	ErrUnreachable      = sbtypes.ErrUnreachable
	ErrInvalid          = sbtypes.ErrInvalid // also spec.ErrInvalid: a bad declaration and a bad request branch alike
	ErrUnauthenticated  = sbtypes.ErrUnauthenticated
	ErrForbidden        = sbtypes.ErrForbidden
	ErrConflict         = sbtypes.ErrConflict
	ErrTooLarge         = sbtypes.ErrTooLarge
)
