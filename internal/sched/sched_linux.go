//go:build linux

package sched

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// Why SCHED_IDLE and not nice 19: the kernel's fair scheduler (EEVDF) lets a running task of
// any weight finish its slice before a task that wakes up takes the processor, so a nice-19
// refill still delays the call it runs beside by up to a slice; a SCHED_IDLE task is preempted
// at once by any normal one (measured: bench BenchmarkRefillBeside, docs/benchmarks.md).

// Supported reports whether this process may start work idle and put it back: raising a
// thread from SCHED_IDLE needs CAP_SYS_NICE, which root has.
func Supported() bool { return os.Geteuid() == 0 }

// Normal reports whether the calling thread runs under normal scheduling (SCHED_OTHER) and its
// nice value: where work started idle goes back to.
func Normal() (normal bool, nice int) {
	a, err := unix.SchedGetAttr(0, 0)
	if err != nil {
		return false, 0
	}
	return a.Policy == unix.SCHED_NORMAL, int(a.Nice)
}

// StartIdle runs start (which starts a process) on a thread switched to SCHED_IDLE, so that
// the process inherits it, and puts the thread back. A thread that cannot be put back stays
// locked, and the runtime ends it with this goroutine: no other goroutine ever runs idle.
// Threads the runtime makes meanwhile are not clones of this one: a locked thread hands that
// to the runtime's template thread.
func StartIdle(start func() error) error {
	runtime.LockOSThread()
	was, err := unix.SchedGetAttr(0, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("reading the starting thread's scheduling: %w", err)
	}
	if err := unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE, Nice: was.Nice}, 0); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("switching the starting thread to SCHED_IDLE: %w", err)
	}
	err = start()
	back := &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: was.Policy, Nice: was.Nice, Priority: was.Priority}
	if rerr := unix.SchedSetAttr(0, back, 0); rerr != nil {
		return errors.Join(err, fmt.Errorf("putting the starting thread back to its scheduling: %w", rerr))
	}
	runtime.UnlockOSThread()
	return err
}

// Restore puts every thread of the processes procs lists under normal scheduling at nice,
// pass after pass until one finds none to change: a thread made during a pass inherits its
// maker's scheduling, which the next pass sees. A thread left idle would run claimed code below
// the priority a sandbox made for it has, so processes that never settle are an error.
func Restore(procs func() ([]int, error), nice int) error {
	for range 16 {
		pids, err := procs()
		if err != nil {
			return err
		}
		changed := false
		for _, pid := range pids {
			tids, err := threadIDs(pid)
			if err != nil {
				continue // exited meanwhile
			}
			for _, tid := range tids {
				a, err := unix.SchedGetAttr(tid, 0)
				if err != nil || (a.Policy == unix.SCHED_NORMAL && int(a.Nice) == nice) {
					continue // exited meanwhile, or there already
				}
				err = unix.SchedSetAttr(tid, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_NORMAL, Nice: int32(nice)}, 0)
				if err != nil && !errors.Is(err, unix.ESRCH) {
					return fmt.Errorf("thread %d of process %d: %w", tid, pid, err)
				}
				changed = true
			}
		}
		if !changed {
			return nil
		}
	}
	return fmt.Errorf("threads kept appearing with a scheduling other than normal at nice %d", nice)
}

// Thread is one thread's scheduling, for tests and diagnostics.
type Thread struct {
	Idle bool
	Nice int
}

// Threads reads the scheduling of every thread of process pid.
func Threads(pid int) (map[int]Thread, error) {
	tids, err := threadIDs(pid)
	if err != nil {
		return nil, err
	}
	out := map[int]Thread{}
	for _, tid := range tids {
		if a, err := unix.SchedGetAttr(tid, 0); err == nil {
			out[tid] = Thread{Idle: a.Policy == unix.SCHED_IDLE, Nice: int(a.Nice)}
		}
	}
	return out, nil
}

// threadIDs lists the threads of process pid (/proc/<pid>/task).
func threadIDs(pid int) ([]int, error) {
	tasks, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		return nil, err
	}
	tids := make([]int, 0, len(tasks))
	for _, t := range tasks {
		if tid, err := strconv.Atoi(t.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids, nil
}
