package gcp

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/internal/testutil"

	"go.uber.org/goleak"
)

// The fake launcher's world, made by TestMain when root: the agent and the fake, built into a
// directory the fake's sandboxes see (their root is this machine's, their /tmp their own), and
// the fake's state dir (short: the local runtime's sockets live below it).
var (
	binDir       string
	fakeLauncher string
	fakeAgent    string
	fakeState    string
	setupErr     error
)

func TestMain(m *testing.M) {
	code := func() int {
		if os.Geteuid() == 0 {
			setupErr = setup()
			defer teardown()
		}
		return m.Run()
	}()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

func setup() error {
	var err error
	if binDir, err = os.MkdirTemp("/var/lib", "airlock-gcp-test-"); err != nil {
		return err
	}
	if err := os.Chmod(binDir, 0o755); err != nil {
		return err
	}
	fakeAgent = filepath.Join(binDir, "airlock-agent")
	fakeLauncher = filepath.Join(binDir, "sandbox")
	for _, b := range []struct{ out, pkg string }{
		{fakeAgent, "github.com/airlock-sandbox/airlock/cmd/airlock-agent"},
		{fakeLauncher, "github.com/airlock-sandbox/airlock/backend/gcp/fakelauncher"},
	} {
		build := exec.Command("go", "build", "-o", b.out, b.pkg)
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			return fmt.Errorf("build %s: %v\n%s", b.pkg, err, out)
		}
	}
	if fakeState, err = os.MkdirTemp("/run", "afg-"); err != nil {
		return err
	}
	return os.Chmod(fakeState, 0o711)
}

// teardown deletes whatever sandbox a failed test left, then the directories.
func teardown() {
	if fakeState != "" {
		names, _ := os.ReadDir(filepath.Join(fakeState, "names"))
		for _, n := range names {
			cmd := exec.Command(fakeLauncher, "delete", "--force", n.Name())
			cmd.Env = launcherEnv()
			_ = cmd.Run()
		}
		// The launcher's local runtime made its state dir there: a tmpfs of its own on /run's disk.
		_ = local.RemoveStateDir(fakeState)
	}
	if binDir != "" {
		os.RemoveAll(binDir)
	}
}

func launcherEnv() []string {
	return append(os.Environ(), "AIRLOCK_FAKE_LAUNCHER_STATE="+fakeState, "AIRLOCK_AGENT="+fakeAgent)
}

// requireRoot is testutil.RequireRoot (the fake launcher runs its sandboxes on the local
// runtime) and fails when the fake launcher could not be built.
func requireRoot(t *testing.T) {
	t.Helper()
	testutil.RequireRoot(t)
	if setupErr != nil {
		t.Fatalf("fake launcher setup: %v", setupErr)
	}
}

// newFakeBackend is a backend driving the fake launcher.
func newFakeBackend(t *testing.T) *Backend {
	t.Helper()
	requireRoot(t)
	b, err := New(context.Background(), Options{Launcher: fakeLauncher, AgentPath: fakeAgent, LauncherEnv: launcherEnv()})
	if err != nil {
		t.Fatal(err)
	}
	return b
}
