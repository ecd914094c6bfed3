package main

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/client"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/runcode/runcodetest"
)

// TestCLILinksNoServer keeps the daemon side out of the one-shot CLI (DESIGN.md, "Start-up is
// on the hot path"): serve and mcp live in airlock-server; their packages' inits cost every
// airlock run ~3 ms (prometheus' default collectors, the MCP SDK, protobuf descriptors).
func TestCLILinksNoServer(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	forbidden := []string{
		"github.com/prometheus/", "github.com/modelcontextprotocol/", "github.com/google/jsonschema-go",
		"golang.org/x/oauth2", "k8s.io/client-go", "sigs.k8s.io/controller-runtime",
		"github.com/google/go-containerregistry/pkg/registry",
	}
	forbiddenExact := map[string]bool{
		"github.com/airlock-sandbox/airlock/server":             true,
		"github.com/airlock-sandbox/airlock/mcp":                true,
		"github.com/airlock-sandbox/airlock/internal/servercmd": true,
	}
	// The kubeconfig's types (backend/kubernetes' discovery reads a kubeconfig with them): type
	// declarations only, measured at no change in the CLI's init time (session 11). The rest of
	// client-go stays out.
	allowed := map[string]bool{
		"k8s.io/client-go/tools/clientcmd/api":    true,
		"k8s.io/client-go/tools/clientcmd/api/v1": true,
	}
	for _, pkg := range strings.Fields(string(out)) {
		if allowed[pkg] {
			continue
		}
		if forbiddenExact[pkg] {
			t.Errorf("airlock links %s", pkg)
		}
		for _, f := range forbidden {
			if strings.HasPrefix(pkg, f) {
				t.Errorf("airlock links %s", pkg)
			}
		}
	}
}

// buildCLI builds airlock, and airlock-server beside it when withServer, into a fresh
// directory; it returns airlock's path.
func buildCLI(t *testing.T, withServer bool) string {
	t.Helper()
	bin, cleanup, err := runcodetest.Build("github.com/airlock-sandbox/airlock/cmd/airlock-full", "airlock")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	if withServer {
		build := exec.Command("go", "build", "-o", filepath.Join(filepath.Dir(bin), "airlock-server"), "github.com/airlock-sandbox/airlock/cmd/airlock-server")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build airlock-server: %v\n%s", err, out)
		}
	}
	return bin
}

// runBin runs the built CLI with env added to this process's and returns its status and output.
func runBin(t *testing.T, env []string, bin string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errb.String()
}

// airlock serve and airlock mcp run airlock-server: its flags, help, messages and exit
// statuses come through; without it, the error names the binary and where it was looked for.
func TestServerCommandsThroughCLI(t *testing.T) {
	bin := buildCLI(t, true)
	t.Setenv(envServer, "")
	for _, tt := range []struct {
		args     []string
		code     int
		stdout   string
		stderr   string
		noStderr string
	}{
		{args: []string{"serve", "--help"}, stdout: "airlock serve [--socket PATH]"},
		{args: []string{"mcp", "--help"}, stdout: "--pool-prestart"},
		{args: []string{"--help"}, stdout: "Serve run_code and sandbox session tools"},
		{args: []string{"serve", "--socket-mode", "0666"}, code: 2, stderr: "airlock: --socket-mode 0666 lets every local user"},
		{args: []string{"mcp", "--http", "0.0.0.0:0"}, code: 2, stderr: "not a loopback address"},
		{args: []string{"-o", "json", "mcp", "--bogus"}, code: 2, stderr: "see 'airlock mcp --help'"},
	} {
		code, out, errs := runBin(t, nil, bin, tt.args...)
		if code != tt.code || !strings.Contains(out, tt.stdout) || !strings.Contains(errs, tt.stderr) {
			t.Errorf("airlock %q: exit %d (want %d)\nstdout %q (want %q)\nstderr %q (want %q)", tt.args, code, tt.code, out, tt.stdout, errs, tt.stderr)
		}
	}

	// Alone, with nothing on PATH: a refusal that says what to install.
	alone := filepath.Join(t.TempDir(), "airlock")
	if err := os.Link(bin, alone); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"serve", "mcp"} {
		code, _, errs := runBin(t, []string{"PATH=" + t.TempDir()}, alone, name)
		if code != 1 || !strings.Contains(errs, "airlock "+name+": the airlock-server binary was not found") || !strings.Contains(errs, "go build -o "+filepath.Dir(alone)+"/ ./cmd/airlock-server") {
			t.Errorf("airlock %s without airlock-server: exit %d, %q", name, code, errs)
		}
	}
	code, _, errs := runBin(t, []string{envServer + "=/nonexistent/airlock-server"}, alone, "serve")
	if code != 1 || !strings.Contains(errs, "$AIRLOCK_SERVER: stat /nonexistent/airlock-server") {
		t.Errorf("$AIRLOCK_SERVER absent: exit %d, %q", code, errs)
	}
	// airlock itself as $AIRLOCK_SERVER would exec itself forever.
	code, _, errs = runBin(t, []string{envServer + "=" + alone}, alone, "serve")
	if code != 1 || !strings.Contains(errs, "is this airlock binary, not airlock-server") {
		t.Errorf("$AIRLOCK_SERVER naming airlock: exit %d, %q", code, errs)
	}
	// $AIRLOCK_SERVER wins over PATH and the directory.
	code, out, _ := runBin(t, []string{envServer + "=" + filepath.Join(filepath.Dir(bin), "airlock-server"), "PATH=" + t.TempDir()}, alone, "serve", "--help")
	if code != 0 || !strings.Contains(out, "--socket") {
		t.Errorf("$AIRLOCK_SERVER: exit %d, %q", code, out)
	}
}

// The daemons themselves, started as users start them: airlock serve answers on its socket
// and stops on SIGTERM; airlock mcp runs code for a stdio client.
func TestServerDaemonsThroughCLI(t *testing.T) {
	testutil.RequireRoot(t)
	bin := buildCLI(t, true)
	env := newRuntimeEnv(t)
	t.Setenv(envServer, "")

	dir := t.TempDir()
	sock := filepath.Join(dir, "a.sock")
	serve := exec.Command(bin, append([]string{"serve", "--socket", sock, "--signing-key", filepath.Join(dir, "k"), "--log-level", "warn"}, env.flags()...)...)
	var logs testutil.SyncBuffer
	serve.Stdout, serve.Stderr = &logs, &logs
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- serve.Wait() }()
	// Ready once the socket answers; a bad flag ends the process instead.
	for {
		select {
		case err := <-exited:
			t.Fatalf("airlock serve ended: %v\n%s", err, logs.String())
		case <-time.After(10 * time.Millisecond):
		}
		if conn, err := net.Dial("unix", sock); err == nil {
			conn.Close()
			break
		}
	}
	c, err := client.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.List(t.Context(), nil); err != nil {
		t.Errorf("list through airlock serve: %v", err)
	}
	c.Close()
	// The process is airlock-server now, not airlock waiting for it.
	if exe, err := os.Readlink("/proc/" + strconv.Itoa(serve.Process.Pid) + "/exe"); err != nil || filepath.Base(exe) != "airlock-server" {
		t.Errorf("airlock serve's process runs %q (%v), want airlock-server", exe, err)
	}
	_ = serve.Process.Signal(syscall.SIGTERM)
	if err := <-exited; err != nil {
		t.Errorf("airlock serve on SIGTERM: %v\n%s", err, logs.String())
	}

	mcpCmd := exec.Command(bin, append([]string{"mcp", "--pool", "0"}, env.flags()...)...)
	mcpCmd.Stderr = &logs
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "airlock-test", Version: "1"}, nil).Connect(t.Context(), &sdk.CommandTransport{Command: mcpCmd}, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, logs.String())
	}
	r, err := cs.CallTool(t.Context(), &sdk.CallToolParams{Name: "run_code", Arguments: map[string]any{"language": "python", "code": "print(6*7)"}})
	if err != nil || textOf(r) != "Exit code: 0\n\n--- stdout ---\n42\n" {
		t.Errorf("run_code through airlock mcp: %v %s\n%s", err, textOf(r), logs.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- cs.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("airlock mcp after its client closed: %v\n%s", err, logs.String())
		}
	case <-ctx.Done():
		t.Errorf("airlock mcp did not stop when its client closed\n%s", logs.String())
	}
}
