package local

import (
	"context"

	"github.com/airlock-sandbox/airlock/internal/sched"
)

// Refills start idle: a sandbox made ahead of its claim (the process pool's refill, a filler's
// parked sandbox) starts under SCHED_IDLE, its init, agent and pre-started interpreters
// included, so that it takes only the CPU the calls leave idle and never delays the call it is
// refilled for (issue 26). Before it is offered, every thread of it is put back under normal
// scheduling at the nice a sandbox made for the call would have (sched.Restore), so the code
// that claims it runs at that priority. Root only (internal/sched).

type idleKey struct{}

// withIdle marks a Create as a refill: init is started from a thread under SCHED_IDLE.
func withIdle(ctx context.Context) context.Context {
	return context.WithValue(ctx, idleKey{}, true)
}

func startsIdle(ctx context.Context) bool { v, _ := ctx.Value(idleKey{}).(bool); return v }

// canIdle reports whether this backend may start sandboxes idle and put them back.
func (b *Backend) canIdle() bool { return b.rootless == nil && sched.Supported() }
