//go:build linux

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

// ErrLifetime is what Serve returns when Config.Deadline ended the agent.
var ErrLifetime = errors.New("agent: session lifetime ended")

// activity tracks what keeps the agent from being idle: a count of active things (requests in
// flight, running background processes) and when the last one ended.
//
// Time the agent does not run is not idle time: a paused sandbox is frozen (cgroup freezer),
// agent included, while CLOCK_MONOTONIC runs on, and on resume it must not find its idle
// budget spent. The watcher looks every period; a look that comes much later than that means
// the agent was not running in between, and that gap is not counted.
type activity struct {
	timeout time.Duration // 0: never idle
	period  time.Duration // how often the watcher looks
	now     func() time.Time

	mu     sync.Mutex
	active int
	last   time.Time     // when active last dropped to 0 (or the agent started), frozen time added
	seen   time.Time     // the last look at the clock
	frozen time.Duration // total time not counted because the agent was not running
}

func newActivity(timeout time.Duration) *activity {
	now := time.Now()
	return &activity{
		timeout: timeout,
		period:  min(max(timeout/8, 10*time.Millisecond), time.Second),
		now:     time.Now,
		last:    now,
		seen:    now,
	}
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
			a.observe(a.now())
			a.active--
			a.last = a.seen
			a.mu.Unlock()
		})
	}
}

// observe notes that the agent is running at now. A gap of more than two periods since the
// last look (the watcher looks every period) is time the agent was frozen or not scheduled:
// it moves the idle start forward by as much. Called with mu held.
func (a *activity) observe(now time.Time) {
	if a.timeout == 0 {
		return // never idle, and no watcher looking: gaps mean nothing
	}
	if gap := now.Sub(a.seen) - a.period; gap > a.period {
		a.last = a.last.Add(gap)
		a.frozen += gap
	}
	if now.After(a.seen) {
		a.seen = now
	}
}

// remaining is how long the agent stays up if nothing starts from now: the whole timeout while
// anything is active.
func (a *activity) remaining() time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	a.observe(now)
	if a.active > 0 {
		return a.timeout
	}
	return a.timeout - now.Sub(a.last)
}

// frozenTotal is the time not counted as idle because the agent was not running.
func (a *activity) frozenTotal() time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.frozen
}

// watch closes idle once nothing has been active for the timeout; it returns when ctx ends.
func (a *activity) watch(ctx context.Context, idle chan<- struct{}) {
	t := time.NewTimer(a.period)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
		if a.remaining() <= 0 {
			close(idle)
			return
		}
		t.Reset(a.period)
	}
}
