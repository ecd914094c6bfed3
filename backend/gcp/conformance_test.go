package gcp

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/sandbox/conformance"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
	"github.com/airlock-sandbox/airlock/spec"
)

// decl is the suite's declaration: what a gcp sandbox can be (image host, gVisor), the rest
// left to the platform.
func decl(id string) spec.Sandbox {
	return spec.Sandbox{ID: id, Image: spec.Image{Host: true}, Runtime: spec.RuntimeGVisor, Workdir: "/workspace", HostedBy: "app"}
}

// TestConformance runs the suite against the fake launcher: the binding's real argv, our agent
// started through `run`, every call through `exec` of the agent's bridge.
func TestConformance(t *testing.T) {
	requireRoot(t)
	conformance.Run(t, func(t *testing.T) sandbox.Backend { return newFakeBackend(t) }, conformance.Options{
		Decl:             decl,
		PlatformDefaults: true,
		Extra: []conformance.Subtest{
			{Name: "EveryExitStatus", Run: everyExitStatus},
			{Name: "FiveMegabyteFile", Exercises: []capability.Name{capability.Files}, Run: bigFile},
			{Name: "TerminateConfirmed", Run: terminateConfirmed},
			{Name: "DeadlineKillsDetachedChildren", Exercises: []capability.Name{capability.BackgroundProcesses}, Run: detachedChildren},
		},
	})
}

// TestConformanceNoAgent runs the suite on the launcher-exec path (Options.NoAgent): every
// command one launcher exec, its status recovered from the marker the wrapper prints.
func TestConformanceNoAgent(t *testing.T) {
	requireRoot(t)
	newNoAgent := func(t *testing.T) *Backend {
		b, err := New(context.Background(), Options{Launcher: fakeLauncher, LauncherEnv: launcherEnv(), NoAgent: true})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	conformance.Run(t, func(t *testing.T) sandbox.Backend { return newNoAgent(t) }, conformance.Options{
		Decl:             decl,
		PlatformDefaults: true,
		Extra: []conformance.Subtest{
			{Name: "EveryExitStatus", Run: func(t *testing.T) { everyExitStatusOn(t, newNoAgent(t)) }},
			{Name: "FilesRefused", Run: func(t *testing.T) {
				_, a := create(t, newNoAgent(t), "no-files")
				if _, err := a.Stat(context.Background(), "/workspace"); !errors.Is(err, sandbox.ErrUnsupported) || !strings.Contains(err.Error(), "gcp.noAgent") {
					t.Errorf("Stat without the agent: %v, want ErrUnsupported saying why", err)
				}
			}},
		},
	})
}

// create starts a sandbox on b and registers its termination.
func create(t *testing.T, b *Backend, id string) (*sandbox.Session, sandbox.Agent) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := b.Create(ctx, decl(id))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Terminate(context.Background(), s.ID); err != nil {
			t.Errorf("Terminate: %v", err)
		}
	})
	a, err := b.Connect(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return s, a
}

// everyExitStatus: the launcher collapses a command's status to 0/1; through our agent every
// status 0-255 comes back as it was.
func everyExitStatus(t *testing.T) { everyExitStatusOn(t, newFakeBackend(t)) }

func everyExitStatusOn(t *testing.T, b *Backend) {
	_, a := create(t, b, "exit-all")
	// Each exec reuses the bridge's kept-alive connection: one launcher process for all 256.
	for code := range 256 {
		var out bytes.Buffer
		res, err := a.Exec(context.Background(), sandbox.ExecRequest{Shell: fmt.Sprintf("exit %d", code), Timeout: time.Minute}, &out, &out)
		if err != nil || res.ExitCode != code {
			t.Errorf("exit %d: %+v, %v (%q)", code, res, err, out.String())
		}
	}
}

// bigFile: a 5 MB file goes in and out byte for byte (the launcher's argv path would be
// bounded by 128 KiB per argument).
func bigFile(t *testing.T) { bigFileOn(t, newFakeBackend(t)) }

func bigFileOn(t *testing.T, b *Backend) {
	_, a := create(t, b, "big-file")
	ctx := context.Background()
	data := make([]byte, 5<<20)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	if err := a.WriteFile(ctx, "/workspace/big.bin", bytes.NewReader(data), 0o644); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	var out bytes.Buffer
	if res, err := a.Exec(ctx, sandbox.ExecRequest{Shell: "wc -c < /workspace/big.bin", Timeout: time.Minute}, &out, &out); err != nil || strings.TrimSpace(out.String()) != "5242880" {
		t.Fatalf("wc -c: %q %+v %v", out.String(), res, err)
	}
	rc, err := a.ReadFile(ctx, "/workspace/big.bin", 0, -1)
	if err != nil {
		t.Fatalf("ReadFile: %v", err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes (%v), equal %v", len(got), err, bytes.Equal(got, data))
	}
}

// terminateConfirmed: after Terminate the launcher itself no longer runs a command in the
// sandbox (not only our map forgetting it), and a second Terminate succeeds.
func terminateConfirmed(t *testing.T) {
	b := newFakeBackend(t)
	ctx := context.Background()
	s, err := b.Create(ctx, decl("term-confirm"))
	if err != nil {
		t.Fatal(err)
	}
	probe := exec.Command(fakeLauncher, "exec", s.ID, "--stdin=false", "--", "/bin/true")
	probe.Env = launcherEnv()
	if out, err := probe.CombinedOutput(); err != nil {
		t.Fatalf("the sandbox does not run commands before Terminate: %v %s", err, out)
	}
	if err := b.Terminate(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	probe = exec.Command(fakeLauncher, "exec", s.ID, "--stdin=false", "--", "/bin/true")
	probe.Env = launcherEnv()
	var exit *exec.ExitError
	if out, err := probe.CombinedOutput(); !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("exec after Terminate: %v %s, want exit 1", err, out)
	}
	if err := b.Terminate(ctx, s.ID); err != nil {
		t.Fatalf("second Terminate: %v", err)
	}
	if _, err := b.Get(ctx, s.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("Get after Terminate: %v", err)
	}
}

// detachedChildren: inside gVisor there is no cgroup for the agent to kill through; its
// subreaper still kills what an exec started in a session of its own (setsid) or by a double
// fork, at the exec's deadline and at its end, and a caller's cancel.
func detachedChildren(t *testing.T) {
	_, a := create(t, newFakeBackend(t), "detached")
	ctx := context.Background()
	h, err := a.Health(ctx)
	if err != nil || h.KillScope != sbtypes.KillScopeSubreaper {
		t.Fatalf("health %+v %v, want killScope %s", h, err, sbtypes.KillScopeSubreaper)
	}
	// Each process records its pid in DIR/pN; the script prints "ready" once all three have.
	tree := func(dir, tail string) string {
		return fmt.Sprintf(`mkdir -p %[1]s && cd %[1]s
setsid sh -c 'echo $$ > p1; exec sleep 1000' >/dev/null 2>&1 &
sh -c 'setsid sh -c "echo \$\$ > p2; exec sleep 1001" &' >/dev/null 2>&1
sleep 1002 >/dev/null 2>&1 & echo $! > p3
while [ ! -s p1 ] || [ ! -s p2 ] || [ ! -s p3 ]; do sleep 0.01; done
echo ready
%[2]s`, dir, tail)
	}
	// gone reports, through another exec, which of DIR's recorded processes still run.
	alive := func(t *testing.T, dir string) string {
		t.Helper()
		var out bytes.Buffer
		// A zombie its reaper has not waited for yet counts as gone.
		res, err := a.Exec(ctx, sandbox.ExecRequest{Shell: fmt.Sprintf(`for f in %[1]s/p1 %[1]s/p2 %[1]s/p3; do p=$(cat $f); s=$(cut -d' ' -f3 /proc/$p/stat 2>/dev/null); [ -n "$s" ] && [ "$s" != Z ] && echo $p; done; true`, dir), Timeout: time.Minute}, &out, &out)
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("look at %s: %+v %v %q", dir, res, err, out.String())
		}
		return out.String()
	}
	for _, tc := range []struct {
		name    string
		tail    string
		timeout time.Duration
		cancel  bool
	}{
		{"deadline", "sleep 1003", 5 * time.Second, false},
		{"end of the exec", "exit 0", time.Minute, false},
		{"cancel", "sleep 1003", time.Minute, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := "/tmp/detached-" + strings.ReplaceAll(tc.name, " ", "-")
			ectx, cancel := context.WithCancel(ctx)
			defer cancel()
			pr, pw := io.Pipe()
			done := make(chan struct{})
			var res sandbox.ExecResult
			var err error
			go func() {
				defer close(done)
				defer pw.Close()
				res, err = a.Exec(ectx, sandbox.ExecRequest{Shell: tree(dir, tc.tail), Timeout: tc.timeout}, pw, io.Discard)
			}()
			line := make([]byte, 6)
			if _, rerr := io.ReadFull(pr, line); rerr != nil || string(line) != "ready\n" {
				t.Fatalf("the processes did not start: %q %v", line, rerr)
			}
			if tc.cancel {
				cancel()
			}
			go func() { _, _ = io.Copy(io.Discard, pr) }()
			<-done
			switch {
			case tc.cancel:
				if err == nil {
					t.Errorf("cancelled exec: %+v, want an error", res)
				}
			case tc.timeout < time.Minute:
				if err != nil || !res.TimedOut {
					t.Errorf("result %+v %v, want timed out", res, err)
				}
			default:
				if err != nil || res.ExitCode != 0 || res.TimedOut {
					t.Errorf("result %+v %v, want exit 0", res, err)
				}
			}
			// The exec's kill is confirmed before its result (or, cancelled, soon after).
			for i := 0; ; i++ {
				left := alive(t, dir)
				if left == "" {
					break
				}
				if !tc.cancel || i > 100 {
					t.Fatalf("still running after the exec: %q", left)
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
}
