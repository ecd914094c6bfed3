package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/cli"
	"github.com/airlock-sandbox/airlock/internal/servercmd"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/mcp"
	"github.com/airlock-sandbox/airlock/platform"
	"github.com/airlock-sandbox/airlock/runcode"
)

func TestMCPCommandUsage(t *testing.T) {
	for _, tt := range []struct {
		args []string
		has  string
		env  string // $AIRLOCK_POOL_MEMORY, "" for unset
		file string // the config file's text, "" for none
	}{
		{[]string{"--http", "0.0.0.0:0"}, "not a loopback address", "", ""},
		{[]string{"--log-level", "loud"}, "--log-level", "", ""},
		{[]string{"--max-sessions", "0"}, "--max-sessions", "", ""},
		{[]string{"--max-runs", "0"}, "--max-runs", "", ""},
		{[]string{"--pool", "-1"}, "--pool", "", ""},
		{[]string{"--pool", "4", "--pool-max", "2"}, "--pool-max", "", ""},
		{[]string{"--pool", "1", "--pool-idle", "10ms"}, "--pool-idle", "", ""},
		{[]string{"--pool-memory", "lots"}, `--pool-memory: invalid: pool memory "lots"`, "", ""},
		{[]string{"--pool-memory", "-1Mi"}, "0 (no bound) or more", "", ""},
		{[]string{"--pool-memory", "1.5"}, "allowed is a whole number of bytes", "", ""},
		{[]string{"--image", ""}, "--image", "", ""},
		{[]string{"extra"}, "takes no arguments", "", ""},
		{nil, "$AIRLOCK_POOL_MEMORY: invalid", "lots", ""},
		{nil, "config.yaml: invalid: pool memory \"lots\"", "", "pool:\n  memory: lots\n"},
		{nil, `unknown field "size"`, "", "pool:\n  size: 3\n"},
	} {
		t.Setenv(runcode.EnvPoolMemory, tt.env) // restored after the test
		if tt.env == "" {
			os.Unsetenv(runcode.EnvPoolMemory)
		}
		t.Setenv(platform.EnvConfig, "")
		if tt.file != "" {
			p := filepath.Join(t.TempDir(), "config.yaml")
			if err := os.WriteFile(p, []byte(tt.file), 0o600); err != nil {
				t.Fatal(err)
			}
			t.Setenv(platform.EnvConfig, p)
		}
		cmd := servercmd.NewMCPCmd(&cli.Globals{Output: cli.OutputText})
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		code, err := execCmd(t, cmd, tt.args)
		if code != cli.ExitUsage || err == nil || !strings.Contains(err.Error(), tt.has) {
			t.Errorf("%v: exit %d, %v; want exit %d mentioning %q", tt.args, code, err, cli.ExitUsage, tt.has)
		}
	}
}

// TestMCPCommandStdio serves the command over pipes to a go-sdk client; when the client
// goes away the command returns, and the session it left is terminated.
func TestMCPCommandStdio(t *testing.T) {
	testutil.RequireRoot(t)
	env := newRuntimeEnv(t)
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	cmd := servercmd.NewMCPCmd(&cli.Globals{Output: cli.OutputText})
	cmd.SetIn(inR)
	cmd.SetOut(outW)
	var stderr testutil.SyncBuffer
	cmd.SetErr(&stderr)
	done := make(chan error, 1)
	go func() {
		_, err := execCmd(t, cmd, env.flags())
		outW.Close()
		done <- err
	}()

	c := sdk.NewClient(&sdk.Implementation{Name: "airlock-test", Version: "1"}, nil)
	cs, err := c.Connect(t.Context(), &sdk.IOTransport{Reader: outR, Writer: inW}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := cs.CallTool(t.Context(), &sdk.CallToolParams{Name: "run_code", Arguments: map[string]any{"language": "python", "code": "print('over stdio')"}})
	if err != nil || textOf(r) != "Exit code: 0\n\n--- stdout ---\nover stdio\n" {
		t.Fatalf("run_code: %v %s", err, textOf(r))
	}
	r, err = cs.CallTool(t.Context(), &sdk.CallToolParams{Name: "sandbox_create", Arguments: map[string]any{}})
	if err != nil || r.IsError {
		t.Fatalf("sandbox_create: %v %s", err, textOf(r))
	}
	cs.Close() // closes the command's stdin
	if err := <-done; err != nil {
		t.Fatalf("airlock mcp: %v\n%s", err, stderr.String())
	}
	// newRuntimeEnv's cleanup fails the test for the session if it survived.
}

// TestMCPCommandPool: with --pool the command fills a warm pool, run_code claims from it, and
// when the client goes away every pooled sandbox is terminated with the server.
func TestMCPCommandPool(t *testing.T) {
	testutil.RequireRoot(t)
	env := newRuntimeEnv(t)
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	cmd := servercmd.NewMCPCmd(&cli.Globals{Output: cli.OutputText})
	cmd.SetIn(inR)
	cmd.SetOut(outW)
	var stderr testutil.SyncBuffer
	cmd.SetErr(&stderr)
	done := make(chan error, 1)
	go func() {
		_, err := execCmd(t, cmd, append(env.flags(), "--pool", "2"))
		outW.Close()
		done <- err
	}()
	c := sdk.NewClient(&sdk.Implementation{Name: "airlock-test", Version: "1"}, nil)
	cs, err := c.Connect(t.Context(), &sdk.IOTransport{Reader: outR, Writer: inW}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The pool fills in the background: its sandboxes appear in the state dir.
	deadline := time.Now().Add(30 * time.Second)
	for {
		entries, _ := filepath.Glob(filepath.Join(env.stateDir, "s-*", "session.json"))
		if len(entries) >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pool did not fill (%d sandboxes)\n%s", len(entries), stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for range 3 {
		r, err := cs.CallTool(t.Context(), &sdk.CallToolParams{Name: "run_code", Arguments: map[string]any{"language": "python", "code": "print('pooled')"}})
		if err != nil || textOf(r) != "Exit code: 0\n\n--- stdout ---\npooled\n" {
			t.Fatalf("run_code: %v %s", err, textOf(r))
		}
	}
	cs.Close()
	if err := <-done; err != nil {
		t.Fatalf("airlock mcp: %v\n%s", err, stderr.String())
	}
	// newRuntimeEnv's cleanup fails the test for any sandbox left, pooled or claimed.
}

// TestMCPCommandHTTP serves the command on a loopback port it picks, drives it with the
// go-sdk streamable client, and stops it like a signal would (its context ends).
func TestMCPCommandHTTP(t *testing.T) {
	testutil.RequireRoot(t)
	env := newRuntimeEnv(t)
	stderr := &urlWaiter{found: make(chan string, 1)}
	cmd := servercmd.NewMCPCmd(&cli.Globals{Output: cli.OutputText})
	cmd.SetOut(io.Discard)
	cmd.SetErr(stderr)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd.SetContext(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := execCmd(t, cmd, append([]string{"--http", "127.0.0.1:0"}, env.flags()...))
		done <- err
	}()
	var url string
	select {
	case url = <-stderr.found:
	case err := <-done:
		t.Fatalf("airlock mcp --http returned before serving: %v\n%s", err, stderr.String())
	}
	if !strings.HasSuffix(url, mcp.HTTPPath) {
		t.Fatalf("served at %s, want the path %s", url, mcp.HTTPPath)
	}
	c := sdk.NewClient(&sdk.Implementation{Name: "airlock-test", Version: "1"}, nil)
	cs, err := c.Connect(t.Context(), &sdk.StreamableClientTransport{Endpoint: url}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := cs.CallTool(t.Context(), &sdk.CallToolParams{Name: "run_code", Arguments: map[string]any{"language": "bash", "code": "echo over http; exit 2"}})
	if err != nil || textOf(r) != "Exit code: 2\n\n--- stdout ---\nover http\n" {
		t.Fatalf("run_code: %v %s", err, textOf(r))
	}
	if r, err := cs.CallTool(t.Context(), &sdk.CallToolParams{Name: "sandbox_create", Arguments: map[string]any{}}); err != nil || r.IsError {
		t.Fatalf("sandbox_create: %v %s", err, textOf(r))
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("airlock mcp --http: %v\n%s", err, stderr.String())
	}
	cs.Close()
}

func textOf(r *sdk.CallToolResult) string {
	if r == nil {
		return "<nil result>"
	}
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// urlWaiter is a stderr that reports the URL airlock mcp --http announces.
type urlWaiter struct {
	testutil.SyncBuffer
	found chan string
	once  sync.Once
}

var servingRE = regexp.MustCompile(`serving streamable HTTP on (http://\S+)`)

func (u *urlWaiter) Write(p []byte) (int, error) {
	n, err := u.SyncBuffer.Write(p)
	if m := servingRE.FindStringSubmatch(u.String()); m != nil {
		u.once.Do(func() { u.found <- m[1] })
	}
	return n, err
}
