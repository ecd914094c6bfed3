package tssdk

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"go.uber.org/goleak"

	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/runcode/runcodetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// requireTool finds a program the suite cannot run without; in CI its absence fails.
func requireTool(t *testing.T, name, install string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	if os.Getenv("AIRLOCK_REQUIRE_ROOT") == "1" {
		t.Fatalf("%s is not on PATH: %s", name, install)
	}
	t.Skipf("%s is not on PATH (%s)", name, install)
	return ""
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

// TestTypeScriptSDK installs the package's dependencies from package-lock.json when
// node_modules is missing, fails when src/gen is stale (npm run check-generated), compiles it,
// builds cmd/airlock-full (as airlock) with airlock-server and airlock-agent beside it, and runs the node suites
// (test/): the wire table, the shared declaration corpus, and the client against a real
// `airlock serve` the suite starts, with the README's examples run from the npm pack output.
// Afterwards no sandbox may survive the daemon.
func TestTypeScriptSDK(t *testing.T) {
	testutil.RequireRoot(t)
	node := requireTool(t, "node", "apt-get install nodejs (20 or newer)")
	npm := requireTool(t, "npm", "apt-get install npm")
	requireTool(t, "openssl", "apt-get install openssl")

	if _, err := os.Stat("node_modules/typescript/package.json"); err != nil {
		run(t, npm, "ci", "--no-audit", "--no-fund")
	}
	run(t, npm, "run", "--silent", "check-generated")
	run(t, npm, "run", "--silent", "build")

	bin, cleanup, err := runcodetest.Build("github.com/airlock-sandbox/airlock/cmd/airlock-full", "airlock")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	// Next to airlock, where airlock serve looks for airlock-server and the local runtime for
	// the agent.
	for _, name := range []string{"airlock-agent", "airlock-server"} {
		build := exec.Command("go", "build", "-o", filepath.Join(filepath.Dir(bin), name), "github.com/airlock-sandbox/airlock/cmd/"+name)
		build.Env = append(os.Environ(), "CGO_ENABLED=0") // static, as shipped: no cgo
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", name, err, out)
		}
	}

	stateDir := runcodetest.StateDir(t)
	if err := os.Chmod(stateDir, 0o711); err != nil { // the sandbox's mapped root must reach its session
		t.Fatal(err)
	}
	parent := runcodetest.CgroupParent(t)
	var output bytes.Buffer
	cmd := exec.Command(node, "--test", "test/")
	cmd.Env = append(os.Environ(),
		"AIRLOCK_BIN="+bin,
		"AIRLOCK_E2E_STATE_DIR="+stateDir,
		"AIRLOCK_E2E_CGROUP_PARENT="+parent,
	)
	cmd.Stdout, cmd.Stderr = &output, &output
	err = cmd.Run()
	t.Logf("node --test:\n%s", output.String())
	if err != nil {
		t.Fatalf("node --test: %v", err)
	}
	// node:test's summary: every test ran and passed, each file's suites included.
	pass := regexp.MustCompile(`(?m)^# pass (\d+)$`).FindSubmatch(output.Bytes())
	if pass == nil || !regexp.MustCompile(`(?m)^# fail 0$`).Match(output.Bytes()) {
		t.Fatal("no node:test summary with zero failures")
	}
	if n, _ := strconv.Atoi(string(pass[1])); n < 140 {
		t.Fatalf("only %d node tests passed; the suites have more than 140", n)
	}

	// The daemon is gone; what it created must be too. A new runtime over the same state dir
	// adopts any sandbox still alive.
	b, err := local.New(context.Background(), local.Options{StateDir: stateDir, CgroupParent: parent, AgentPath: filepath.Join(filepath.Dir(bin), "airlock-agent")})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	list, err := b.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list {
		t.Errorf("sandbox %s (%s) outlived the daemon that created it", s.ID, s.SandboxID)
		if err := b.Terminate(context.Background(), s.ID); err != nil {
			t.Errorf("terminate %s: %v", s.ID, err)
		}
	}
}
