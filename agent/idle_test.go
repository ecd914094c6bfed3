package agent_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/agent"
	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

const idleTimeout = 300 * time.Millisecond

// TestIdleTimeout: the agent does not stop while an exec runs past the idle timeout, nor while
// a background process runs with no request at all; once nothing is active it stops by itself
// and says why (exit status of the test agent: exitIdle, from agent.ErrIdle).
func TestIdleTimeout(t *testing.T) {
	h := newHarness(t)
	h.cfg.IdleTimeout = idleTimeout
	h.start()
	ctx := context.Background()

	// An exec running 1 s, more than three idle timeouts: the agent must still be there to
	// finish it (an agent that stopped would have killed it: SIGKILL, cancelled).
	_, _, res := run(t, h.cl, sbtypes.ExecRequest{Argv: []string{"sleep", "1"}, Timeout: time.Minute})
	if res.ExitCode != 0 || res.Signal != "" {
		t.Fatalf("exec running past the idle timeout ended %+v", res)
	}

	// A background process with no request in flight: the agent waits for it.
	dir := t.TempDir()
	p, err := h.cl.StartProcess(ctx, client.ProcessRequest{ExecRequest: sbtypes.ExecRequest{
		Shell: "while [ ! -e go ]; do sleep 0.02; done", Cwd: dir, Timeout: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	// Health is unauthenticated and does not count as activity; while the process runs the
	// whole budget is left.
	noToken := h.clientWith("")
	for range 3 {
		time.Sleep(idleTimeout)
		select {
		case <-h.exited:
			t.Fatalf("the agent stopped while a background process ran; stderr:\n%s", h.stderr)
		default:
		}
		hl, err := noToken.AgentHealth(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !hl.Features["idleTimeout"] || hl.IdleTimeoutMs != idleTimeout.Milliseconds() || hl.IdleRemainingMs != idleTimeout.Milliseconds() {
			t.Fatalf("health %+v, want the whole idle budget while a process runs", hl)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// Nothing active any more: the agent ends on its own.
	select {
	case <-h.exited:
	case <-time.After(20 * time.Second):
		t.Fatalf("the agent did not stop after being idle (process %s); stderr:\n%s", p.ID, h.stderr)
	}
	if code := h.proc.ProcessState.ExitCode(); code != exitIdle {
		t.Errorf("agent exit status %d, want %d (idle); stderr:\n%s", code, exitIdle, h.stderr)
	}
}

// TestIdleServeReturnsErrIdle: an agent nobody talks to returns agent.ErrIdle from Serve; one
// without an idle timeout reports none in health.
func TestIdleServeReturnsErrIdle(t *testing.T) {
	h := newHarness(t)
	cl, stop := serveInProcess(t, h, agent.Hooks{})
	hl, err := cl.AgentHealth(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if hl.Features["idleTimeout"] != true || hl.IdleTimeoutMs != 0 || hl.IdleRemainingMs != 0 {
		t.Errorf("health without an idle timeout: %+v", hl)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	h.cfg.IdleTimeout = 100 * time.Millisecond
	done := make(chan error, 1)
	go func() { done <- agent.Serve(context.Background(), h.cfg, agent.Hooks{}) }()
	select {
	case err := <-done:
		if !errors.Is(err, agent.ErrIdle) {
			t.Errorf("Serve = %v, want ErrIdle", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Serve did not return after being idle")
	}
}

// TestIdleFrozenNotCounted: an agent frozen by the cgroup freezer (a paused sandbox) for
// longer than its idle timeout does not count that time as idle; once thawed it still has
// budget, and the message it stops with says how much frozen time it did not count.
func TestIdleFrozenNotCounted(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := os.Stat("/sys/fs/cgroup/freezer/tasks"); err != nil {
		t.Skip("no cgroup v1 freezer on this host")
	}
	// Long enough that the start and the health call after the thaw fit in easily.
	const timeout = 2 * time.Second
	h := newHarness(t)
	h.cfg.IdleTimeout = timeout
	fz := testCgroup(t, "/sys/fs/cgroup/freezer")
	h.start()
	if err := os.WriteFile(filepath.Join(fz, "cgroup.procs"), []byte(strconv.Itoa(h.proc.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	state := func(s string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(fz, "freezer.state"), []byte(s), 0); err != nil {
			t.Fatal(err)
		}
		eventually(t, "freezer "+s, func() bool {
			b, err := os.ReadFile(filepath.Join(fz, "freezer.state"))
			return err == nil && strings.TrimSpace(string(b)) == s
		})
	}
	state("FROZEN")
	time.Sleep(2 * timeout)
	state("THAWED")
	// Thawed, it is still up and has budget left: it went idle just before the freeze, so
	// nearly the whole timeout (an agent that counted the freeze stops at once).
	hl, err := h.clientWith("").AgentHealth(context.Background())
	if err != nil || hl.IdleRemainingMs <= 0 {
		t.Fatalf("after the freeze: health %+v %v; stderr:\n%s", hl, err, h.stderr)
	}
	select {
	case <-h.exited:
	case <-time.After(20 * time.Second):
		t.Fatalf("the agent did not stop after being idle; stderr:\n%s", h.stderr)
	}
	if code := h.proc.ProcessState.ExitCode(); code != exitIdle {
		t.Fatalf("exit %d, want %d (idle); stderr:\n%s", code, exitIdle, h.stderr)
	}
	m := regexp.MustCompile(`\(([0-9.a-zµ]+) frozen not counted\)`).FindStringSubmatch(h.stderr.String())
	if m == nil {
		t.Fatalf("no frozen time in the stop message:\n%s", h.stderr)
	}
	if d, err := time.ParseDuration(m[1]); err != nil || d < timeout {
		t.Errorf("frozen time not counted %q (%v), want about the 4 s freeze", m[1], err)
	}
}

// TestDeadlineEndsServe: an agent with a Deadline stops at it even while an exec runs (the
// exec is killed), and Serve says why: agent.ErrLifetime. Without the deadline the exec
// would run its full minute.
func TestDeadlineEndsServe(t *testing.T) {
	h := newHarness(t)
	h.cfg.Deadline = time.Now().Add(500 * time.Millisecond)
	cl, stop := serveInProcess(t, h, agent.Hooks{})
	_, _, res := run(t, cl, sbtypes.ExecRequest{Argv: []string{"sleep", "60"}, Timeout: time.Minute})
	if res.ExitCode == 0 && res.Signal == "" {
		t.Errorf("exec running past the deadline ended %+v, want killed", res)
	}
	if err := stop(); !errors.Is(err, agent.ErrLifetime) {
		t.Errorf("Serve = %v, want ErrLifetime", err)
	}
}
