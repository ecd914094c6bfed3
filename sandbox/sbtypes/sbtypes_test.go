package sbtypes_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
	"github.com/airlock-sandbox/airlock/spec"
)

// TestOneValuePerClass: the agent wraps sbtypes' classes, everyone else tests with sandbox's
// (and spec's for a bad declaration); each class must be one value for errors.Is to hold.
func TestOneValuePerClass(t *testing.T) {
	for _, tc := range []struct {
		name      string
		leaf, pub error
	}{
		{"NotFound", sbtypes.ErrNotFound, sandbox.ErrNotFound},
		{"Unsupported", sbtypes.ErrUnsupported, sandbox.ErrUnsupported},
		{"Refused", sbtypes.ErrRefused, sandbox.ErrRefused},
		{"DeadlineExceeded", sbtypes.ErrDeadlineExceeded, sandbox.ErrDeadlineExceeded},
		{"OutcomeUnknown", sbtypes.ErrOutcomeUnknown, sandbox.ErrOutcomeUnknown},
		{"Unreachable", sbtypes.ErrUnreachable, sandbox.ErrUnreachable},
		{"Invalid", sbtypes.ErrInvalid, sandbox.ErrInvalid},
		{"InvalidSpec", sbtypes.ErrInvalid, spec.ErrInvalid},
		{"Unauthenticated", sbtypes.ErrUnauthenticated, sandbox.ErrUnauthenticated},
		{"Forbidden", sbtypes.ErrForbidden, sandbox.ErrForbidden},
		{"Conflict", sbtypes.ErrConflict, sandbox.ErrConflict},
		{"TooLarge", sbtypes.ErrTooLarge, sandbox.ErrTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !errors.Is(fmt.Errorf("x: %w", tc.leaf), tc.pub) || !errors.Is(fmt.Errorf("x: %w", tc.pub), tc.leaf) {
				t.Errorf("%v and %v are different classes", tc.leaf, tc.pub)
			}
		})
	}
	// A spec validation error is a sandbox invalid error and an sbtypes one.
	var fe error = &spec.FieldError{Path: "limits.memory", Rule: spec.RuleQuantitySyntax, Message: "m"}
	if !errors.Is(fe, sandbox.ErrInvalid) || !errors.Is(fe, sbtypes.ErrInvalid) {
		t.Errorf("spec.FieldError is not ErrInvalid")
	}
}

// TestDistinctClasses: no two classes are the same value (a copy-paste in the alias list
// would silently merge two).
func TestDistinctClasses(t *testing.T) {
	all := []error{sandbox.ErrNotFound, sandbox.ErrUnsupported, sandbox.ErrRefused, sandbox.ErrDeadlineExceeded,
		sandbox.ErrOutcomeUnknown, sandbox.ErrUnreachable, sandbox.ErrInvalid, sandbox.ErrUnauthenticated,
		sandbox.ErrForbidden, sandbox.ErrConflict, sandbox.ErrTooLarge}
	for i := range all {
		for j := range i {
			if all[i] == all[j] {
				t.Errorf("classes %d and %d are one value (%v)", i, j, all[i])
			}
		}
	}
}
