package agent_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

// zombieChildren lists the zombie children of pid, read from /proc.
func zombieChildren(t *testing.T, pid int) []int {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, st := range stats {
		b, err := os.ReadFile(st)
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 {
			continue
		}
		if ppid, _ := strconv.Atoi(f[1]); ppid == pid && f[0] == "Z" {
			child, _ := strconv.Atoi(strings.Fields(s)[0])
			out = append(out, child)
		}
	}
	return out
}

// TestPID1ReapsOrphans runs the agent as PID 1 of a new PID namespace, as the local runtime
// does: orphans reparented to it are reaped, while every exec still gets its own exit status.
func TestPID1ReapsOrphans(t *testing.T) {
	testutil.RequireRoot(t)
	h := newHarness(t)
	h.cloneflags = syscall.CLONE_NEWPID
	h.start()
	agentPid := h.proc.Process.Pid
	for i := 0; i < 5; i++ {
		// The subshell exits at once, leaving sleep to be reparented to PID 1.
		out, _, res := run(t, h.cl, sbtypes.ExecRequest{Shell: fmt.Sprintf("(sleep 0.0%d &); echo $$; exit %d", i, i+2)})
		if res.ExitCode != i+2 || strings.TrimSpace(out) == "" {
			t.Fatalf("exec %d: %q %+v", i, out, res)
		}
		if i == 0 && strings.TrimSpace(out) == "1" {
			t.Fatal("the exec itself is PID 1; the agent must be")
		}
	}
	// The orphans have exited by now or will shortly; none may stay a zombie.
	eventually(t, "orphans reaped", func() bool { return len(zombieChildren(t, agentPid)) == 0 })
	// Exit statuses of tracked children are not stolen by the reaper.
	for _, code := range []int{0, 1, 42} {
		_, _, res := run(t, h.cl, sbtypes.ExecRequest{Shell: fmt.Sprintf("sleep 0.01 & exit %d", code), Timeout: time.Minute})
		if res.ExitCode != code {
			t.Errorf("exit %d reported as %+v", code, res)
		}
	}
	if _, err := h.cl.Health(context.Background()); err != nil {
		t.Fatal(err)
	}
}
