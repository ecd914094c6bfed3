package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/airlock-sandbox/airlock/sandbox"
)

func TestErrorTable(t *testing.T) {
	for _, tc := range []struct {
		err    error
		code   string
		status int
		class  error // what the code maps back to
	}{
		{sandbox.ErrInvalid, "invalid", 400, sandbox.ErrInvalid},
		{sandbox.ErrUnauthenticated, "unauthenticated", 401, sandbox.ErrUnauthenticated},
		{sandbox.ErrForbidden, "forbidden", 403, sandbox.ErrForbidden},
		{sandbox.ErrNotFound, "not_found", 404, sandbox.ErrNotFound},
		{sandbox.ErrConflict, "conflict", 409, sandbox.ErrConflict},
		{sandbox.ErrTooLarge, "too_large", 413, sandbox.ErrTooLarge},
		{sandbox.ErrRefused, "refused", 422, sandbox.ErrRefused},
		{sandbox.ErrUnsupported, "unsupported", 501, sandbox.ErrUnsupported},
		{sandbox.ErrDeadlineExceeded, "deadline_exceeded", 504, sandbox.ErrDeadlineExceeded},
		{context.DeadlineExceeded, "deadline_exceeded", 504, sandbox.ErrDeadlineExceeded},
		{sandbox.ErrUnreachable, "unreachable", 502, sandbox.ErrUnreachable},
		{sandbox.ErrOutcomeUnknown, "outcome_unknown", 504, sandbox.ErrOutcomeUnknown},
		{context.Canceled, "canceled", 499, context.Canceled},
		{errors.New("boom"), "internal", 500, nil},
	} {
		wrapped := fmt.Errorf("layer two: %w", fmt.Errorf("layer one: %w", tc.err))
		code, status := CodeOf(wrapped)
		if code != tc.code || status != tc.status {
			t.Errorf("CodeOf(%v) = %s %d, want %s %d", tc.err, code, status, tc.code, tc.status)
		}
		if got := ClassOf(code); got != tc.class {
			t.Errorf("ClassOf(%s) = %v, want %v", code, got, tc.class)
		}
	}
	// An error of two classes takes the first in the table: a refusal that is also invalid
	// is reported as invalid (the caller must fix the request before anything else).
	both := errors.Join(sandbox.ErrRefused, sandbox.ErrInvalid)
	if code, _ := CodeOf(both); code != "invalid" {
		t.Errorf("two classes: %s", code)
	}
}

func TestCodeForStatus(t *testing.T) {
	for status, want := range map[int]string{
		400: "invalid", 405: "invalid", 401: "unauthenticated", 403: "forbidden", 404: "not_found",
		409: "conflict", 413: "too_large", 422: "refused", 501: "unsupported", 502: "unreachable",
		504: "deadline_exceeded", 500: "outcome_unknown", 503: "internal", http.StatusTeapot: "internal",
	} {
		if got := CodeForStatus(status); got != want {
			t.Errorf("CodeForStatus(%d) = %s, want %s", status, got, want)
		}
	}
}
