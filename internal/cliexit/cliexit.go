// Package cliexit is the exit statuses and errors every airlock command shares, with no dependency of its own (the lean front links it).
package cliexit

import "fmt"

// Exit statuses every command shares.
const (
	ExitOK      = 0
	ExitRefused = 1 // the command ran and found something refused (or failed)
	ExitUsage   = 2 // bad flags, arguments or input files
)

// ExitError carries a command's exit status; Err, when set, is printed on stderr.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return e.Err.Error()
}

func (e *ExitError) Unwrap() error { return e.Err }

// UsageError is a bad flag, argument or input: exit status 2.
func UsageError(format string, a ...any) error {
	return &ExitError{Code: ExitUsage, Err: fmt.Errorf(format, a...)}
}
