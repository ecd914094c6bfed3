//go:build linux

package agent

import (
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// Limits of an agent started long before it is claimed (a Kubernetes pool pod, where no pids
// cgroup per sandbox can be written): a process limit set as an rlimit, and an idle clock that
// starts at the first authenticated call rather than at start.

// applyProcessLimit holds code's uid to at most n tasks with RLIMIT_NPROC, set (soft and hard) on
// the agent process so every command it starts inherits it. The kernel counts the tasks of a real
// uid across its user namespace; a fork fails (EAGAIN) when the count after it would exceed the
// limit, and an execve after a setuid fails when the count was already over the limit at the
// setuid. So the agent's spawner (setuid to CodeUID, then execve) can take the count to limit+1
// while code forking by itself stops at limit: the limit is n-1, and no path passes n (measured,
// TestProcessLimitHoldsCode). Real uid 0 of the initial user namespace is exempt,
// which keeps the agent's own threads and forks out of it, so the limit must be set by an agent
// running as uid 0, and CodeUID must be used by nothing else on the node (the count is
// node-wide). Lowering a limit needs no capability; without CAP_SYS_RESOURCE nothing in the
// sandbox can raise it again. n == 0 leaves the limit alone.
func applyProcessLimit(n int64) error {
	if n == 0 {
		return nil
	}
	if n < 0 {
		return fmt.Errorf("agent config maxProcesses %d: %w (must be positive, or 0 for no limit)", n, unix.EINVAL)
	}
	if uid := unix.Getuid(); uid != 0 {
		return fmt.Errorf("agent config maxProcesses %d: the agent runs as uid %d; only an agent with real uid 0 (exempt from RLIMIT_NPROC) can limit code's processes without limiting its own", n, uid)
	}
	lim := unix.Rlimit{Cur: uint64(n - 1), Max: uint64(n - 1)}
	if err := unix.Setrlimit(unix.RLIMIT_NPROC, &lim); err != nil {
		return fmt.Errorf("agent config maxProcesses %d: setrlimit(RLIMIT_NPROC): %w", n, err)
	}
	var got unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NPROC, &got); err != nil || got.Cur != lim.Cur || got.Max != lim.Max {
		return fmt.Errorf("agent config maxProcesses %d: RLIMIT_NPROC reads back as %d/%d (%v)", n, got.Cur, got.Max, err)
	}
	return nil
}

// idleGate holds the idle clock of an agent whose idle time counts from its first authenticated
// call (Config.IdleFromFirstCall): until then one activity is held open. A pool pod waits
// unclaimed for as long as the pool keeps it; its session starts at the claim, and the broker
// makes the first call as part of the claim.
type idleGate struct {
	once sync.Once
	end  func() // nil: no gate
}

func newIdleGate(a *activity, on bool) *idleGate {
	g := &idleGate{}
	if on {
		g.end = a.begin()
	}
	return g
}

// open starts the idle clock; only the first call does anything.
func (g *idleGate) open() {
	if g.end != nil {
		g.once.Do(g.end)
	}
}
