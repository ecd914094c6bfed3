package runcode_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/testutil"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/runcode"
	"github.com/airlock-sandbox/airlock/runcode/runcodetest"
	"github.com/airlock-sandbox/airlock/sandbox"
)

var agentBin string

func TestMain(m *testing.M) { os.Exit(testutil.MainWithAgent(m, &agentBin)) }

func TestLocalLanguages(t *testing.T) {
	b := runcodetest.Backend(t, agentBin)
	tests := []struct {
		name       string
		req        runcode.Request
		exit       int
		stdout     string
		stderrHas  string
		timedOut   bool
		exitStatus int
	}{
		{name: "python", req: runcode.Request{Language: "python", Code: "import sys\nprint(2+2)\nprint(sys.version_info[0])"}, stdout: "4\n3\n"},
		{name: "py alias", req: runcode.Request{Language: "py", Code: "print('alias')"}, stdout: "alias\n"},
		{name: "node", req: runcode.Request{Language: "node", Code: "console.log([1,2,3].map(x => x*2).join(','))"}, stdout: "2,4,6\n"},
		{name: "javascript alias", req: runcode.Request{Language: "javascript", Code: "process.stdout.write(typeof require)"}, stdout: "function"},
		{name: "bash", req: runcode.Request{Language: "bash", Code: "set -e\nx=$((6*7))\necho \"$x $BASH_VERSINFO\" | cut -d' ' -f1\npwd"}, stdout: "42\n/workspace\n"},
		{name: "sh alias runs bash", req: runcode.Request{Language: "sh", Code: "[[ 1 == 1 ]] && echo bashism"}, stdout: "bashism\n"},
		{name: "python non-zero exit", req: runcode.Request{Language: "python", Code: "import sys\nprint('before')\nsys.stderr.write('bad input\\n')\nsys.exit(3)"},
			exit: 3, exitStatus: 3, stdout: "before\n", stderrHas: "bad input"},
		{name: "python exception", req: runcode.Request{Language: "python", Code: "raise ValueError('nope')"},
			exit: 1, exitStatus: 1, stderrHas: "ValueError: nope"},
		{name: "node throw", req: runcode.Request{Language: "node", Code: "throw new Error('kaput')"},
			exit: 1, exitStatus: 1, stderrHas: "Error: kaput"},
		{name: "bash exit", req: runcode.Request{Language: "bash", Code: "echo out; echo err >&2; exit 42"},
			exit: 42, exitStatus: 42, stdout: "out\n", stderrHas: "err"},
		{name: "stdin", req: runcode.Request{Language: "python", Code: "import sys\nprint(sys.stdin.read().upper())", Stdin: "hello from stdin"},
			stdout: "HELLO FROM STDIN\n"},
		{name: "no stdin is closed, not blocking", req: runcode.Request{Language: "bash", Code: "cat; echo done", TimeoutSeconds: 20},
			stdout: "done\n"},
		{name: "files", req: runcode.Request{Language: "python", Code: "print(open('data/in.txt').read()); print(open('/tmp/abs.txt').read())",
			Files: map[string][]byte{"data/in.txt": []byte("relative"), "/tmp/abs.txt": []byte("absolute")}}, stdout: "relative\nabsolute\n"},
		{name: "timeout kills the whole tree", req: runcode.Request{Language: "bash", Code: "echo started\n(sleep 100; echo escaped) &\nsetsid sleep 100 &\nsleep 100", TimeoutSeconds: 1},
			exit: 124, exitStatus: 124, stdout: "started\n", timedOut: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := runcode.Run(t.Context(), b, tt.req, runcode.Options{})
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if res.ExitCode != tt.exit || res.ExitStatus() != tt.exitStatus || res.TimedOut != tt.timedOut {
				t.Errorf("exit %d status %d timedOut %v, want %d %d %v\n%s", res.ExitCode, res.ExitStatus(), res.TimedOut, tt.exit, tt.exitStatus, tt.timedOut, res.Text())
			}
			if res.Stdout != tt.stdout {
				t.Errorf("stdout %q, want %q", res.Stdout, tt.stdout)
			}
			if tt.stderrHas != "" && !strings.Contains(res.Stderr, tt.stderrHas) {
				t.Errorf("stderr %q lacks %q", res.Stderr, tt.stderrHas)
			}
			if tt.timedOut && !strings.Contains(res.Text(), "Timed out after 1s") {
				t.Errorf("text lacks the timeout line:\n%s", res.Text())
			}
			if res.SandboxID == "" {
				t.Error("no sandbox id")
			}
			assertNoSandboxes(t, b)
		})
	}
}

func assertNoSandboxes(t *testing.T, b sandbox.Backend) {
	t.Helper()
	list, err := b.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list {
		t.Errorf("sandbox %s outlived its run", s.SandboxID)
	}
}

// TestLocalNetworkOff: with network off the code cannot reach even a listener on the host's
// loopback, and sees no interface but its own lo.
func TestLocalNetworkOff(t *testing.T) {
	b := runcodetest.Backend(t, agentBin)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	code := fmt.Sprintf(`import os, socket
print(sorted(os.listdir('/sys/class/net')))
try:
    socket.create_connection(('127.0.0.1', %d), timeout=3)
    print('connected')
except OSError as e:
    print('refused', type(e).__name__)
`, port)
	res, err := runcode.Run(t.Context(), b, runcode.Request{Language: "python", Code: code}, runcode.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 || !strings.HasPrefix(res.Stdout, "['lo']\nrefused") {
		t.Fatalf("network off reached the host or has interfaces:\n%s", res.Text())
	}
}

// TestLocalNetworkOn: on a host that cannot enforce public-only egress, network: true is
// refused naming the capability; where it can, loopback and private addresses stay out of reach.
func TestLocalNetworkOn(t *testing.T) {
	b := runcodetest.Backend(t, agentBin)
	set := b.Capabilities(t.Context())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	code := fmt.Sprintf(`import socket
try:
    socket.create_connection(('127.0.0.1', %d), timeout=3)
    print('connected')
except OSError as e:
    print('refused')
`, ln.Addr().(*net.TCPAddr).Port)
	res, err := runcode.Run(t.Context(), b, runcode.Request{Language: "python", Code: code, Network: true}, runcode.Options{})
	if !set.Has(capability.PublicOnlyEgress) {
		if err == nil {
			t.Fatalf("network: true ran although publicOnlyEgress is unsupported here:\n%s", res.Text())
		}
		if !errors.Is(err, sandbox.ErrRefused) || !strings.Contains(err.Error(), "publicOnlyEgress") || !strings.Contains(err.Error(), set.Entries[capability.PublicOnlyEgress].Reason) {
			t.Fatalf("refusal %q does not name publicOnlyEgress and its reason", err)
		}
		assertNoSandboxes(t, b)
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if res.Stdout != "refused\n" {
		t.Fatalf("network on reached the host's loopback:\n%s", res.Text())
	}
}

func TestLocalOutputCap(t *testing.T) {
	b := runcodetest.Backend(t, agentBin)
	res, err := runcode.Run(t.Context(), b, runcode.Request{Language: "python",
		Code: "import sys\nsys.stdout.write('x' * 3000)\nsys.stderr.write('e' * 10)"}, runcode.Options{MaxOutputBytes: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Truncated || len(res.Stdout) != 1000 || res.Stderr != strings.Repeat("e", 10) {
		t.Fatalf("truncated %v, stdout %d bytes, stderr %q", res.Truncated, len(res.Stdout), res.Stderr)
	}
	if !strings.Contains(res.Text(), "Output truncated") {
		t.Fatalf("text lacks the truncation note:\n%s", res.Text())
	}
}

// TestLocalCancelTerminates: a caller that goes away mid-run leaves no sandbox behind.
func TestLocalCancelTerminates(t *testing.T) {
	b := runcodetest.Backend(t, agentBin)
	ctx, cancel := context.WithCancel(t.Context())
	started := &notifyWriter{ch: make(chan struct{}), cancel: cancel}
	_, err := runcode.Run(ctx, b, runcode.Request{Language: "bash", Code: "echo go; sleep 100", TimeoutSeconds: 120}, runcode.Options{Stdout: started})
	if err == nil {
		t.Fatal("a cancelled run reported success")
	}
	assertNoSandboxes(t, b)
}

// notifyWriter cancels the run once the program has printed something.
type notifyWriter struct {
	ch     chan struct{}
	cancel context.CancelFunc
}

func (w *notifyWriter) Write(p []byte) (int, error) {
	w.cancel()
	return len(p), nil
}
