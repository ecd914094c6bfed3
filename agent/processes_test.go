package agent_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
	"github.com/airlock-sandbox/airlock/token"
)

// next returns the next output of s as text, failing on anything else.
func nextOutput(t *testing.T, s *client.Stream) string {
	t.Helper()
	ev, err := s.Next()
	if err != nil || ev.Output == nil {
		t.Fatalf("next: %+v %v", ev, err)
	}
	return string(ev.Output.Data)
}

func nextResult(t *testing.T, s *client.Stream) sbtypes.ExecResult {
	t.Helper()
	for {
		ev, err := s.Next()
		if err != nil {
			t.Fatalf("next: %v", err)
		}
		if ev.Result != nil {
			return *ev.Result
		}
	}
}

func TestProcessLifecycle(t *testing.T) {
	h := newHarness(t).start()
	ctx := context.Background()
	cl := h.cl
	p, err := cl.StartProcess(ctx, client.ProcessRequest{
		ExecRequest: sbtypes.ExecRequest{Shell: `echo one; read x; echo "got $x"; exec sleep 1000`, Timeout: time.Hour},
		OpenStdin:   true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !p.Running || p.ID == "" {
		t.Fatalf("started %+v", p)
	}
	fromStart, err := cl.Attach(ctx, p.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	defer fromStart.Close()
	if got := nextOutput(t, fromStart); got != "one\n" {
		t.Fatalf("from start: %q", got)
	}
	// Nothing more is produced until stdin arrives, so a live attach starts after "one".
	live, err := cl.Attach(ctx, p.ID, false)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	if err := cl.WriteStdin(ctx, p.ID, strings.NewReader("two\n"), false); err != nil {
		t.Fatal(err)
	}
	if got := nextOutput(t, live); got != "got two\n" {
		t.Errorf("live: %q", got)
	}
	if got := nextOutput(t, fromStart); got != "got two\n" {
		t.Errorf("from start, second: %q", got)
	}
	list, err := cl.Processes(ctx)
	if err != nil || len(list) != 1 || list[0].ID != p.ID || !list[0].Running {
		t.Fatalf("list %+v %v", list, err)
	}
	if err := cl.Signal(ctx, p.ID, "TERM"); err != nil {
		t.Fatal(err)
	}
	res, err := cl.Wait(ctx, p.ID)
	if err != nil || res.Signal != "SIGTERM" || res.ExitCode != -1 {
		t.Fatalf("wait %+v %v, want SIGTERM", res, err)
	}
	for _, s := range []*client.Stream{fromStart, live} {
		if r := nextResult(t, s); r.Signal != "SIGTERM" {
			t.Errorf("attached stream ended with %+v", r)
		}
	}
	got, err := cl.Process(ctx, p.ID)
	if err != nil || got.Running || got.Exit == nil || got.Exit.Signal != "SIGTERM" {
		t.Errorf("process after exit %+v %v", got, err)
	}
	if err := cl.Signal(ctx, p.ID, "KILL"); !errors.Is(err, sbtypes.ErrConflict) {
		t.Errorf("signal after exit: %v, want ErrConflict", err)
	}
	if err := cl.WriteStdin(ctx, p.ID, strings.NewReader("x"), true); !errors.Is(err, sbtypes.ErrConflict) {
		t.Errorf("stdin after exit: %v, want ErrConflict", err)
	}
	// Replay after exit: from start gives everything, live only the end.
	s, err := cl.Attach(ctx, p.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	var all strings.Builder
	if _, err := s.Wait(&all, nil); err != nil || all.String() != "one\ngot two\n" {
		t.Errorf("replay after exit: %q %v", all.String(), err)
	}
	s, err = cl.Attach(ctx, p.ID, false)
	if err != nil {
		t.Fatal(err)
	}
	all.Reset()
	if _, err := s.Wait(&all, nil); err != nil || all.String() != "" {
		t.Errorf("live attach after exit: %q %v", all.String(), err)
	}
	if err := cl.RemoveProcess(ctx, p.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Process(ctx, p.ID); !errors.Is(err, sbtypes.ErrNotFound) {
		t.Errorf("removed process: %v, want ErrNotFound", err)
	}
}

func TestProcessRefusals(t *testing.T) {
	h := newHarness(t).start()
	ctx := context.Background()
	cl := h.cl
	if _, err := cl.StartProcess(ctx, client.ProcessRequest{ExecRequest: sbtypes.ExecRequest{Argv: []string{"true"}}}); !errors.Is(err, sbtypes.ErrInvalid) {
		t.Errorf("no deadline: %v", err)
	}
	p, err := cl.StartProcess(ctx, client.ProcessRequest{ExecRequest: sbtypes.ExecRequest{Argv: []string{"sleep", "1000"}, Timeout: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.WriteStdin(ctx, p.ID, strings.NewReader("x"), false); !errors.Is(err, sbtypes.ErrConflict) {
		t.Errorf("stdin without OpenStdin: %v, want ErrConflict", err)
	}
	if err := cl.Resize(ctx, p.ID, 10, 10); !errors.Is(err, sbtypes.ErrConflict) {
		t.Errorf("resize without tty: %v, want ErrConflict", err)
	}
	if err := cl.Signal(ctx, p.ID, "NOPE"); !errors.Is(err, sbtypes.ErrInvalid) {
		t.Errorf("bad signal: %v, want ErrInvalid", err)
	}
	if _, err := cl.Process(ctx, "nope"); !errors.Is(err, sbtypes.ErrNotFound) {
		t.Errorf("unknown id: %v", err)
	}
	status, body := h.raw("GET", "/v1/processes/"+p.ID+"/output?from=middle", h.token("execute", nil), nil)
	if status != 400 || !strings.Contains(string(body), "from") {
		t.Errorf("bad from: %d %s", status, body)
	}
	if err := cl.RemoveProcess(ctx, p.ID); err != nil {
		t.Fatal(err)
	}
}

func TestProcessDeadline(t *testing.T) {
	h := newHarness(t).start()
	ctx := context.Background()
	p, err := h.cl.StartProcess(ctx, client.ProcessRequest{ExecRequest: sbtypes.ExecRequest{Argv: []string{"sleep", "1000"}, Timeout: 500 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := h.cl.Wait(ctx, p.ID)
	if err != nil || !res.TimedOut || res.Signal != "SIGKILL" {
		t.Errorf("wait %+v %v, want timed out", res, err)
	}
}

// TestProcessOutputBounded: a process that writes more than the agent keeps does not block
// and does not grow the agent without bound; a replay shows the gap in seq.
// TestProcessOutputKeptWithinCaps: a background process's output is kept for attach up to its
// caps, however far a reader is behind, and cut there.
func TestProcessOutputKeptWithinCaps(t *testing.T) {
	h := newHarness(t).start()
	ctx := context.Background()
	const capBytes = 3 << 20 // more than the ring's minimum (1 MiB)
	p, err := h.cl.StartProcess(ctx, client.ProcessRequest{ExecRequest: sbtypes.ExecRequest{
		Shell: "head -c 8000000 /dev/zero; echo; echo last", Timeout: time.Minute, MaxStdout: capBytes, MaxStderr: 1,
	}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := h.cl.Wait(ctx, p.ID)
	if err != nil || res.ExitCode != 0 || !res.Truncated {
		t.Fatalf("wait %+v %v", res, err)
	}
	s, err := h.cl.Attach(ctx, p.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var total int
	var first, last uint64
	gap := false
	for {
		ev, err := s.Next()
		if err != nil {
			t.Fatal(err)
		}
		if ev.Result != nil {
			break
		}
		if first == 0 {
			first = ev.Output.Seq
		} else if ev.Output.Seq != last+1 {
			gap = true
		}
		last = ev.Output.Seq
		total += len(ev.Output.Data)
	}
	if first != 1 || gap || total != capBytes {
		t.Errorf("replay from seq %d, gap %v, %d bytes; want all %d bytes the cap let through, from seq 1", first, gap, total, capBytes)
	}
}

func TestPTY(t *testing.T) {
	h := newHarness(t).start()
	ctx := context.Background()
	cl := h.cl
	out, _, res := run(t, cl, sbtypes.ExecRequest{Argv: []string{"tty"}, TTY: true})
	if !strings.HasPrefix(out, "/dev/pts/") || res.ExitCode != 0 {
		t.Errorf("tty: %q %+v", out, res)
	}
	s, err := cl.ExecStream(ctx, sbtypes.ExecRequest{Argv: []string{"stty", "size"}, TTY: true, Timeout: time.Minute}, client.WithTermSize(30, 100))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if res, err := s.Wait(&b, nil); err != nil || b.String() != "30 100\r\n" || res.ExitCode != 0 {
		t.Errorf("stty size: %q %+v %v", b.String(), res, err)
	}
	// Stdin EOF on a terminal is ^D: cat ends.
	out, _, res = run(t, cl, sbtypes.ExecRequest{Argv: []string{"cat"}, TTY: true, Stdin: strings.NewReader("hello\n")})
	if res.ExitCode != 0 || !strings.Contains(out, "hello") {
		t.Errorf("cat on a tty: %q %+v", out, res)
	}

	p, err := cl.StartProcess(ctx, client.ProcessRequest{
		ExecRequest: sbtypes.ExecRequest{Shell: "stty size; read x; stty size", TTY: true, Timeout: time.Minute},
		OpenStdin:   true,
	}, client.WithTermSize(30, 100))
	if err != nil {
		t.Fatal(err)
	}
	att, err := cl.Attach(ctx, p.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	defer att.Close()
	if got := nextOutput(t, att); got != "30 100\r\n" {
		t.Fatalf("first size %q", got)
	}
	if err := cl.Resize(ctx, p.ID, 40, 120); err != nil {
		t.Fatal(err)
	}
	if err := cl.WriteStdin(ctx, p.ID, strings.NewReader("\n"), false); err != nil {
		t.Fatal(err)
	}
	var rest strings.Builder
	if res, err := att.Wait(&rest, nil); err != nil || res.ExitCode != 0 || !strings.HasSuffix(rest.String(), "40 120\r\n") {
		t.Errorf("after resize: %q %+v %v", rest.String(), res, err)
	}
}

// TestProcessOutputLook: Output returns what is held now without waiting for more (the process
// runs on), then, once it has exited, the rest with its exit.
func TestProcessOutputLook(t *testing.T) {
	h := newHarness(t).start()
	ctx := context.Background()
	p, err := h.cl.StartProcess(ctx, client.ProcessRequest{
		ExecRequest: sbtypes.ExecRequest{Shell: `echo one; read x; echo "two $x" >&2; exit 4`, Timeout: time.Hour},
		OpenStdin:   true,
	})
	if err != nil {
		t.Fatal(err)
	}
	var frames []sbtypes.OutputFrame
	var exit *sbtypes.ExecResult
	eventually(t, "the first line held", func() bool {
		frames, exit, err = h.cl.Output(ctx, p.ID, 0)
		return err != nil || len(frames) > 0
	})
	if err != nil || exit != nil || len(frames) != 1 || string(frames[0].Data) != "one\n" {
		t.Fatalf("running: frames %+v exit %+v err %v", frames, exit, err)
	}
	if err := h.cl.WriteStdin(ctx, p.ID, strings.NewReader("x\n"), true); err != nil {
		t.Fatal(err)
	}
	if _, err := h.cl.Wait(ctx, p.ID); err != nil {
		t.Fatal(err)
	}
	frames, exit, err = h.cl.Output(ctx, p.ID, frames[0].Seq)
	if err != nil || exit == nil || exit.ExitCode != 4 || len(frames) != 1 || string(frames[0].Data) != "two x\n" || frames[0].Stream != sbtypes.Stderr {
		t.Fatalf("exited: frames %+v exit %+v err %v", frames, exit, err)
	}
	code, body := h.raw("GET", "/v1/processes/"+p.ID+"/output?follow=maybe", h.token(token.Execute, nil), nil)
	if code != 400 || !strings.Contains(string(body), "follow") {
		t.Errorf("follow=maybe answered %d %s", code, body)
	}
}
