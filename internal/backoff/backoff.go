// Package backoff is the one wait between polls of state that sends no event (a cgroup emptying, an agent starting): doubling delays up to a cap, ended by a context.
package backoff

import (
	"context"
	"time"
)

// Backoff waits First, then twice as long each time, up to Max. Not safe for concurrent use:
// one a loop.
type Backoff struct {
	next, max time.Duration
}

// New starts at first and doubles up to max.
func New(first, max time.Duration) *Backoff { return &Backoff{next: first, max: max} }

// Wait sleeps the next delay; false, at once, when ctx ends first.
func (b *Backoff) Wait(ctx context.Context) bool {
	if ctx.Err() != nil {
		return false
	}
	t := time.NewTimer(b.next)
	defer t.Stop()
	if b.next < b.max {
		b.next = min(2*b.next, b.max)
	}
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Next is the delay the next Wait sleeps.
func (b *Backoff) Next() time.Duration { return b.next }
