package agent_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/agent"
	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
	"github.com/airlock-sandbox/airlock/token"
)

// serveInProcess runs Serve in this process and returns a client and a stop function that
// waits for Serve to return.
func serveInProcess(t *testing.T, h *harness, hooks agent.Hooks) (*client.Client, func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	userReady := hooks.Ready
	hooks.Ready = func(addr string) {
		if userReady != nil {
			userReady(addr)
		}
		ready <- addr
	}
	done := make(chan error, 1)
	go func() { done <- agent.Serve(ctx, h.cfg, hooks) }()
	select {
	case addr := <-ready:
		if addr != strings.TrimPrefix(h.cfg.Listen, "unix:") {
			t.Errorf("Ready(%q), want the socket path", addr)
		}
	case err := <-done:
		cancel()
		t.Fatalf("Serve: %v", err)
	}
	cl := client.New(h.cfg.Listen, func() string { return h.token(token.Execute, nil) })
	var stopped bool
	var serveErr error
	stop := func() error {
		if !stopped {
			stopped = true
			cl.Close()
			cancel()
			serveErr = <-done
		}
		return serveErr
	}
	t.Cleanup(func() { _ = stop() })
	return cl, stop
}

// TestPrepareSpawnThread: the hook runs on the thread commands fork from, so what it sets on
// that thread (here no_new_privs) reaches every command and no other thread of the agent.
func TestPrepareSpawnThread(t *testing.T) {
	checkSpawnThread(t, newHarness(t))
}

// TestSpawnerLeavesMainThread: a spawner loop that starts on the main thread (tid == pid)
// moves to another thread before PrepareSpawnThread runs, so the main thread stays unfiltered.
// Forced here, this is what happened at random when the loop's goroutine was scheduled there.
func TestSpawnerLeavesMainThread(t *testing.T) {
	var startedOnMain atomic.Bool
	restore := agent.SetSpawnerLauncher(func(loop func()) {
		go onMainThread(func() {
			startedOnMain.Store(unix.Gettid() == unix.Getpid())
			loop()
		})
	})
	defer restore()
	checkSpawnThread(t, newHarness(t))
	if !startedOnMain.Load() {
		t.Fatal("the spawner loop did not start on the main thread: the test proves nothing")
	}
}

func checkSpawnThread(t *testing.T, h *harness) {
	t.Helper()
	var hookTID int
	cl, stop := serveInProcess(t, h, agent.Hooks{PrepareSpawnThread: func() error {
		hookTID = unix.Gettid()
		return unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
	}})
	var out bytes.Buffer
	res, err := cl.Exec(context.Background(), sbtypes.ExecRequest{Shell: "grep NoNewPrivs /proc/self/status", Timeout: time.Minute}, &out, nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec %+v %v", res, err)
	}
	if strings.TrimSpace(out.String()) != "NoNewPrivs:\t1" {
		t.Errorf("command: %q, want no_new_privs inherited from the spawn thread", out.String())
	}
	self, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(self), "NoNewPrivs:\t0") {
		t.Errorf("the agent's main thread got no_new_privs too")
	}
	if hookTID == 0 || hookTID == os.Getpid() {
		t.Errorf("hook ran on thread %d", hookTID)
	}
	if err := stop(); err != nil {
		t.Errorf("Serve returned %v after its context ended", err)
	}
	if _, err := os.Stat(strings.TrimPrefix(h.cfg.Listen, "unix:")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left behind: %v", err)
	}
}

func TestPrepareSpawnThreadError(t *testing.T) {
	h := newHarness(t)
	boom := errors.New("boom")
	err := agent.Serve(context.Background(), h.cfg, agent.Hooks{PrepareSpawnThread: func() error { return boom }})
	if !errors.Is(err, boom) {
		t.Errorf("Serve = %v, want the hook's error", err)
	}
}

// TestStopKillsRunning: when the agent stops, running execs end with a terminal frame and
// background processes die.
func TestStopKillsRunning(t *testing.T) {
	h := newHarness(t)
	cl, stop := serveInProcess(t, h, agent.Hooks{})
	ctx := context.Background()
	p, err := cl.StartProcess(ctx, client.ProcessRequest{ExecRequest: sbtypes.ExecRequest{Shell: "sleep 1000 & echo $!; wait", Timeout: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	att, err := cl.Attach(ctx, p.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	defer att.Close()
	s, err := cl.ExecStream(ctx, sbtypes.ExecRequest{Shell: "echo started; sleep 1000", Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := nextOutput(t, s); got != "started\n" {
		t.Fatalf("exec: %q", got)
	}
	pidText := nextOutput(t, att)
	done := make(chan sbtypes.ExecResult, 1)
	go func() {
		r, _ := s.Wait(nil, nil)
		done <- r
	}()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.Signal != "SIGKILL" {
		t.Errorf("exec running at stop ended with %+v", r)
	}
	var pid int
	if _, err := fmtSscan(pidText, &pid); err != nil {
		t.Fatalf("pid %q: %v", pidText, err)
	}
	eventually(t, "background child killed at stop", func() bool { return !alive(pid) })
}

func TestConfigRefusals(t *testing.T) {
	h := newHarness(t)
	tests := []struct {
		field  string
		mutate func(*agent.Config)
	}{
		{"sandboxId", func(c *agent.Config) { c.SandboxID = "" }},
		{"keyRing", func(c *agent.Config) { c.KeyRing = "nonsense" }},
		{"listen", func(c *agent.Config) { c.Listen = "udp:1.2.3.4:5" }},
		{"filesRoot", func(c *agent.Config) { c.FilesRoot = "relative" }},
		{"denyPaths[0]", func(c *agent.Config) { c.DenyPaths = []string{"/a/../b"} }},
		{"codeUid", func(c *agent.Config) { c.AllowRootCode = false; c.CodeUID, c.CodeGID = 0, 0 }},
		{"maxTimeout", func(c *agent.Config) { c.MaxTimeout = 0 }},
		{"defaultOutputCap", func(c *agent.Config) { c.DefaultOutputCap = 0 }},
		{"env", func(c *agent.Config) { c.Env = map[string]string{"1BAD": "x"} }},
		{"cgroupV2", func(c *agent.Config) { c.CgroupV2 = "/nonexistent-cgroup" }},
		{"socketUid", func(c *agent.Config) { c.CodeUID, c.SocketUID = 65534, 65534 }},
		{"socketUid", func(c *agent.Config) { c.SocketUID = -1 }},
	}
	for _, tc := range tests {
		t.Run(tc.field, func(t *testing.T) {
			cfg := h.cfg
			tc.mutate(&cfg)
			err := agent.Serve(context.Background(), cfg, agent.Hooks{})
			if !errors.Is(err, sbtypes.ErrInvalid) || !strings.Contains(err.Error(), tc.field) {
				t.Errorf("Serve = %v, want ErrInvalid naming %s", err, tc.field)
			}
		})
	}
}

func fmtSscan(s string, pid *int) (int, error) { return fmt.Sscan(strings.TrimSpace(s), pid) }
