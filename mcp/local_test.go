package mcp_test

import (
	"context"
	"encoding/base64"
	"net"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/mcp"
	"github.com/airlock-sandbox/airlock/runcode"
	"github.com/airlock-sandbox/airlock/runcode/runcodetest"
	"github.com/airlock-sandbox/airlock/sandbox"
)

func liveSessions(t *testing.T, b sandbox.Backend) int {
	t.Helper()
	list, err := b.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return len(list)
}

func TestLocalRunCode(t *testing.T) {
	b := runcodetest.Backend(t, agentBin)
	s := mcp.New(b, mcp.Options{Logger: quiet})
	defer s.Close(context.Background())
	cs := connect(t, s)
	tests := []struct {
		name     string
		args     map[string]any
		text     string // exact
		exit     int
		timedOut bool
	}{
		{name: "python", args: map[string]any{"language": "python", "code": "print(6*7)"}, text: "Exit code: 0\n\n--- stdout ---\n42\n"},
		{name: "python3 alias", args: map[string]any{"language": "python3", "code": "import sys; sys.stderr.write('e')"}, text: "Exit code: 0\n\n--- stderr ---\ne\n"},
		{name: "node", args: map[string]any{"language": "node", "code": "console.log('hi from', 'node')"}, text: "Exit code: 0\n\n--- stdout ---\nhi from node\n"},
		{name: "js alias", args: map[string]any{"language": "js", "code": "process.exit(5)"}, text: "Exit code: 5\n", exit: 5},
		{name: "bash", args: map[string]any{"language": "bash", "code": "echo out; echo err >&2"}, text: "Exit code: 0\n\n--- stdout ---\nout\n--- stderr ---\nerr\n"},
		{name: "shell alias non-zero", args: map[string]any{"language": "shell", "code": "exit 3"}, text: "Exit code: 3\n", exit: 3},
		{name: "stdin", args: map[string]any{"language": "bash", "code": "tr a-z A-Z", "stdin": "shout"}, text: "Exit code: 0\n\n--- stdout ---\nSHOUT\n"},
		{name: "timeout", args: map[string]any{"language": "python", "code": "import time\nprint('tick', flush=True)\ntime.sleep(60)", "timeout_seconds": 1},
			text: "Exit code: 124\n\n--- stdout ---\ntick\n\nTimed out after 1s: the program and everything it started were killed\n", exit: 124, timedOut: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := call(t, cs, "run_code", tt.args)
			if r.IsError {
				t.Fatalf("tool error: %s", text(r))
			}
			if got := text(r); got != tt.text {
				t.Errorf("text %q, want %q", got, tt.text)
			}
			res := structured[runcode.Result](t, r)
			if res.ExitCode != tt.exit || res.TimedOut != tt.timedOut || res.SandboxID == "" {
				t.Errorf("structured %+v", res)
			}
			if n := liveSessions(t, b); n != 0 {
				t.Errorf("%d sandboxes outlived run_code", n)
			}
		})
	}
}

func TestLocalRunCodeNetwork(t *testing.T) {
	b := runcodetest.Backend(t, agentBin)
	s := mcp.New(b, mcp.Options{Logger: quiet})
	defer s.Close(context.Background())
	cs := connect(t, s)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	code := "import socket\ntry:\n    socket.create_connection(('127.0.0.1', " + strings.TrimPrefix(ln.Addr().String(), "127.0.0.1:") + "), timeout=3)\n    print('connected')\nexcept OSError:\n    print('unreachable')\n"

	off := call(t, cs, "run_code", map[string]any{"language": "python", "code": code})
	if off.IsError || structured[runcode.Result](t, off).Stdout != "unreachable\n" {
		t.Fatalf("network off: %s", text(off))
	}
	on := call(t, cs, "run_code", map[string]any{"language": "python", "code": code, "network": true})
	if !b.Capabilities(t.Context()).Has(capability.PublicOnlyEgress) {
		if !on.IsError || !strings.Contains(text(on), "publicOnlyEgress") {
			t.Fatalf("network on where publicOnlyEgress is unsupported: %s", text(on))
		}
		return
	}
	if on.IsError || structured[runcode.Result](t, on).Stdout != "unreachable\n" {
		t.Fatalf("network on reached the host's loopback: %s", text(on))
	}
}

func TestLocalSessionTools(t *testing.T) {
	b := runcodetest.Backend(t, agentBin)
	s := mcp.New(b, mcp.Options{Logger: quiet})
	defer s.Close(context.Background())
	cs := connect(t, s)

	cr := call(t, cs, "sandbox_create", map[string]any{"memory": "256Mi", "cpu": 0.5, "env": map[string]any{"GREETING": "hello"}})
	if cr.IsError {
		t.Fatalf("create: %s", text(cr))
	}
	type info struct {
		SessionID string `json:"session_id"`
		Workdir   string `json:"workdir"`
		Memory    string `json:"memory"`
		CPU       string `json:"cpu"`
	}
	in := structured[info](t, cr)
	if in.SessionID == "" || in.Workdir != "/workspace" || in.Memory != "256Mi" || in.CPU != "0.5" {
		t.Fatalf("create: %+v", in)
	}
	id := in.SessionID

	w := call(t, cs, "sandbox_write_file", map[string]any{"session_id": id, "path": "pkg/data.txt", "content": "line1\n"})
	if w.IsError {
		t.Fatalf("write: %s", text(w))
	}
	bin := []byte{0, 1, 2, 0xff, 0xfe}
	w = call(t, cs, "sandbox_write_file", map[string]any{"session_id": id, "path": "/tmp/blob", "content": base64.StdEncoding.EncodeToString(bin), "encoding": "base64"})
	if w.IsError {
		t.Fatalf("write base64: %s", text(w))
	}
	w = call(t, cs, "sandbox_write_file", map[string]any{"session_id": id, "path": "run.sh", "content": "#!/bin/sh\necho ran $GREETING\n", "mode": "755"})
	if w.IsError {
		t.Fatalf("write script: %s", text(w))
	}

	// State persists across execs of one session.
	ex := call(t, cs, "sandbox_exec", map[string]any{"session_id": id, "command": "cat pkg/data.txt; echo line2 >> pkg/data.txt; ./run.sh; od -An -tx1 /tmp/blob | tr -d ' \\n'"})
	if ex.IsError {
		t.Fatalf("exec: %s", text(ex))
	}
	if r := structured[runcode.Result](t, ex); r.ExitCode != 0 || r.Stdout != "line1\nran hello\n000102fffe" {
		t.Fatalf("exec: %s", text(ex))
	}
	ex = call(t, cs, "sandbox_exec", map[string]any{"session_id": id, "command": "pwd; cat; exit 4", "cwd": "pkg", "stdin": "piped", "env": map[string]any{"X": "1"}})
	if r := structured[runcode.Result](t, ex); r.ExitCode != 4 || r.Stdout != "/workspace/pkg\npiped" {
		t.Fatalf("exec cwd/stdin/exit: %s", text(ex))
	}
	ex = call(t, cs, "sandbox_exec", map[string]any{"session_id": id, "command": "sleep 60", "timeout_seconds": 1})
	if r := structured[runcode.Result](t, ex); !r.TimedOut || !strings.Contains(text(ex), "Timed out after 1s") {
		t.Fatalf("exec timeout: %s", text(ex))
	}

	// A background process outlives its call, its output read in parts (issue 25).
	bg := call(t, cs, "sandbox_exec", map[string]any{"session_id": id, "background": true,
		"command": "for i in 1 2 3; do echo tick $i; done; echo ready >&2; exec sleep 600"})
	pid := structured[struct {
		ProcessID string `json:"process_id"`
	}](t, bg).ProcessID
	if bg.IsError || pid == "" || !strings.Contains(text(bg), "sandbox_process_output") {
		t.Fatalf("background exec: %s", text(bg))
	}
	type procOut struct {
		Running  bool   `json:"running"`
		ExitCode *int   `json:"exit_code"`
		Stdout   string `json:"stdout"`
		Stderr   string `json:"stderr"`
	}
	var stdout, stderr string
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(stderr, "ready") {
		r := call(t, cs, "sandbox_process_output", map[string]any{"session_id": id, "process_id": pid})
		o := structured[procOut](t, r)
		if r.IsError || !o.Running || o.ExitCode != nil {
			t.Fatalf("output of a running process: %s", text(r))
		}
		stdout, stderr = stdout+o.Stdout, stderr+o.Stderr
		if time.Now().After(deadline) {
			t.Fatalf("no ready line within a minute: %q %q", stdout, stderr)
		}
	}
	if stdout != "tick 1\ntick 2\ntick 3\n" {
		t.Errorf("stdout read in parts: %q", stdout)
	}
	if r := call(t, cs, "sandbox_process_output", map[string]any{"session_id": id, "process_id": pid}); !strings.Contains(text(r), "no new output") {
		t.Errorf("a second read with nothing new: %s", text(r))
	}
	for i := range 2 { // idempotent
		if r := call(t, cs, "sandbox_process_kill", map[string]any{"session_id": id, "process_id": pid}); r.IsError {
			t.Fatalf("kill %d: %s", i, text(r))
		}
	}
	if r := call(t, cs, "sandbox_process_output", map[string]any{"session_id": id, "process_id": pid}); !r.IsError || !strings.Contains(text(r), "killed") {
		t.Errorf("output of a killed process: %s", text(r))
	}

	rd := call(t, cs, "sandbox_read_file", map[string]any{"session_id": id, "path": "/workspace/pkg/data.txt"})
	type readOut struct {
		Content   string `json:"content"`
		Encoding  string `json:"encoding"`
		Size      int64  `json:"size"`
		Truncated bool   `json:"truncated"`
	}
	if r := structured[readOut](t, rd); rd.IsError || r.Content != "line1\nline2\n" || r.Encoding != "utf-8" || r.Size != 12 || r.Truncated {
		t.Fatalf("read: %s %+v", text(rd), r)
	}
	rd = call(t, cs, "sandbox_read_file", map[string]any{"session_id": id, "path": "/tmp/blob"})
	if r := structured[readOut](t, rd); r.Encoding != "base64" || r.Content != base64.StdEncoding.EncodeToString(bin) {
		t.Fatalf("read binary: %+v", r)
	}
	rd = call(t, cs, "sandbox_read_file", map[string]any{"session_id": id, "path": "pkg/data.txt", "max_bytes": 3})
	if r := structured[readOut](t, rd); r.Content != "lin" || !r.Truncated || r.Size != 12 {
		t.Fatalf("read truncated: %+v", r)
	}
	for _, bad := range []map[string]any{
		{"session_id": id, "path": "missing.txt"},
		{"session_id": id, "path": "pkg"},
		{"session_id": id, "path": "../etc/passwd"},
	} {
		if r := call(t, cs, "sandbox_read_file", bad); !r.IsError {
			t.Errorf("read %v succeeded: %s", bad, text(r))
		}
	}
	if r := call(t, cs, "sandbox_write_file", map[string]any{"session_id": id, "path": "x", "content": "!", "encoding": "base64"}); !r.IsError {
		t.Errorf("invalid base64 accepted")
	}
	if r := call(t, cs, "sandbox_write_file", map[string]any{"session_id": id, "path": "x", "content": "", "mode": "999"}); !r.IsError || !strings.Contains(text(r), "octal") {
		t.Errorf("mode 999: %s", text(r))
	}

	ls := call(t, cs, "sandbox_list", nil)
	if !strings.Contains(text(ls), id) {
		t.Fatalf("list lacks %s: %s", id, text(ls))
	}
	if n := liveSessions(t, b); n != 1 {
		t.Fatalf("%d live sandboxes, want 1", n)
	}
	tr := call(t, cs, "sandbox_terminate", map[string]any{"session_id": id})
	if tr.IsError {
		t.Fatalf("terminate: %s", text(tr))
	}
	if n := liveSessions(t, b); n != 0 {
		t.Fatalf("%d sandboxes after terminate", n)
	}
	// Advertised idempotent: a second terminate succeeds (issue 25).
	if tr := call(t, cs, "sandbox_terminate", map[string]any{"session_id": id}); tr.IsError || !strings.Contains(text(tr), "already terminated") {
		t.Fatalf("second terminate: %s", text(tr))
	}
	if r := call(t, cs, "sandbox_exec", map[string]any{"session_id": id, "command": "true"}); !r.IsError {
		t.Fatal("exec on a terminated session succeeded")
	}
	if !strings.Contains(text(call(t, cs, "sandbox_list", nil)), "No live sandbox sessions") {
		t.Fatal("list after terminate is not empty")
	}
}

// TestLocalCloseTerminatesSessions: sessions created through MCP end with the server.
func TestLocalCloseTerminatesSessions(t *testing.T) {
	b := runcodetest.Backend(t, agentBin)
	s := mcp.New(b, mcp.Options{Logger: quiet, MaxSessions: 2})
	cs := connect(t, s)
	for range 2 {
		if r := call(t, cs, "sandbox_create", nil); r.IsError {
			t.Fatalf("create: %s", text(r))
		}
	}
	if r := call(t, cs, "sandbox_create", nil); !r.IsError || !strings.Contains(text(r), "sandbox_terminate") {
		t.Fatalf("a third session over MaxSessions 2: %s", text(r))
	}
	if n := liveSessions(t, b); n != 2 {
		t.Fatalf("%d live sandboxes, want 2", n)
	}
	if err := s.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := liveSessions(t, b); n != 0 {
		t.Fatalf("%d sandboxes outlived the server", n)
	}
	if r := call(t, cs, "sandbox_create", nil); !r.IsError {
		t.Fatal("create after Close succeeded")
	}
}

// TestLocalHTTP drives the streamable HTTP transport with the go-sdk client; shutting the
// listener down terminates the sessions created through it.
func TestLocalHTTP(t *testing.T) {
	b := runcodetest.Backend(t, agentBin)
	s := mcp.New(b, mcp.Options{Logger: quiet})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.ServeListener(ctx, ln) }()

	c := sdk.NewClient(&sdk.Implementation{Name: "airlock-test", Version: "1"}, nil)
	cs, err := c.Connect(t.Context(), &sdk.StreamableClientTransport{Endpoint: "http://" + ln.Addr().String() + mcp.HTTPPath}, nil)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	r := call(t, cs, "run_code", map[string]any{"language": "node", "code": "console.log(process.version.startsWith('v'))"})
	if text(r) != "Exit code: 0\n\n--- stdout ---\ntrue\n" {
		t.Errorf("run_code over HTTP: %s", text(r))
	}
	if r := call(t, cs, "sandbox_create", nil); r.IsError {
		t.Fatalf("create over HTTP: %s", text(r))
	}
	if n := liveSessions(t, b); n != 1 {
		t.Fatalf("%d live sandboxes, want 1", n)
	}
	cancel()
	if err := <-served; err != nil {
		t.Fatalf("ServeListener: %v", err)
	}
	cs.Close()
	if n := liveSessions(t, b); n != 0 {
		t.Fatalf("%d sandboxes outlived the HTTP server", n)
	}
}
