package runcode_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/runcode"
	"github.com/airlock-sandbox/airlock/runcode/runcodetest"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/sandbox/prestarted"
)

// holdPool keeps the sandboxes runs discard, so a test can look inside them afterwards; and,
// with killFirst, removes the waiting interpreters of a claimed sandbox before the run gets it.
type holdPool struct {
	*local.Pool
	b         *local.Backend
	killFirst bool

	mu   sync.Mutex
	held []string
}

type processLister interface {
	Processes(ctx context.Context) ([]client.Process, error)
	RemoveProcess(ctx context.Context, id string) error
}

func (h *holdPool) ClaimForRun(ctx context.Context) (*sandbox.Session, prestarted.Interpreters, error) {
	sess, pre, err := h.Pool.ClaimForRun(ctx)
	if err != nil || !h.killFirst {
		return sess, pre, err
	}
	a, err := h.b.Connect(ctx, sess.ID)
	if err != nil {
		return nil, nil, err
	}
	defer a.Close()
	procs, err := a.(processLister).Processes(ctx)
	if err != nil {
		return nil, nil, err
	}
	for _, p := range procs {
		if err := a.(processLister).RemoveProcess(ctx, p.ID); err != nil {
			return nil, nil, err
		}
	}
	return sess, pre, nil
}

func (h *holdPool) Discard(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.held = append(h.held, id)
}

// release terminates every held sandbox.
func (h *holdPool) release(t *testing.T) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, id := range h.held {
		if err := h.b.Terminate(context.Background(), id); err != nil {
			t.Error(err)
		}
	}
	h.held = nil
}

func (h *holdPool) last() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.held[len(h.held)-1]
}

// processesIn lists the processes in a sandbox other than the ps that lists them, and the
// background processes its agent still holds running.
func processesIn(t *testing.T, b *local.Backend, id string) (ps string, running int) {
	t.Helper()
	a, err := b.Connect(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var out strings.Builder
	res, err := a.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"ps", "-e", "-o", "user=,args="}, Timeout: 10 * time.Second}, &out, io.Discard)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("ps: %v %+v", err, res)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if !strings.HasSuffix(l, "ps -e -o user=,args=") {
			lines = append(lines, l)
		}
	}
	procs, err := a.(processLister).Processes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		if p.Running {
			running++
		}
	}
	return strings.Join(lines, "\n"), running
}

// settledProcessesIn is processesIn once nothing is left, or after 10 s: a killed process is a
// zombie until the agent (PID 1) reaps it, which may come just after the answer.
func settledProcessesIn(t *testing.T, b *local.Backend, id string) (ps string, running int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ps, running = processesIn(t, b, id)
		if (ps == "" && running == 0) || time.Now().After(deadline) {
			return ps, running
		}
	}
}

// TestLocalPrestartTimeoutKillsEverything: at the timeout the interpreter and everything its
// code started (a child in its own session, a double-forked grandchild) are gone from the
// sandbox, which is still there to be looked at.
func TestLocalPrestartTimeoutKillsEverything(t *testing.T) {
	b := runcodetest.Backend(t, agentBin)
	h := &holdPool{Pool: newPrestartPool(t, b, 1, runcode.Python), b: b}
	t.Cleanup(func() { h.release(t) })
	waitSettled(t, h.Pool, 1)
	code := `import os, subprocess, sys, time
subprocess.Popen(['sleep', '1000'], start_new_session=True)
if os.fork() == 0:
    if os.fork() == 0:
        os.setsid()
        time.sleep(1000)
    os._exit(0)
print('started', flush=True)
time.sleep(1000)
`
	rec := &recorder{}
	res, err := runcode.Run(t.Context(), b, runcode.Request{Language: "python", Code: code, TimeoutSeconds: 1}, runcode.Options{Pool: h, Logger: slog.New(rec)})
	if err != nil {
		t.Fatal(err)
	}
	if !rec.has("run_code: ran in a pre-started interpreter") {
		t.Fatalf("not run in the pre-started interpreter: %q", rec.messages())
	}
	if !res.TimedOut || res.ExitCode != 124 || res.Stdout != "started\n" {
		t.Fatalf("want a timeout after 'started':\n%s", res.Text())
	}
	ps, running := settledProcessesIn(t, b, h.last())
	if ps != "" || running != 0 {
		t.Fatalf("left running after the timeout: ps %q, %d background processes", ps, running)
	}
}

// TestLocalPrestartCancel: a caller that goes away mid-run gets an error, and the program and
// what it started are gone.
func TestLocalPrestartCancel(t *testing.T) {
	b := runcodetest.Backend(t, agentBin)
	h := &holdPool{Pool: newPrestartPool(t, b, 1, runcode.Python), b: b}
	t.Cleanup(func() { h.release(t) })
	waitSettled(t, h.Pool, 1)
	ctx, cancel := context.WithCancel(t.Context())
	started := &notifyWriter{ch: make(chan struct{}), cancel: cancel}
	_, err := runcode.Run(ctx, b, runcode.Request{Language: "python", Code: "import subprocess, time\nsubprocess.Popen(['sleep', '1000'], start_new_session=True)\nprint('go', flush=True)\ntime.sleep(1000)", TimeoutSeconds: 120}, runcode.Options{Pool: h, Stdout: started})
	if err == nil {
		t.Fatal("a cancelled run reported success")
	}
	ps, running := settledProcessesIn(t, b, h.last())
	if ps != "" || running != 0 {
		t.Fatalf("left running after the cancel: ps %q, %d background processes", ps, running)
	}
}

// TestLocalPrestartGoneRunsCold: an interpreter that died while waiting is noticed before the
// code is handed over, and the run execs the code cold in the same sandbox.
func TestLocalPrestartGoneRunsCold(t *testing.T) {
	b := runcodetest.Backend(t, agentBin)
	h := &holdPool{Pool: newPrestartPool(t, b, 1, runcode.Python), b: b, killFirst: true}
	t.Cleanup(func() { h.release(t) })
	waitSettled(t, h.Pool, 1)
	req := runcode.Request{Language: "python", Code: "import sys\nprint(sys.stdin.read().upper())", Stdin: "cold"}
	rec := &recorder{}
	res, err := runcode.Run(t.Context(), b, req, runcode.Options{Pool: h, Logger: slog.New(rec)})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 || res.Stdout != "COLD\n" {
		t.Fatalf("cold fallback:\n%s", res.Text())
	}
	if !rec.has("run_code: the pre-started interpreter had exited; running the code cold") || rec.has("run_code: ran in a pre-started interpreter") {
		t.Fatalf("log %q: want the fallback", rec.messages())
	}
}

// TestLocalPrestartStreamedStdin: stdin given as a stream (not a string) reaches the program
// after the code, and a program that stops reading it early still ends normally.
func TestLocalPrestartStreamedStdin(t *testing.T) {
	b := runcodetest.Backend(t, agentBin)
	pool := newPrestartPool(t, b, 1, runcode.Python)
	for _, tt := range []struct {
		name, code string
		stdin      func() io.Reader
		// want is the expected stdout; empty: compare with a cold run (which, with stdin
		// left unread, hits a cold-path flake of its own, reported separately).
		want string
	}{
		{"read all", "import sys\nd = sys.stdin.buffer.read()\nprint(len(d), d[:6], d[-3:])", func() io.Reader {
			return io.MultiReader(strings.NewReader("first "), strings.NewReader(strings.Repeat("m", 1<<20)), strings.NewReader("end"))
		}, ""},
		{"read one line", "import sys\nprint(sys.stdin.readline().strip())", func() io.Reader {
			return io.MultiReader(strings.NewReader("one\n"), strings.NewReader(strings.Repeat("never read\n", 200000)))
		}, "one\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req := runcode.Request{Language: "python", Code: tt.code}
			var cold runcode.Result
			if tt.want == "" {
				var err error
				if cold, err = runcode.Run(t.Context(), b, req, runcode.Options{Stdin: tt.stdin()}); err != nil {
					t.Fatal(err)
				}
			}
			waitSettled(t, pool, 1)
			rec := &recorder{}
			warm, err := runcode.Run(t.Context(), b, req, runcode.Options{Stdin: tt.stdin(), Pool: pool, Logger: slog.New(rec)})
			if err != nil {
				t.Fatal(err)
			}
			if !rec.has("run_code: ran in a pre-started interpreter") {
				t.Fatalf("not run in the pre-started interpreter: %q", rec.messages())
			}
			if tt.want != "" {
				if warm.ExitCode != 0 || warm.Stdout != tt.want || warm.Stderr != "" || warm.Truncated {
					t.Errorf("want stdout %q:\n%s", tt.want, warm.Text())
				}
				return
			}
			if d := diffResults(cold, warm); d != "" || cold.ExitCode != 0 {
				t.Errorf("%s\ncold:\n%s", d, cold.Text())
			}
		})
	}
}
