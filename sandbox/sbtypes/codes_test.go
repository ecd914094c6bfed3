package sbtypes_test

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

// TestCodes: the one table, round trip: class → code → status, and code → class, for every
// class. The agent protocol, the daemon's API and the broker all answer from it.
func TestCodes(t *testing.T) {
	want := []struct {
		class  error
		code   string
		status int
	}{
		{sbtypes.ErrInvalid, "invalid", http.StatusBadRequest},
		{sbtypes.ErrUnauthenticated, "unauthenticated", http.StatusUnauthorized},
		{sbtypes.ErrForbidden, "forbidden", http.StatusForbidden},
		{sbtypes.ErrNotFound, "not_found", http.StatusNotFound},
		{sbtypes.ErrConflict, "conflict", http.StatusConflict},
		{sbtypes.ErrTooLarge, "too_large", http.StatusRequestEntityTooLarge},
		{sbtypes.ErrRefused, "refused", http.StatusUnprocessableEntity},
		{sbtypes.ErrUnsupported, "unsupported", http.StatusNotImplemented},
		{sbtypes.ErrDeadlineExceeded, "deadline_exceeded", http.StatusGatewayTimeout},
		{sbtypes.ErrUnreachable, "unreachable", http.StatusBadGateway},
		{sbtypes.ErrOutcomeUnknown, "outcome_unknown", http.StatusGatewayTimeout},
	}
	if len(want) != len(sbtypes.Codes) {
		t.Errorf("the table has %d classes, want %d", len(sbtypes.Codes), len(want))
	}
	for _, w := range want {
		code, status := sbtypes.CodeOf(fmt.Errorf("op: %w", w.class))
		if code != w.code || status != w.status {
			t.Errorf("%v -> %s %d, want %s %d", w.class, code, status, w.code, w.status)
		}
		if back := sbtypes.ClassOf(code); back != w.class {
			t.Errorf("%s -> %v, want %v", code, back, w.class)
		}
	}
	if code, status := sbtypes.CodeOf(errors.New("a bug")); code != sbtypes.CodeInternal || status != http.StatusInternalServerError {
		t.Errorf("classless error -> %s %d, want internal 500", code, status)
	}
	if sbtypes.ClassOf(sbtypes.CodeInternal) != nil || sbtypes.ClassOf("nonsense") != nil {
		t.Error("internal or an unknown code maps to a class")
	}
	// Two classes: the first in the table wins (a refusal that is also invalid is invalid).
	if code, _ := sbtypes.CodeOf(fmt.Errorf("%w: %w", sbtypes.ErrRefused, sbtypes.ErrInvalid)); code != "invalid" {
		t.Errorf("refused+invalid -> %s, want invalid", code)
	}
}
