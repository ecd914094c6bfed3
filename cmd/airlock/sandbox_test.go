package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/client"
	"github.com/airlock-sandbox/airlock/internal/cli"
	"github.com/airlock-sandbox/airlock/internal/servercmd"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/runcode/runcodetest"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// cliIn runs the CLI in-process with stdin and returns its exit status and output, as run does.
func cliIn(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	return execRoot(newRootCmd(), stdin, args)
}

// serverIn runs airlock-server's commands in-process (in airlock, serve and mcp replace the
// process with airlock-server).
func serverIn(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return execRoot(cli.NewRoot("airlock", servercmd.Commands), "", args)
}

func execRoot(root *cobra.Command, stdin string, args []string) (int, string, string) {
	var out, errb bytes.Buffer
	root.SetArgs(args)
	root.SetIn(strings.NewReader(stdin))
	root.SetOut(&out)
	root.SetErr(&errb)
	err := root.Execute()
	code := cli.ExitOK
	var ee *cli.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.Code
		if ee.Err != nil {
			errb.WriteString("airlock: " + ee.Err.Error() + "\n")
		}
	case err != nil:
		code = cli.ExitRefused
		errb.WriteString("airlock: " + err.Error() + "\n")
	}
	return code, out.String(), errb.String()
}

// startServe runs `airlock serve` in-process on a fresh socket and state dir until the test ends.
func startServe(t *testing.T, extra ...string) (sock string) {
	t.Helper()
	testutil.RequireRoot(t)
	agent, cleanup, err := runcodetest.BuildAgent()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	t.Setenv("AIRLOCK_AGENT", agent)
	stateDir := runcodetest.StateDir(t)
	parent := runcodetest.CgroupParent(t)
	dir := t.TempDir()
	sock = filepath.Join(dir, "a.sock")
	args := append([]string{"--socket", sock, "--state-dir", stateDir, "--cgroup-parent", parent,
		"--signing-key", filepath.Join(dir, "signing.key"), "--log-level", "warn"}, extra...)
	cmd := servercmd.NewServeCmd(&cli.Globals{Output: cli.OutputText})
	var logs bytes.Buffer
	cmd.SetOut(&logs)
	cmd.SetErr(&logs)
	cmd.SetArgs(args)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		c, _ := client.Dial(sock)
		if c != nil {
			if l, err := c.List(context.Background(), nil); err == nil {
				for _, sb := range l {
					t.Errorf("sandbox %s left behind", sb.ID)
					_ = sb.Terminate(context.Background())
				}
			}
			c.Close()
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v\n%s", err, logs.String())
		}
	})
	// Ready once the socket answers; serve fails fast on a bad flag, so watch for that too.
	for {
		select {
		case err := <-done:
			t.Fatalf("serve ended: %v\n%s", err, logs.String())
		default:
		}
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return sock
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestSandboxCommands(t *testing.T) {
	sock := startServe(t)
	t.Setenv(client.EnvSocket, sock)
	t.Setenv(client.EnvToken, "")
	t.Setenv(client.EnvAPIKey, "")
	t.Setenv(client.EnvURL, "")

	// The daemon's platform (auto chose the local runtime on this root host) and its set.
	code, out, errs := cliIn(t, "", "sandbox", "capabilities")
	if code != 0 || !strings.HasPrefix(out, "local capabilities (the daemon's)\n") || !strings.Contains(out, "files ") {
		t.Errorf("sandbox capabilities: %d %q %q", code, out, errs)
	}
	code, out, errs = cliIn(t, "", "sandbox", "create", "--label", "team=red", "--env", "GREETING=hi")
	if code != 0 || !strings.HasPrefix(out, "s-") {
		t.Fatalf("create: %d %q %q", code, out, errs)
	}
	id := strings.TrimSpace(out)
	code, out, _ = cliIn(t, "", "sandbox", "create", "--id", "other", "-o", "json")
	var other sandbox.Session
	if code != 0 || json.Unmarshal([]byte(out), &other) != nil || other.SandboxID != "other" {
		t.Fatalf("create -o json: %d %q", code, out)
	}

	code, out, _ = cliIn(t, "", "sandbox", "ls", "--label", "team=red")
	if code != 0 || !strings.Contains(out, "SESSION") || !strings.Contains(out, id) || strings.Contains(out, other.ID) || !strings.Contains(out, "team=red") {
		t.Fatalf("ls --label: %d\n%s", code, out)
	}
	code, out, _ = cliIn(t, "", "sandbox", "ls", "-o", "json")
	var all []sandbox.Session
	if code != 0 || json.Unmarshal([]byte(out), &all) != nil || len(all) != 2 {
		t.Fatalf("ls -o json: %d %q", code, out)
	}

	for _, tc := range []struct {
		name, stdin string
		args        []string
		code        int
		out, err    string
	}{
		{"argv", "", []string{id, "--", "python3", "-c", "import os; print(os.environ['GREETING'])"}, 0, "hi\n", ""},
		{"exit status", "", []string{id, "--sh", "echo out; echo err >&2; exit 7"}, 7, "out\n", "err\n"},
		{"stdin", "shout\n", []string{"-i", id, "--", "tr", "a-z", "A-Z"}, 0, "SHOUT\n", ""},
		{"timeout", "", []string{id, "--timeout", "300ms", "--", "sleep", "30"}, 124, "", "timed out after 300ms"},
		{"no command", "", []string{id}, 2, "", "COMMAND"},
		{"unknown session", "", []string{"s-0000000000000000", "--", "true"}, exitRunFailed, "", "not found"},
	} {
		code, out, errs := cliIn(t, tc.stdin, append([]string{"sandbox", "exec"}, tc.args...)...)
		if code != tc.code || out != tc.out || !strings.Contains(errs, tc.err) {
			t.Errorf("exec %s: %d %q %q; want %d %q %q", tc.name, code, out, errs, tc.code, tc.out, tc.err)
		}
	}

	dir := t.TempDir()
	src := filepath.Join(dir, "in.txt")
	os.WriteFile(src, []byte("payload\n"), 0o640)
	if code, _, errs := cliIn(t, "", "sandbox", "cp", src, id+":/workspace/in.txt"); code != 0 {
		t.Fatalf("cp in: %d %s", code, errs)
	}
	if code, out, errs := cliIn(t, "", "sandbox", "exec", id, "--sh", "stat -c %a /workspace/in.txt; cat /workspace/in.txt"); code != 0 || out != "640\npayload\n" {
		t.Fatalf("after cp in: %d %q %s", code, out, errs)
	}
	if code, _, errs := cliIn(t, "from stdin", "sandbox", "cp", "-", id+":/workspace/s.txt"); code != 0 {
		t.Fatalf("cp from stdin: %d %s", code, errs)
	}
	if code, out, _ := cliIn(t, "", "sandbox", "cp", id+":/workspace/s.txt", "-"); code != 0 || out != "from stdin" {
		t.Fatalf("cp to stdout: %d %q", code, out)
	}
	if code, _, errs := cliIn(t, "", "sandbox", "cp", id+":/workspace/in.txt", dir); code != 0 {
		t.Fatalf("cp out to a dir: %d %s", code, errs)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "in.txt")); string(b) != "payload\n" {
		t.Fatalf("copied out %q", b)
	}
	if code, _, errs := cliIn(t, "", "sandbox", "cp", id+":/workspace/absent", filepath.Join(dir, "absent")); code != 1 || !strings.Contains(errs, "not found") {
		t.Fatalf("cp out of an absent file: %d %s", code, errs)
	}
	if _, err := os.Stat(filepath.Join(dir, "absent")); !os.IsNotExist(err) {
		t.Fatalf("a failed copy left a file: %v", err)
	}
	if code, _, errs := cliIn(t, "", "sandbox", "cp", src, dir); code != 2 || !strings.Contains(errs, "exactly one") {
		t.Fatalf("cp between local paths: %d %s", code, errs)
	}

	// The local runtime pauses with the cgroup freezer: a paused sandbox refuses exec, a resumed one runs.
	if code, _, errs := cliIn(t, "", "sandbox", "pause", id); code != 0 {
		t.Fatalf("pause: %d %s", code, errs)
	}
	if code, _, errs := cliIn(t, "", "sandbox", "exec", id, "--", "true"); code == 0 || !strings.Contains(errs, "paused") {
		t.Fatalf("exec in a paused sandbox: %d %s", code, errs)
	}
	if code, _, errs := cliIn(t, "", "sandbox", "resume", id); code != 0 {
		t.Fatalf("resume: %d %s", code, errs)
	}

	// A delegated token: exec works, removal needs manage.
	code, tok, errs := cliIn(t, "", "sandbox", "token", id, "--ttl", "2m")
	if code != 0 || strings.Count(tok, ".") != 1 {
		t.Fatalf("token: %d %q %s", code, tok, errs)
	}
	t.Setenv(client.EnvToken, strings.TrimSpace(tok))
	if code, out, errs := cliIn(t, "", "sandbox", "exec", id, "--", "echo", "delegated"); code != 0 || out != "delegated\n" {
		t.Fatalf("exec with a token: %d %q %s", code, out, errs)
	}
	if code, out, _ := cliIn(t, "", "sandbox", "ls", "-o", "json"); code != 0 || strings.Contains(out, other.ID) {
		t.Fatalf("ls with a token shows another session: %s", out)
	}
	if code, _, errs := cliIn(t, "", "sandbox", "rm", id); code != 1 || !strings.Contains(errs, "wrongClass") {
		t.Fatalf("rm with an execute token: %d %s", code, errs)
	}
	if code, _, errs := cliIn(t, "", "sandbox", "exec", other.ID, "--", "true"); code != exitRunFailed || !strings.Contains(errs, "wrongSession") {
		t.Fatalf("exec in another session with a token: %d %s", code, errs)
	}
	t.Setenv(client.EnvToken, "")
	if code, _, errs := cliIn(t, "", "sandbox", "token", id, "--class", "root"); code != 2 || !strings.Contains(errs, "execute and manage") {
		t.Fatalf("token --class root: %d %s", code, errs)
	}

	// A declaration this host cannot enforce: every refusal, and what to read.
	decl := filepath.Join(dir, "sb.yaml")
	os.WriteFile(decl, []byte("id: web\nimage: host\nlimits: {maxProcesses: 1000000}\nruntime: docker\nsession: {maxLifetimeSeconds: 600}\n"), 0o644)
	if code, _, errs := cliIn(t, "", "sandbox", "create", "-f", decl); code != 1 || !strings.Contains(errs, "maxProcesses") || !strings.Contains(errs, "needs dockerRuntime") || !strings.Contains(errs, "airlock capabilities") {
		t.Fatalf("refused create: %d %s", code, errs)
	}
	if code, _, errs := cliIn(t, "", "sandbox", "create", "-f", decl, "--memory", "1Gi"); code != 2 || !strings.Contains(errs, "belongs in the file") {
		t.Fatalf("-f with --memory: %d %s", code, errs)
	}

	if code, out, errs := cliIn(t, "", "sandbox", "rm", id, other.ID); code != 0 || strings.Count(out, "s-") != 2 {
		t.Fatalf("rm: %d %q %s", code, out, errs)
	}
	if code, out, _ := cliIn(t, "", "sandbox", "ls", "-o", "json"); code != 0 || strings.TrimSpace(out) != "[]" {
		t.Fatalf("ls after rm: %d %q", code, out)
	}
	if code, _, errs := cliIn(t, "", "sandbox", "--socket", sock+".absent", "ls"); code != 1 || !strings.Contains(errs, "airlock serve") {
		t.Fatalf("no daemon: %d %s", code, errs)
	}
}

func TestServeFlags(t *testing.T) {
	dir := t.TempDir()
	keys := filepath.Join(dir, "keys")
	os.WriteFile(keys, []byte("0123456789abcdef0123\n"), 0o644)
	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"--socket-mode", "0666"}, "every local user"},
		{[]string{"--socket-mode", "rw"}, "octal"},
		{[]string{"--listen", "0.0.0.0:7443"}, "not loopback"},
		{[]string{"--tls-cert", "c.pem"}, "need --listen"},
		{[]string{"--listen", "127.0.0.1:0", "--tls-cert", "c.pem"}, "go together"},
		{[]string{"--require-api-key"}, "needs --api-key-file"},
		{[]string{"--api-key-file", keys}, "chmod 600"},
		{[]string{"--log-level", "loud"}, "--log-level"},
		{[]string{"--templates", filepath.Join(dir, "absent.yaml")}, "absent.yaml"},
	} {
		code, _, errs := serverIn(t, append([]string{"serve", "--socket", filepath.Join(dir, "s.sock"), "--signing-key", filepath.Join(dir, "k")}, tc.args...)...)
		if code != cli.ExitUsage || !strings.Contains(errs, tc.err) {
			t.Errorf("serve %v: %d %s; want usage error with %q", tc.args, code, errs, tc.err)
		}
	}
}
