package sbtypes

import (
	"errors"
	"net/http"
)

// Code is one error class on every wire: the agent protocol, the daemon's API and the broker
// all answer a class with this code and HTTP status, and every client maps the code back, so
// errors.Is holds across any of them.
type Code struct {
	Class  error
	Code   string
	Status int
}

// Codes is the one table. Order matters: an error of two classes takes the first (a refusal
// that is also invalid is invalid).
var Codes = []Code{
	{ErrInvalid, "invalid", http.StatusBadRequest},
	{ErrUnauthenticated, "unauthenticated", http.StatusUnauthorized},
	{ErrForbidden, "forbidden", http.StatusForbidden},
	{ErrNotFound, "not_found", http.StatusNotFound},
	{ErrConflict, "conflict", http.StatusConflict},
	{ErrTooLarge, "too_large", http.StatusRequestEntityTooLarge},
	// Understood, and not done: the platform cannot enforce what was asked.
	{ErrRefused, "refused", http.StatusUnprocessableEntity},
	{ErrUnsupported, "unsupported", http.StatusNotImplemented},
	{ErrDeadlineExceeded, "deadline_exceeded", http.StatusGatewayTimeout},
	{ErrUnreachable, "unreachable", http.StatusBadGateway},
	// The operation may or may not have happened (a confirmation timed out): a gateway timeout,
	// not a server bug.
	{ErrOutcomeUnknown, "outcome_unknown", http.StatusGatewayTimeout},
}

// CodeInternal is an error of no class: a bug, 500.
const CodeInternal = "internal"

// CodeOf returns err's code and HTTP status: its class's, else internal, 500.
func CodeOf(err error) (code string, status int) {
	for _, c := range Codes {
		if errors.Is(err, c.Class) {
			return c.Code, c.Status
		}
	}
	return CodeInternal, http.StatusInternalServerError
}

// ClassOf returns the class of a code, nil for internal or an unknown code.
func ClassOf(code string) error {
	for _, c := range Codes {
		if c.Code == code {
			return c.Class
		}
	}
	return nil
}
