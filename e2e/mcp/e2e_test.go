// Package e2emcp drives the real airlock binary's MCP server with the official TypeScript MCP client.
package e2emcp

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

// TestExternalClient builds cmd/airlock-full (as airlock), cmd/airlock-server and cmd/airlock-agent, installs the TypeScript SDK
// from package-lock.json when node_modules is missing, and runs test/mcp.test.mjs: the
// official client over stdio and streamable HTTP against `airlock mcp`. Afterwards no sandbox
// may survive the servers.
func TestExternalClient(t *testing.T) {
	testutil.RequireRoot(t)
	node := requireTool(t, "node", "apt-get install nodejs (18 or newer)")
	npm := requireTool(t, "npm", "apt-get install npm")

	bin, cleanup, err := runcodetest.Build("github.com/airlock-sandbox/airlock/cmd/airlock-full", "airlock")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	// Next to airlock, where the local runtime looks for the agent first, and where airlock
	// mcp looks for airlock-server, which serves it.
	for _, name := range []string{"airlock-agent", "airlock-server"} {
		build := exec.Command("go", "build", "-o", filepath.Join(filepath.Dir(bin), name), "github.com/airlock-sandbox/airlock/cmd/"+name)
		build.Env = append(os.Environ(), "CGO_ENABLED=0") // static, as shipped: no cgo
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", name, err, out)
		}
	}

	if _, err := os.Stat("node_modules/@modelcontextprotocol/sdk/package.json"); err != nil {
		cmd := exec.Command(npm, "ci", "--no-audit", "--no-fund")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci: %v\n%s", err, out)
		}
	}

	stateDir := runcodetest.StateDir(t)
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
	// node:test's summary: every test ran and passed, both transports' suites included.
	pass := regexp.MustCompile(`(?m)^# pass (\d+)$`).FindSubmatch(output.Bytes())
	if pass == nil || !regexp.MustCompile(`(?m)^# fail 0$`).Match(output.Bytes()) {
		t.Fatal("no node:test summary with zero failures")
	}
	if n, _ := strconv.Atoi(string(pass[1])); n < 20 {
		t.Fatalf("only %d node tests passed; the suite has more than 20", n)
	}

	// The servers are gone; what they created must be too. A new runtime over the same state
	// dir adopts any sandbox still alive.
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
		t.Errorf("sandbox %s (%s) outlived the MCP server that created it", s.ID, s.SandboxID)
		if err := b.Terminate(context.Background(), s.ID); err != nil {
			t.Errorf("terminate %s: %v", s.ID, err)
		}
	}
}
