package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// sandboxFile reads a file inside the sandbox from the host, through its init's root: this
// works while the sandbox is frozen, when its agent cannot answer.
func sandboxFile(b *Backend, id, p string) (string, error) {
	pid := b.sessionInitPID(id)
	if pid == 0 {
		return "", fmt.Errorf("no init pid for %s", id)
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/root%s", pid, p))
	return strings.TrimSpace(string(raw)), err
}

// waitFor polls cond until it holds or 30 seconds pass (a bound on the test, not a timing
// assertion).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// counterScript busy-loops, counting, and publishes the count atomically every 100000 steps.
const counterScript = `import os
open('/tmp/pid', 'w').write(str(os.getpid()))
i = 0
while True:
    i += 1
    if i % 100000 == 0:
        with open('/tmp/count.tmp', 'w') as f:
            f.write(str(i))
        os.replace('/tmp/count.tmp', '/tmp/count')
`

type processStarter interface {
	StartProcess(ctx context.Context, req client.ProcessRequest, opts ...client.ExecOption) (client.Process, error)
}

// startCounter starts counterScript as a background process and waits until it has counted.
func startCounter(t *testing.T, b *Backend, a sandbox.Agent, id string) {
	t.Helper()
	ctx := t.Context()
	if err := a.WriteFile(ctx, "/tmp/counter.py", strings.NewReader(counterScript), 0o644); err != nil {
		t.Fatal(err)
	}
	ps, ok := a.(processStarter)
	if !ok {
		t.Fatalf("the local agent client %T offers no background processes", a)
	}
	if _, err := ps.StartProcess(ctx, client.ProcessRequest{ExecRequest: sandbox.ExecRequest{
		Argv: []string{"python3", "/tmp/counter.py"}, Timeout: 5 * time.Minute,
	}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the counter to count", func() bool {
		c, err := sandboxFile(b, id, "/tmp/count")
		return err == nil && c != ""
	})
}

func readCount(t *testing.T, b *Backend, id string) int64 {
	t.Helper()
	s, err := sandboxFile(b, id, "/tmp/count")
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func sessionState(t *testing.T, b *Backend, id string) sandbox.State {
	t.Helper()
	s, err := b.Get(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	return s.State
}

// TestPauseStopsCPUAndResumeContinues: a paused sandbox's busy loop uses no CPU, keeps its
// processes and memory, refuses agent calls with a conflict, and after resume the same
// process keeps counting from where it was.
func TestPauseStopsCPUAndResumeContinues(t *testing.T) {
	b := newTestBackend(t)
	ctx := t.Context()
	s, err := b.Create(ctx, hostDecl("pause"))
	if err != nil {
		t.Fatal(err)
	}
	a, err := b.Connect(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	startCounter(t, b, a, s.ID)
	pid, err := sandboxFile(b, s.ID, "/tmp/pid")
	if err != nil {
		t.Fatal(err)
	}
	startOf := func() string {
		out, _, res := run(t, a, "cut -d' ' -f22 /proc/"+pid+"/stat")
		if res.ExitCode != 0 {
			t.Fatalf("counter process %s is gone: %+v", pid, res)
		}
		return strings.TrimSpace(out)
	}
	started := startOf()
	u0 := cgroupCPUNanos(t, b, s.ID)
	waitFor(t, "the busy loop to use CPU", func() bool { return cgroupCPUNanos(t, b, s.ID) > u0 })

	if err := b.Pause(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if got := sessionState(t, b, s.ID); got != sandbox.StatePaused {
		t.Fatalf("state after pause = %q, want paused (kernel frozen: %v)", got, cgroupFrozen(t, b, s.ID))
	}
	if !cgroupFrozen(t, b, s.ID) {
		t.Fatal("the kernel does not show the sandbox's cgroup frozen")
	}
	procs1 := cgroupProcs(t, b, s.ID)
	mem1 := cgroupMemoryBytes(t, b, s.ID)
	u1 := cgroupCPUNanos(t, b, s.ID)
	c1 := readCount(t, b, s.ID)
	// Time passes: a running busy loop would use all of it.
	time.Sleep(500 * time.Millisecond)
	u2 := cgroupCPUNanos(t, b, s.ID)
	c2 := readCount(t, b, s.ID)
	if u2-u1 > int64(time.Millisecond) {
		t.Errorf("a paused sandbox used %v of CPU", time.Duration(u2-u1))
	}
	if c2 != c1 {
		t.Errorf("the counter went from %d to %d while paused", c1, c2)
	}
	if got := cgroupProcs(t, b, s.ID); !slices.Equal(got, procs1) {
		t.Errorf("processes changed while paused: %q, then %q", procs1, got)
	}
	if mem2 := cgroupMemoryBytes(t, b, s.ID); mem2 < mem1/2 {
		t.Errorf("memory charge fell from %d to %d while paused", mem1, mem2)
	}

	// Agent calls are refused at once, not left waiting on a frozen agent.
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = a.Exec(cctx, sandbox.ExecRequest{Argv: []string{"true"}, Timeout: time.Second}, nil, nil)
	if !errors.Is(err, sandbox.ErrConflict) || !strings.Contains(err.Error(), "paused") {
		t.Errorf("exec on a paused sandbox: %v, want a conflict naming the pause", err)
	}
	a2, err := b.Connect(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := a2.WriteFile(cctx, "/tmp/x", strings.NewReader("x"), 0o644); !errors.Is(err, sandbox.ErrConflict) {
		t.Errorf("write on a paused sandbox: %v, want a conflict", err)
	}
	a2.Close()
	list, err := b.List(ctx)
	if err != nil || len(list) != 1 || list[0].State != sandbox.StatePaused {
		t.Errorf("List while paused = %v, %v; want the one session, paused", list, err)
	}
	if err := b.Pause(ctx, s.ID); err != nil {
		t.Errorf("pausing again: %v, want success", err)
	}

	if err := b.Resume(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if got := sessionState(t, b, s.ID); got != sandbox.StateRunning {
		t.Fatalf("state after resume = %q, want running", got)
	}
	waitFor(t, "the counter to go on", func() bool { return readCount(t, b, s.ID) > c1 })
	if got, err := sandboxFile(b, s.ID, "/tmp/pid"); err != nil || got != pid {
		t.Errorf("counter pid after resume = %q, %v; want %s", got, err, pid)
	}
	if got := startOf(); got != started {
		t.Errorf("counter process start time %s, before the pause %s: not the same process", got, started)
	}
	if err := b.Resume(ctx, s.ID); err != nil {
		t.Errorf("resuming a running sandbox: %v, want success", err)
	}
	initPID := b.sessionInitPID(s.ID)
	if err := b.Terminate(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	assertGone(t, b, s.ID, initPID)
}

// TestTerminatePaused: a paused sandbox terminates, and leaves nothing.
func TestTerminatePaused(t *testing.T) {
	b := newTestBackend(t)
	ctx := t.Context()
	s, err := b.Create(ctx, hostDecl("pause-term"))
	if err != nil {
		t.Fatal(err)
	}
	a, err := b.Connect(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	startCounter(t, b, a, s.ID)
	if err := b.Pause(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	initPID := b.sessionInitPID(s.ID)
	if err := b.Terminate(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	assertGone(t, b, s.ID, initPID)
	if err := b.Pause(ctx, s.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("pause after terminate: %v, want not found", err)
	}
}

// TestPausedLifetime: the lifetime keeps running while paused; a frozen init cannot end the
// sandbox itself, so the backend does.
func TestPausedLifetime(t *testing.T) {
	b := newTestBackend(t)
	ctx := t.Context()
	d := hostDecl("pause-life")
	// Long enough that a create under a loaded CI machine (seen: > 2 s at load 15-20) still
	// leaves time to pause before the lifetime ends.
	life := int64(6)
	d.Session.MaxLifetimeSeconds = &life
	s, err := b.Create(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	initPID := b.sessionInitPID(s.ID)
	if err := b.Pause(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	assertGone(t, b, s.ID, initPID)
}

// TestPausedSurvivesRestart: a new backend on the same state dir adopts a paused sandbox (its
// agent cannot answer a health check) instead of reaping it, and can resume it; a gVisor one
// too, whose pause is runsc's and its mark's.
func TestPausedSurvivesRestart(t *testing.T) {
	for _, rt := range []spec.Runtime{"", spec.RuntimeGVisor} {
		name := string(rt)
		if name == "" {
			name = "native"
		}
		t.Run(name, func(t *testing.T) {
			var b1 *Backend
			runsc := ""
			if rt == spec.RuntimeGVisor {
				runsc = runscForTest(t)
				b1 = newGVisorBackend(t, runsc)
			} else {
				b1 = newTestBackend(t)
			}
			ctx := t.Context()
			d := hostDecl("pause-restart")
			d.Runtime = rt
			s, err := b1.Create(ctx, d)
			if err != nil {
				t.Fatal(err)
			}
			if err := b1.Pause(ctx, s.ID); err != nil {
				t.Fatal(err)
			}
			initPID := b1.sessionInitPID(s.ID)
			b1.Close()
			b2 := newTestBackendAt(t, b1.opts.StateDir)
			b2.opts.RunscPath = runsc
			if got := sessionState(t, b2, s.ID); got != sandbox.StatePaused {
				t.Fatalf("state in the new backend = %q, want paused", got)
			}
			if err := b2.Resume(ctx, s.ID); err != nil {
				t.Fatal(err)
			}
			a, err := b2.Connect(ctx, s.ID)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			if out, _, res := run(t, a, "echo alive"); res.ExitCode != 0 || strings.TrimSpace(out) != "alive" {
				t.Fatalf("exec after resume: %q %+v", out, res)
			}
			if err := b2.Terminate(ctx, s.ID); err != nil {
				t.Fatal(err)
			}
			assertGone(t, b2, s.ID, initPID)
		})
	}
}

func TestPauseRefusals(t *testing.T) {
	b := newTestBackend(t)
	ctx := t.Context()
	for _, op := range []struct {
		name string
		fn   func(context.Context, string) error
	}{{"pause", b.Pause}, {"resume", b.Resume}} {
		if err := op.fn(ctx, "s-0000000000000000"); !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("%s of an unknown session: %v, want not found", op.name, err)
		}
		if err := op.fn(ctx, "../x"); !errors.Is(err, sandbox.ErrInvalid) {
			t.Errorf("%s of a malformed id: %v, want invalid", op.name, err)
		}
	}
	if st := b.Capabilities(ctx).Entries[capability.SuspendResume]; !st.Supported {
		t.Errorf("suspendResume: %+v, want supported", st)
	}
}

// TestPauseGVisor: a gVisor sandbox pauses (runsc stops its Sentry's tasks), resumes whole, and
// ends while paused. Each round pauses and resumes it a few times right after create, while
// the agent starts its exec reaper: paused by the cgroup freezer instead, the Sentry panics
// within the first rounds (docs/pause.md).
func TestPauseGVisor(t *testing.T) {
	b := newGVisorBackend(t, runscForTest(t))
	ctx := t.Context()
	rs, err := b.runsc()
	if err != nil {
		t.Fatal(err)
	}
	const rounds, cycles = 10, 5
	for i := range rounds {
		d := hostDecl(fmt.Sprintf("pause-gvisor-%d", i))
		d.Runtime = spec.RuntimeGVisor
		s, err := b.Create(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Pause(ctx, s.ID); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		a, err := b.Connect(ctx, s.ID)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			if got := sessionState(t, b, s.ID); got != sandbox.StatePaused {
				t.Fatalf("state = %q, want paused", got)
			}
			if status, _, err := rs.State(ctx, filepath.Join(b.opts.StateDir, s.ID), s.ID); err != nil || status != "paused" {
				t.Fatalf("runsc state = %q, %v; want paused", status, err)
			}
			if _, err := a.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}, Timeout: time.Second}, nil, nil); !errors.Is(err, sandbox.ErrConflict) {
				t.Errorf("exec while paused: %v, want conflict", err)
			}
		}
		if err := b.Resume(ctx, s.ID); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		for range cycles - 1 {
			if err := b.Pause(ctx, s.ID); err != nil {
				t.Fatalf("round %d: %v", i, err)
			}
			if err := b.Resume(ctx, s.ID); err != nil {
				t.Fatalf("round %d: %v", i, err)
			}
		}
		if out, _, res := run(t, a, "echo back"); res.ExitCode != 0 || strings.TrimSpace(out) != "back" {
			t.Fatalf("round %d: exec after resume: %q %+v", i, out, res)
		}
		a.Close()
		initPID := b.sessionInitPID(s.ID)
		if i == rounds-1 {
			if err := b.Pause(ctx, s.ID); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Terminate(ctx, s.ID); err != nil {
			t.Fatalf("round %d: terminate: %v", i, err)
		}
		assertGone(t, b, s.ID, initPID)
	}
}
