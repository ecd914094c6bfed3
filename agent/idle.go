package agent

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrIdle is what Serve returns when Config.IdleTimeout ended the agent: as PID 1 that ends the
// sandbox, and the caller can tell it from a shutdown or a failure.
var ErrIdle = errors.New("agent: idle timeout")

// activity tracks what keeps the agent from being idle: a count of active things (requests in
// flight, running background processes) and when the last one ended.
type activity struct {
	timeout time.Duration // 0: never idle
	now     func() time.Time

	mu     sync.Mutex
	active int
	last   time.Time // when active last dropped to 0 (or the agent started)
}

func newActivity(timeout time.Duration) *activity {
	return &activity{timeout: timeout, now: time.Now, last: time.Now()}
}

// begin marks one thing active; the returned func ends it (call it exactly once).
func (a *activity) begin() func() {
	a.mu.Lock()
	a.active++
	a.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			a.mu.Lock()
			a.active--
			a.last = a.now()
			a.mu.Unlock()
		})
	}
}

// remaining is how long the agent stays up if nothing starts from now: the whole timeout while
// anything is active.
func (a *activity) remaining() time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.active > 0 {
		return a.timeout
	}
	return a.timeout - a.now().Sub(a.last)
}

// watch closes idle once nothing has been active for the timeout; it returns when ctx ends.
// Activity only ever pushes the moment back, so a timer that fires early just looks again.
func (a *activity) watch(ctx context.Context, idle chan<- struct{}) {
	for {
		rem := a.remaining()
		if rem <= 0 {
			close(idle)
			return
		}
		t := time.NewTimer(rem)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
	}
}
