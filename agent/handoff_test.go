package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
	"github.com/airlock-sandbox/airlock/token"
)

// waiter is a process that waits for its work as a pre-started interpreter does: it says so on
// stderr (pre printed first on stdout, before the work), reads one line from stdin and runs it
// as a shell command, whose stdin is the rest of the process's.
const waiter = `printf '%s' "$PRE"; echo waiting >&2; IFS= read -r work; eval "$work"`

// startWaiter starts waiter with the given caps (0: the agent's default) and returns its id
// once it waits.
func startWaiter(t *testing.T, cl *client.Client, pre string, maxStdout int64) string {
	t.Helper()
	ctx := context.Background()
	p, err := cl.StartProcess(ctx, client.ProcessRequest{
		ExecRequest: sbtypes.ExecRequest{Shell: waiter, Env: map[string]string{"PRE": pre}, Timeout: time.Hour, MaxStdout: maxStdout},
		OpenStdin:   true,
	})
	if err != nil {
		t.Fatal(err)
	}
	s, err := cl.Attach(ctx, p.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for {
		ev, err := s.Next()
		if err != nil || ev.Result != nil {
			t.Fatalf("waiter ended before it waited: %+v %v", ev, err)
		}
		if ev.Output.Stream == sbtypes.Stderr && string(ev.Output.Data) == "waiting\n" {
			return p.ID
		}
	}
}

// handoff hands work (one shell line) to process id and collects what comes back.
func handoff(t *testing.T, cl *client.Client, id string, req client.HandoffRequest) (stdout, stderr string, res sbtypes.ExecResult) {
	t.Helper()
	s, err := cl.Handoff(context.Background(), id, req)
	if err != nil {
		t.Fatal(err)
	}
	var o, e strings.Builder
	res, err = s.Wait(&o, &e)
	if err != nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), res
}

// TestHandoff: the work's output from the handoff on (nothing from before it), its exit
// status however it ended, its caps counted from the handoff in place of the process's, the
// deadline it brings, and stdin streamed after the work.
func TestHandoff(t *testing.T) {
	h := newHarness(t).start()
	cl := h.cl
	for _, tc := range []struct {
		name           string
		pre            string
		startCap       int64 // the process's own stdout cap
		work           string
		more           string
		req            client.HandoffRequest
		stdout, stderr string
		exit           int
		signal         string
		timedOut       bool
		truncated      bool
	}{
		{name: "exit status", pre: "before", work: "echo out; echo err >&2; exit 3", exit: 3, stdout: "out\n", stderr: "err\n"},
		{name: "signal", work: "kill -TERM $$", exit: -1, signal: "SIGTERM"},
		{name: "deadline", work: "echo started; sleep 1000", req: client.HandoffRequest{Timeout: 500 * time.Millisecond}, exit: -1, signal: "SIGKILL", timedOut: true, stdout: "started\n"},
		{name: "cap of the work, not of the process", pre: "0123456789", startCap: 10, work: "printf '%050d' 0", req: client.HandoffRequest{MaxStdout: 50}, stdout: strings.Repeat("0", 50)},
		{name: "cap cuts the work's output", work: "printf '%0100d' 0; echo e >&2", req: client.HandoffRequest{MaxStdout: 40, MaxStderr: 1}, stdout: strings.Repeat("0", 40), stderr: "e", truncated: true},
		{name: "more on stdin", work: "cat", more: "streamed\nstdin\n", stdout: "streamed\nstdin\n"},
		{name: "no more: stdin ends", work: "cat; echo end", stdout: "end\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := startWaiter(t, cl, tc.pre, tc.startCap)
			req := tc.req
			if req.Timeout == 0 {
				req.Timeout = time.Hour
			}
			req.Input = []byte(tc.work + "\n")
			if tc.more != "" {
				req.More = strings.NewReader(tc.more)
			}
			out, errOut, res := handoff(t, cl, id, req)
			if out != tc.stdout || errOut != tc.stderr {
				t.Errorf("stdout %q stderr %q, want %q %q", out, errOut, tc.stdout, tc.stderr)
			}
			if res.ExitCode != tc.exit || res.Signal != tc.signal || res.TimedOut != tc.timedOut || res.Truncated != tc.truncated {
				t.Errorf("result %+v, want exit %d signal %q timedOut %v truncated %v", res, tc.exit, tc.signal, tc.timedOut, tc.truncated)
			}
			// The process's own record agrees (wait, describe).
			w, err := cl.Wait(context.Background(), id)
			if err != nil || w.ExitCode != tc.exit || w.TimedOut != tc.timedOut {
				t.Errorf("wait %+v %v", w, err)
			}
		})
	}
}

// countingReader counts the reads of a reader that must stay unread.
type countingReader struct{ reads atomic.Int32 }

func (c *countingReader) Read([]byte) (int, error) {
	c.reads.Add(1)
	return 0, io.EOF
}

// TestHandoffRefusals: what cannot take work is refused before anything is handed over, and
// a refused handoff leaves More unread (for a cold run to read instead).
func TestHandoffRefusals(t *testing.T) {
	h := newHarness(t).start()
	ctx := context.Background()
	cl := h.cl
	work := client.HandoffRequest{Timeout: time.Hour, Input: []byte("exit 0\n")}

	handed := startWaiter(t, cl, "", 0)
	if _, _, res := handoff(t, cl, handed, work); res.ExitCode != 0 {
		t.Fatalf("first handoff %+v", res)
	}
	noStdin, err := cl.StartProcess(ctx, client.ProcessRequest{ExecRequest: sbtypes.ExecRequest{Argv: []string{"sleep", "1000"}, Timeout: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	tty, err := cl.StartProcess(ctx, client.ProcessRequest{ExecRequest: sbtypes.ExecRequest{Argv: []string{"sleep", "1000"}, Timeout: time.Hour, TTY: true}, OpenStdin: true})
	if err != nil {
		t.Fatal(err)
	}
	waiting := startWaiter(t, cl, "", 0)
	for _, tc := range []struct {
		name string
		id   string
		req  client.HandoffRequest
		want error
	}{
		{"handed work before (and exited)", handed, work, sbtypes.ErrConflict},
		{"started without stdin", noStdin.ID, work, sbtypes.ErrConflict},
		{"terminal", tty.ID, work, sbtypes.ErrConflict},
		{"no such process", "nope", work, sbtypes.ErrNotFound},
		{"no deadline", waiting, client.HandoffRequest{Input: work.Input}, sbtypes.ErrInvalid},
		{"deadline over the agent's maximum", waiting, client.HandoffRequest{Timeout: 2 * time.Hour, Input: work.Input}, sbtypes.ErrInvalid},
		{"negative cap", waiting, client.HandoffRequest{Timeout: time.Hour, MaxStderr: -1, Input: work.Input}, sbtypes.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			more := &countingReader{}
			tc.req.More = more
			s, err := cl.Handoff(ctx, tc.id, tc.req)
			if err == nil {
				s.Close()
			}
			if !errors.Is(err, tc.want) {
				t.Errorf("handoff: %v, want %v", err, tc.want)
			}
			if n := more.reads.Load(); n != 0 {
				t.Errorf("More was read %d times by a refused handoff", n)
			}
		})
	}
	// The refusals took nothing from the waiting one: it still takes its work.
	if out, _, res := handoff(t, cl, waiting, client.HandoffRequest{Timeout: time.Hour, Input: []byte("echo still\n")}); out != "still\n" || res.ExitCode != 0 {
		t.Errorf("after refusals: %q %+v", out, res)
	}
	// Unknown fields are refused, as everywhere in the protocol.
	code, body := h.raw("POST", "/v1/processes/"+noStdin.ID+"/handoff", h.token(token.Execute, nil), strings.NewReader(`{"timeoutMs":1000,"deadline":5}`))
	if code != 400 || !strings.Contains(string(body), "deadline") {
		t.Errorf("unknown field: %d %s", code, body)
	}
}

// TestHandoffClientGone: the deadline a handoff brings is the agent's. A client that goes
// away mid-run (its process killed: the connection closes) takes the work with it at once,
// as an exec's would; one that stays connected but never reads again (a frozen process)
// stretches nothing: the deadline still ends the work.
func TestHandoffClientGone(t *testing.T) {
	h := newHarness(t).start()
	// A hang guard: work that outlives what should end it shows as a failed wait.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl := h.cl
	sock := strings.TrimPrefix(h.cfg.Listen, "unix:")
	send := func(t *testing.T, id string, timeout time.Duration) net.Conn {
		t.Helper()
		hdr, _ := json.Marshal(wire.HandoffRequest{TimeoutMs: timeout.Milliseconds()})
		body := append(hdr, "echo started; sleep 1000\n"...)
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		var req bytes.Buffer
		fmt.Fprintf(&req, "POST /v1/processes/%s/handoff HTTP/1.1\r\nHost: agent\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s", id, h.token(token.Execute, nil), len(body), body)
		if _, err := c.Write(req.Bytes()); err != nil {
			t.Fatal(err)
		}
		return c
	}
	t.Run("disconnect", func(t *testing.T) {
		id := startWaiter(t, cl, "", 0)
		c := send(t, id, time.Hour)
		// The answer's head and the work's first line: it runs.
		buf := make([]byte, 4096)
		var got []byte
		for !bytes.Contains(got, []byte("started")) {
			n, err := c.Read(buf)
			if err != nil {
				t.Fatalf("reading the answer: %v (%q)", err, got)
			}
			got = append(got, buf[:n]...)
		}
		c.Close()
		res, err := cl.Wait(ctx, id)
		if err != nil || res.TimedOut || res.Signal != "SIGKILL" {
			t.Errorf("after the client went: %+v %v, want killed at once (not at the hour's deadline)", res, err)
		}
	})
	t.Run("frozen client", func(t *testing.T) {
		id := startWaiter(t, cl, "", 0)
		c := send(t, id, 500*time.Millisecond)
		defer c.Close() // never read: the client is there but does nothing
		res, err := cl.Wait(ctx, id)
		if err != nil || !res.TimedOut || res.Signal != "SIGKILL" {
			t.Errorf("with a frozen client: %+v %v, want timedOut SIGKILL", res, err)
		}
	})
}

// TestHandoffDeadlineKillsTree: the deadline a handoff brings kills everything the work
// started, setsid and double fork included, where the agent has cgroups, and removes its
// cgroup.
func TestHandoffDeadlineKillsTree(t *testing.T) {
	for kind, setup := range cgroupKinds(t) {
		t.Run(kind, func(t *testing.T) {
			h := newHarness(t)
			base := setup(h)
			h.start()
			dir := t.TempDir()
			id := startWaiter(t, h.cl, "", 0)
			script := filepath.Join(dir, "tree.sh")
			if err := os.WriteFile(script, []byte(treeScript(dir)), 0o644); err != nil {
				t.Fatal(err)
			}
			out, _, res := handoff(t, h.cl, id, client.HandoffRequest{Timeout: 3 * time.Second, Input: []byte("sh " + script + "\n")})
			if out != "ready\n" {
				t.Fatalf("the processes were not all started before the deadline (slow host?): stdout %q", out)
			}
			if !res.TimedOut || res.Signal != "SIGKILL" {
				t.Errorf("result %+v, want timedOut SIGKILL", res)
			}
			requireAllDead(t, treePids(t, dir))
			eventually(t, "exec cgroup removed", func() bool { return len(execCgroups(t, base)) == 0 })
		})
	}
}
