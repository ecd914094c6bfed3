package local

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// agentBin is the agent binary TestMain builds, so that the tests run what ships.
var agentBin string

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(runHelper())
	}
	code := func() int {
		if os.Geteuid() == 0 {
			dir, err := os.MkdirTemp("", "airlock-agent-")
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			defer os.RemoveAll(dir)
			// The sandbox's mapped root runs the binary: it must be reachable by others.
			if err := os.Chmod(dir, 0o755); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			agentBin = filepath.Join(dir, "airlock-agent")
			out, err := exec.Command("go", "build", "-o", agentBin, "github.com/airlock-sandbox/airlock/cmd/airlock-agent").CombinedOutput()
			if err != nil {
				fmt.Fprintf(os.Stderr, "build agent: %v\n%s", err, out)
				return 1
			}
		}
		return goleakMain(m)
	}()
	os.Exit(code)
}

func goleakMain(m *testing.M) int {
	code := m.Run()
	if code != 0 {
		return code
	}
	if err := goleak.Find(); err != nil {
		fmt.Fprintln(os.Stderr, "goleak:", err)
		return 1
	}
	return 0
}

// testStateDir is a short state dir (unix socket paths are limited to 107 bytes).
func testStateDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "al")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// newTestBackend returns a backend over a fresh state dir, with its own cgroup parent; the
// cleanup terminates whatever the test left and checks nothing remains.
func newTestBackend(t testing.TB) *Backend {
	t.Helper()
	testutil.RequireRoot(t)
	return newTestBackendAt(t, testStateDir(t))
}

func newTestBackendAt(t testing.TB, stateDir string) *Backend {
	t.Helper()
	b, err := New(context.Background(), Options{StateDir: stateDir, AgentPath: agentBin})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		list, _ := b.List(ctx)
		for _, s := range list {
			if err := b.Terminate(ctx, s.ID); err != nil {
				t.Errorf("cleanup: terminate %s: %v", s.ID, err)
			}
		}
		b.Close()
		_ = os.Remove(filepath.Join("/sys/fs/cgroup/freezer", b.opts.CgroupParent))
		for _, c := range v1Controllers {
			_ = os.Remove(filepath.Join(cgroupRoot, c, b.opts.CgroupParent))
		}
	})
	return b
}

func hostDecl(id string) spec.Sandbox {
	d := spec.Sandbox{ID: id, Image: spec.Image{Host: true}}
	d.ApplyDefaults()
	return d
}

// run executes a shell command in the session and returns stdout, stderr and the result.
func run(t testing.TB, a sandbox.Agent, shell string) (string, string, sandbox.ExecResult) {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := a.Exec(ctx, sandbox.ExecRequest{Shell: shell, Timeout: 30 * time.Second}, &out, &errb)
	if err != nil {
		t.Fatalf("exec %q: %v", shell, err)
	}
	return out.String(), errb.String(), res
}

func TestSmoke(t *testing.T) {
	b := newTestBackend(t)
	ctx := context.Background()
	s, err := b.Create(ctx, hostDecl("smoke"))
	if err != nil {
		t.Fatal(err)
	}
	a, err := b.Connect(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	out, errs, res := run(t, a, "echo hello; id; python3 -c 'import json,ssl,sqlite3; print(2+2)'; node -e 'console.log(1+1)'; bash -c 'echo bash'; pwd; ls -la /")
	t.Logf("out:\n%s\nerr:\n%s\nres: %+v", out, errs, res)
	if !strings.Contains(out, "hello") {
		t.Fatal("no hello")
	}
	if err := b.Terminate(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
}

// helperEnv makes the test binary act as a separate process that creates sandboxes (see
// TestRestartAdopts).
const helperEnv = "AIRLOCK_LOCAL_TEST_HELPER"

func runHelper() int { return 2 }
