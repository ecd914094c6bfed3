package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// Refills start lowered: a sandbox made ahead of its claim (the process pool's refill, a
// filler's parked sandbox) starts at nice 19, its init, agent and pre-started interpreters
// included, so that it takes only the CPU the calls leave idle and never starves the call it
// is refilled for (issue 26). Before it is offered, every thread of it is raised back to the
// nice a sandbox made for the call would have (raiseThreads), so the code that claims it runs
// at that priority. Root only: raising a priority again needs CAP_SYS_NICE.

// lowerNice is a refill's nice while it starts.
const lowerNice = 19

type loweredKey struct{}

// withLowered marks a Create as a refill: init is cloned from a thread at lowerNice.
func withLowered(ctx context.Context) context.Context {
	return context.WithValue(ctx, loweredKey{}, true)
}

func lowered(ctx context.Context) bool { v, _ := ctx.Value(loweredKey{}).(bool); return v }

// canLower reports whether this backend may start sandboxes lowered and raise them again.
func (b *Backend) canLower() bool { return b.rootless == nil && os.Geteuid() == 0 }

// threadNice is the calling thread's nice value.
func threadNice() (int, error) {
	p, err := unix.Getpriority(unix.PRIO_PROCESS, 0)
	return 20 - p, err // the system call answers 20 - nice
}

// startLowered runs start (which clones init) on a thread lowered to lowerNice, so that init
// inherits it, and puts the thread back. A thread that cannot be put back stays locked, and
// the runtime ends it with this goroutine: no other goroutine ever runs lowered. Threads the
// runtime makes meanwhile are not clones of this one: a locked thread hands that to its
// template thread.
func startLowered(start func() error) error {
	runtime.LockOSThread()
	was, err := threadNice()
	if err != nil {
		runtime.UnlockOSThread()
		return start()
	}
	if err := unix.Setpriority(unix.PRIO_PROCESS, 0, lowerNice); err != nil {
		runtime.UnlockOSThread()
		return start()
	}
	err = start()
	if rerr := unix.Setpriority(unix.PRIO_PROCESS, 0, was); rerr != nil {
		return errors.Join(err, fmt.Errorf("putting the starting thread back to nice %d: %w", was, rerr))
	}
	runtime.UnlockOSThread()
	return err
}

// raiseThreads sets every thread of the processes procs lists to nice, pass after pass until
// one finds none to change: a thread made during a pass inherits its maker's nice, which the
// next pass sees. A lowered thread left behind would run claimed code below the priority a
// sandbox made for it has, so a sandbox that never settles is an error (its maker terminates
// it).
func raiseThreads(procs func() ([]int, error), nice int) error {
	for range 16 {
		pids, err := procs()
		if err != nil {
			return err
		}
		changed := false
		for _, pid := range pids {
			tasks, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
			if err != nil {
				continue // exited meanwhile
			}
			for _, t := range tasks {
				tid, err := strconv.Atoi(t.Name())
				if err != nil {
					continue
				}
				if p, err := unix.Getpriority(unix.PRIO_PROCESS, tid); err != nil || 20-p == nice {
					continue // exited meanwhile, or there already
				}
				if err := unix.Setpriority(unix.PRIO_PROCESS, tid, nice); err != nil && !errors.Is(err, unix.ESRCH) {
					return fmt.Errorf("thread %d of process %d: %w", tid, pid, err)
				}
				changed = true
			}
		}
		if !changed {
			return nil
		}
	}
	return fmt.Errorf("threads kept appearing at a nice other than %d", nice)
}
