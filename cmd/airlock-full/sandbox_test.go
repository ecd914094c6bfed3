package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/capability"
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

// TestSandboxFeatureCommands: stats, preview, snapshot, snapshots, fork against a real daemon.
func TestSandboxFeatureCommands(t *testing.T) {
	sock := startServe(t)
	t.Setenv(client.EnvSocket, sock)
	t.Setenv(client.EnvToken, "")
	t.Setenv(client.EnvAPIKey, "")
	t.Setenv(client.EnvURL, "")
	ctx := context.Background()
	c, err := client.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	dir := t.TempDir()
	decl := filepath.Join(dir, "web.yaml")
	os.WriteFile(decl, []byte("id: web\nimage: host\npreviewPorts: [8080]\nsession: {maxLifetimeSeconds: 600}\n"), 0o644)
	code, out, errs := cliIn(t, "", "sandbox", "create", "-f", decl)
	if code != 0 {
		t.Fatalf("create: %d %s", code, errs)
	}
	id := strings.TrimSpace(out)
	defer c.Sandbox(id).Terminate(ctx)
	if code, _, errs := cliIn(t, "", "sandbox", "exec", id, "--sh", "mkdir site && echo hello from web > site/index.html && echo v1 > state.txt"); code != 0 {
		t.Fatalf("exec: %d %s", code, errs)
	}
	if _, err := c.Sandbox(id).StartProcess(ctx, client.ProcessRequest{ExecRequest: sandbox.ExecRequest{
		Argv: []string{"python3", "-m", "http.server", "8080", "--bind", "127.0.0.1", "--directory", "site"}, Timeout: 10 * time.Minute,
	}}); err != nil {
		t.Fatal(err)
	}
	probe := `for i in $(seq 400); do python3 -c 'import urllib.request; urllib.request.urlopen("http://127.0.0.1:8080/")' 2>/dev/null && exit 0; sleep 0.05; done; exit 1`
	if code, _, errs := cliIn(t, "", "sandbox", "exec", id, "--sh", probe); code != 0 {
		t.Fatalf("the web server never answered: %d %s", code, errs)
	}

	// preview: the URL opens the sandbox's page in a browser (a cookie jar follows the redirect).
	code, out, errs = cliIn(t, "", "sandbox", "preview", id, "8080")
	if code != 0 || !strings.HasPrefix(out, "http://127.0.0.1:") {
		t.Fatalf("preview: %d %q %s", code, out, errs)
	}
	jar, _ := cookiejar.New(nil)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Jar: jar, Transport: tr}).Get(strings.TrimSpace(out))
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(page) != "hello from web\n" {
		t.Fatalf("opening the preview: %d %q", resp.StatusCode, page)
	}
	code, out, _ = cliIn(t, "", "sandbox", "preview", id, "8080", "--ttl", "2m", "-o", "json")
	var pv sandbox.PreviewInfo
	if code != 0 || json.Unmarshal([]byte(out), &pv) != nil || pv.Port != 8080 || pv.Token == "" || time.Until(pv.ExpiresAt) > 2*time.Minute+time.Second {
		t.Fatalf("preview -o json: %d %q", code, out)
	}
	for _, tc := range []struct {
		args []string
		code int
		err  string
	}{
		{[]string{id, "8081"}, 1, "previewPorts"},
		{[]string{id, "http"}, 2, "TCP port"},
		{[]string{id, "8080", "--ttl", "-1s"}, 2, "--ttl"},
		{[]string{id, "8080", "--ttl", "48h"}, 1, "ttl"},
	} {
		if code, _, errs := cliIn(t, "", append([]string{"sandbox", "preview"}, tc.args...)...); code != tc.code || !strings.Contains(errs, tc.err) {
			t.Errorf("preview %v: %d %s; want %d %q", tc.args, code, errs, tc.code, tc.err)
		}
	}

	// stats: as the daemon's capability set says.
	caps, err := c.Capabilities(ctx)
	if err != nil {
		t.Fatal(err)
	}
	code, out, errs = cliIn(t, "", "sandbox", "stats", id)
	if caps.Entries[capability.Stats].Supported {
		if code != 0 || !strings.Contains(out, "memory") || !strings.Contains(out, "cpu") {
			t.Errorf("stats: %d %q %s", code, out, errs)
		}
		code, out, _ = cliIn(t, "", "sandbox", "stats", id, "-o", "json")
		var st sandbox.Stats
		if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.MemoryBytes <= 0 {
			t.Errorf("stats -o json: %d %q", code, out)
		}
	} else if code != 1 || !strings.Contains(errs, "unsupported: stats on local") {
		t.Errorf("stats where the platform has none: %d %q %s", code, out, errs)
	}

	// snapshot, snapshots, fork, snapshots rm. The daemon's store is the host's: unique names.
	name := fmt.Sprintf("cli-test-%d", time.Now().UnixNano())
	if code, out, errs := cliIn(t, "", "sandbox", "snapshot", id, name); code != 0 || out != name+"\n" {
		t.Fatalf("snapshot: %d %q %s", code, out, errs)
	}
	defer c.DeleteSnapshot(ctx, name)
	if code, _, errs := cliIn(t, "", "sandbox", "snapshot", id, name); code != 1 || !strings.Contains(errs, "already exists") {
		t.Errorf("snapshot twice: %d %s", code, errs)
	}
	if code, _, errs := cliIn(t, "", "sandbox", "snapshot", id); code != 2 {
		t.Errorf("snapshot without a name: %d %s", code, errs)
	}
	code, out, errs = cliIn(t, "", "sandbox", "fork", id, "--count", "2")
	kids := strings.Fields(out)
	if code != 0 || len(kids) != 2 {
		t.Fatalf("fork: %d %q %s", code, out, errs)
	}
	for _, k := range kids {
		defer c.Sandbox(k).Terminate(ctx)
		if code, out, errs := cliIn(t, "", "sandbox", "exec", k, "--", "cat", "state.txt"); code != 0 || out != "v1\n" {
			t.Errorf("exec in fork %s: %d %q %s", k, code, out, errs)
		}
	}
	if code, _, errs := cliIn(t, "", "sandbox", "fork", id, "--count", "0"); code != 2 || !strings.Contains(errs, "at least 1") {
		t.Errorf("fork --count 0: %d %s", code, errs)
	}
	kid, err := c.Get(ctx, kids[0])
	if err != nil {
		t.Fatal(err)
	}
	forkSnap := kid.Spec.Image.Snapshot
	defer c.DeleteSnapshot(ctx, forkSnap)
	code, out, _ = cliIn(t, "", "sandbox", "snapshots")
	if code != 0 || !strings.HasPrefix(out, "NAME") || !strings.Contains(out, name) || !strings.Contains(out, forkSnap) {
		t.Fatalf("snapshots: %d\n%s", code, out)
	}
	code, out, _ = cliIn(t, "", "sandbox", "snapshots", "-o", "json")
	var list []sandbox.SnapshotInfo
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || !slices.ContainsFunc(list, func(s sandbox.SnapshotInfo) bool { return s.Name == name && s.SessionID == id && s.Base == "host" }) {
		t.Fatalf("snapshots -o json: %d %q", code, out)
	}
	if code, out, errs := cliIn(t, "", "sandbox", "snapshots", "rm", name, forkSnap); code != 0 || out != name+"\n"+forkSnap+"\n" {
		t.Fatalf("snapshots rm: %d %q %s", code, out, errs)
	}
	if code, _, errs := cliIn(t, "", "sandbox", "snapshots", "rm", name); code != 1 || !strings.Contains(errs, "not found") {
		t.Errorf("snapshots rm twice: %d %s", code, errs)
	}
	if code, out, _ := cliIn(t, "", "sandbox", "snapshots", "-o", "json"); code != 0 || strings.Contains(out, name) {
		t.Errorf("snapshots after rm: %d %q", code, out)
	}
	if code, _, errs := cliIn(t, "", "sandbox", "rm", id, kids[0], kids[1]); code != 0 {
		t.Fatalf("rm: %d %s", code, errs)
	}
}
