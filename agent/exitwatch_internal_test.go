package agent

import (
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestWatchExitWithoutSIGCHLD: a command's exit reaches its waiter through its pidfd alone,
// with no SIGCHLD relay running (the reaper is not started here), with its status.
func TestWatchExitWithoutSIGCHLD(t *testing.T) {
	s := &spawner{waiters: map[int]chan syscall.WaitStatus{}}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	for _, tc := range []struct {
		name string
		argv []string
		want func(syscall.WaitStatus) bool
	}{
		{"exit 7", []string{"/bin/sh", "-c", "exit 7"}, func(ws syscall.WaitStatus) bool { return ws.Exited() && ws.ExitStatus() == 7 }},
		{"killed", []string{"/bin/sh", "-c", "kill -KILL $$"}, func(ws syscall.WaitStatus) bool { return ws.Signaled() && ws.Signal() == syscall.SIGKILL }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := s.spawn(&spawnRequest{argv0: tc.argv[0], argv: tc.argv, dir: "/", files: []*os.File{devnull, devnull, devnull}})
			if rep.err != nil {
				t.Fatal(rep.err)
			}
			if rep.pidfd < 0 {
				t.Fatal("no pidfd from this kernel")
			}
			if err := unix.SetNonblock(rep.pidfd, true); err != nil {
				t.Fatal(err)
			}
			pidf := os.NewFile(uintptr(rep.pidfd), "pidfd")
			defer pidf.Close()
			go s.watchExit(rep.pid, pidf)
			select {
			case ws := <-rep.exited:
				if !tc.want(ws) {
					t.Errorf("status %v", ws)
				}
			case <-time.After(time.Minute): // a hang guard
				t.Fatal("exit never reached the waiter")
			}
			s.mu.Lock()
			_, ok := s.waiters[rep.pid]
			s.mu.Unlock()
			if ok {
				t.Error("waiter still registered")
			}
		})
	}
}
