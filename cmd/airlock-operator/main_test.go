package main

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// TestFailure: the cancellation a signal starts is a clean exit however it is wrapped; any
// other error is the exit's, even one whose text mentions a cancellation without being one.
func TestFailure(t *testing.T) {
	boom := errors.New("leader election lost")
	textOnly := errors.New("broker: dial tcp: context canceled") // not context.Canceled
	for _, tc := range []struct {
		name  string
		first error
		want  error
	}{
		{"none", nil, nil},
		{"canceled", context.Canceled, nil},
		{"wrapped canceled", fmt.Errorf("failed to start caches: %w", context.Canceled), nil},
		{"joined canceled", errors.Join(context.Canceled), nil},
		{"other", boom, boom},
		{"text only", textOnly, textOnly},
	} {
		if got := failure(tc.first); got != tc.want {
			t.Errorf("%s: failure(%v) = %v, want %v", tc.name, tc.first, got, tc.want)
		}
	}
}
