package agent_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

func TestHealth(t *testing.T) {
	h := newHarness(t).start()
	noToken := h.clientWith("")
	got, err := noToken.Health(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got.ProtocolVersion != 1 || got.SandboxID != h.cfg.SandboxID || got.KillScope != "subreaper" || got.Version == "" {
		t.Errorf("health = %+v", got)
	}
	for _, f := range []string{"exec", "stdin", "tty", "processes", "files", "shutdown"} {
		if !got.Features[f] {
			t.Errorf("feature %s not reported: %v", f, got.Features)
		}
	}
}

func run(t *testing.T, cl *client.Client, req sbtypes.ExecRequest) (string, string, sbtypes.ExecResult) {
	t.Helper()
	if req.Timeout == 0 {
		req.Timeout = time.Minute
	}
	var out, errb bytes.Buffer
	res, err := cl.Exec(context.Background(), req, &out, &errb)
	if err != nil {
		t.Fatalf("exec %v %q: %v", req.Argv, req.Shell, err)
	}
	return out.String(), errb.String(), res
}

func TestExecBasics(t *testing.T) {
	h := newHarness(t).start()
	work := filepath.Join(h.dir, "work")
	if err := os.Mkdir(work, 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name                string
		req                 sbtypes.ExecRequest
		stdout, stderr, sig string
		code                int
	}{
		{name: "argv", req: sbtypes.ExecRequest{Argv: []string{"echo", "hello", "world"}}, stdout: "hello world\n"},
		{name: "shell", req: sbtypes.ExecRequest{Shell: "echo out; echo err >&2; exit 3"}, stdout: "out\n", stderr: "err\n", code: 3},
		{name: "exit code", req: sbtypes.ExecRequest{Argv: []string{"false"}}, code: 1},
		{name: "signal", req: sbtypes.ExecRequest{Shell: "kill -TERM $$"}, code: -1, sig: "SIGTERM"},
		{name: "env overrides base and is added", req: sbtypes.ExecRequest{Shell: `echo "$LANG $BASE_ONLY $EXTRA"`, Env: map[string]string{"LANG": "C", "EXTRA": "x y"}}, stdout: "C base x y\n"},
		{name: "env is exactly base plus request", req: sbtypes.ExecRequest{Argv: []string{"env"}, Env: map[string]string{"A": "1"}}, stdout: "A=1\nBASE_ONLY=base\nLANG=C.UTF-8\nPATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin\n"},
		{name: "cwd", req: sbtypes.ExecRequest{Argv: []string{"pwd"}, Cwd: work}, stdout: work + "\n"},
		{name: "default workdir", req: sbtypes.ExecRequest{Argv: []string{"pwd"}}, stdout: "/\n"},
		{name: "stdin", req: sbtypes.ExecRequest{Argv: []string{"cat"}, Stdin: strings.NewReader("from stdin\n")}, stdout: "from stdin\n"},
		{name: "no stdin is empty", req: sbtypes.ExecRequest{Argv: []string{"cat"}}, stdout: ""},
		{name: "absolute argv0", req: sbtypes.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo $0"}}, stdout: "/bin/sh\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, errs, res := run(t, h.cl, tc.req)
			if out != tc.stdout || errs != tc.stderr || res.ExitCode != tc.code || res.Signal != tc.sig || res.TimedOut || res.Truncated {
				t.Errorf("got stdout %q stderr %q result %+v; want %q %q code %d signal %q", out, errs, res, tc.stdout, tc.stderr, tc.code, tc.sig)
			}
		})
	}
}

func TestExecLargeStdinAndOutput(t *testing.T) {
	h := newHarness(t).start()
	in := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	out, _, res := run(t, h.cl, sbtypes.ExecRequest{Argv: []string{"cat"}, Stdin: bytes.NewReader(in)})
	if out != string(in) || res.ExitCode != 0 {
		t.Fatalf("cat of 1 MiB: got %d bytes, result %+v", len(out), res)
	}
}

// TestExecStreamingOrder proves frames are forwarded as produced and in production order across
// both streams: the command waits on stdin after each write, and the test answers only once
// it has seen that write's frame.
func TestExecStreamingOrder(t *testing.T) {
	h := newHarness(t).start()
	pr, pw := io.Pipe()
	defer pw.Close()
	script := `for i in 1 2 3 4 5; do echo out$i; read x; echo err$i >&2; read x; done; echo end`
	s, err := h.cl.ExecStream(context.Background(), sbtypes.ExecRequest{Shell: script, Stdin: pr, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var got []string
	var last uint64
	for {
		ev, err := s.Next()
		if err != nil {
			t.Fatal(err)
		}
		if ev.Result != nil {
			if ev.Result.ExitCode != 0 {
				t.Fatalf("result %+v", ev.Result)
			}
			break
		}
		if ev.Output.Seq <= last {
			t.Fatalf("seq %d after %d", ev.Output.Seq, last)
		}
		last = ev.Output.Seq
		line := string(ev.Output.Stream) + ":" + strings.TrimSpace(string(ev.Output.Data))
		got = append(got, line)
		if !strings.HasSuffix(line, "end") {
			if _, err := pw.Write([]byte("go\n")); err != nil {
				t.Fatal(err)
			}
		}
	}
	var want []string
	for i := 1; i <= 5; i++ {
		want = append(want, fmt.Sprintf("stdout:out%d", i), fmt.Sprintf("stderr:err%d", i))
	}
	want = append(want, "stdout:end")
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("frames\n got %v\nwant %v", got, want)
	}
	if _, err := s.Next(); err != io.EOF {
		t.Errorf("Next after terminal = %v, want io.EOF", err)
	}
}

func TestExecOutputCaps(t *testing.T) {
	h := newHarness(t).start()
	// 1 MiB each way, far past the caps: the command must still finish (the agent keeps
	// draining past the cap) and report truncation.
	out, errs, res := run(t, h.cl, sbtypes.ExecRequest{
		Shell:     "head -c 1048576 /dev/zero; head -c 1048576 /dev/zero >&2; echo done > " + filepath.Join(h.dir, "done"),
		MaxStdout: 1000, MaxStderr: 10,
	})
	if len(out) != 1000 || len(errs) != 10 || !res.Truncated || res.ExitCode != 0 {
		t.Errorf("got %d/%d bytes, result %+v; want 1000/10 truncated exit 0", len(out), len(errs), res)
	}
	if _, err := os.Stat(filepath.Join(h.dir, "done")); err != nil {
		t.Errorf("command did not run to completion past the cap: %v", err)
	}
	// Output up to the cap arrives while the command still runs (it is flushed, not held
	// back until the end): `yes` never ends on its own.
	s, err := h.cl.ExecStream(context.Background(), sbtypes.ExecRequest{Argv: []string{"yes"}, MaxStdout: 100, Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1)
	go func() {
		var b strings.Builder
		for b.Len() < 100 {
			ev, err := s.Next()
			if err != nil || ev.Output == nil {
				break
			}
			b.Write(ev.Output.Data)
		}
		got <- b.String()
	}()
	select {
	case g := <-got:
		if g != strings.Repeat("y\n", 50) {
			t.Errorf("capped live output %q", g)
		}
	case <-time.After(20 * time.Second): // hang guard, not a timing assertion
		t.Error("output up to the cap was not delivered while the command ran")
		s.Close()
		<-got
	}
	s.Close()
	out, _, res = run(t, h.cl, sbtypes.ExecRequest{Shell: "printf 12345", MaxStdout: 5})
	if out != "12345" || res.Truncated {
		t.Errorf("output exactly at the cap: %q %+v, want untruncated", out, res)
	}
}

// TestExecDeadlineKillsGroup: a deadline kills the command and its (non-setsid) children and
// the terminal frame says timedOut. (The setsid/double-fork case needs a cgroup: see
// TestCgroupKill.)
func TestExecDeadlineKillsGroup(t *testing.T) {
	h := newHarness(t).start()
	pidFile := filepath.Join(h.dir, "pid")
	out, _, res := run(t, h.cl, sbtypes.ExecRequest{
		Shell:   "sleep 1000 >/dev/null 2>&1 & echo $! > " + pidFile + "; wait",
		Timeout: 1500 * time.Millisecond,
	})
	if !res.TimedOut || res.Signal != "SIGKILL" || res.ExitCode != -1 {
		t.Fatalf("result %+v (stdout %q), want timedOut by SIGKILL", res, out)
	}
	pid := readPid(t, pidFile)
	eventually(t, "background child killed", func() bool { return !alive(pid) })
}

func readPid(t testing.TB, name string) int {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// TestExecDisconnectKills: a caller that goes away takes its command with it, whether or not
// it was still sending stdin.
func TestExecDisconnectKills(t *testing.T) {
	h := newHarness(t).start()
	for _, withStdin := range []bool{false, true} {
		t.Run(fmt.Sprintf("stdin=%v", withStdin), func(t *testing.T) {
			req := sbtypes.ExecRequest{Shell: "sleep 1000 & echo $!; wait", Timeout: time.Hour}
			if withStdin {
				pr, pw := io.Pipe()
				defer pw.Close()
				req.Stdin = pr
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s, err := h.cl.ExecStream(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			ev, err := s.Next()
			if err != nil || ev.Output == nil {
				t.Fatalf("first event %+v %v", ev, err)
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(ev.Output.Data)))
			if err != nil {
				t.Fatal(err)
			}
			if !alive(pid) {
				t.Fatalf("child %d not running before the disconnect", pid)
			}
			cancel()
			s.Close()
			eventually(t, "child killed after disconnect", func() bool { return !alive(pid) })
		})
	}
}

func TestExecRefusals(t *testing.T) {
	h := newHarness(t).start()
	tests := []struct {
		name  string
		body  string
		class error
		field string
	}{
		{"unknown field", `{"argv":["true"],"timeoutMs":1000,"bogus":1}`, sbtypes.ErrInvalid, "bogus"},
		{"no deadline", `{"argv":["true"]}`, sbtypes.ErrInvalid, "timeoutMs"},
		{"negative deadline", `{"argv":["true"],"timeoutMs":-5}`, sbtypes.ErrInvalid, "timeoutMs"},
		{"deadline above max", `{"argv":["true"],"timeoutMs":3600001}`, sbtypes.ErrInvalid, "timeoutMs"},
		{"argv and shell", `{"argv":["true"],"shell":"true","timeoutMs":1000}`, sbtypes.ErrInvalid, "argv"},
		{"no command", `{"timeoutMs":1000}`, sbtypes.ErrInvalid, "argv"},
		{"bad env name", `{"argv":["true"],"timeoutMs":1000,"env":{"A=B":"x"}}`, sbtypes.ErrInvalid, "env"},
		{"NUL in env value", `{"argv":["true"],"timeoutMs":1000,"env":{"A":"x\u0000y"}}`, sbtypes.ErrInvalid, "env"},
		{"relative cwd", `{"argv":["true"],"timeoutMs":1000,"cwd":"tmp"}`, sbtypes.ErrInvalid, "cwd"},
		{"missing cwd", `{"argv":["true"],"timeoutMs":1000,"cwd":"/no/such/dir"}`, sbtypes.ErrNotFound, "cwd"},
		{"unknown executable", `{"argv":["no-such-command-xyz"],"timeoutMs":1000}`, sbtypes.ErrNotFound, "argv[0]"},
		{"negative cap", `{"argv":["true"],"timeoutMs":1000,"maxStdout":-1}`, sbtypes.ErrInvalid, "maxStdout"},
		{"rows without tty", `{"argv":["true"],"timeoutMs":1000,"rows":5}`, sbtypes.ErrInvalid, "rows"},
		{"wrong type", `{"argv":"true","timeoutMs":1000}`, sbtypes.ErrInvalid, "argv"},
		{"body after header without stdin", `{"argv":["true"],"timeoutMs":1000}xyz`, sbtypes.ErrInvalid, "stdin"},
		{"not JSON", `argv=true`, sbtypes.ErrInvalid, "JSON"},
	}
	tok := h.token("execute", nil)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, body := h.raw("POST", "/v1/exec", tok, strings.NewReader(tc.body))
			if status != 400 && status != 404 {
				t.Fatalf("status %d body %s", status, body)
			}
			if !strings.Contains(string(body), tc.field) {
				t.Errorf("error %s does not name %s", body, tc.field)
			}
		})
	}
	// The same through the client: classes survive the wire.
	_, err := h.cl.Exec(context.Background(), sbtypes.ExecRequest{Argv: []string{"no-such-command-xyz"}, Timeout: time.Second}, nil, nil)
	if !errors.Is(err, sbtypes.ErrNotFound) {
		t.Errorf("unknown executable: %v, want ErrNotFound", err)
	}
	_, err = h.cl.Exec(context.Background(), sbtypes.ExecRequest{Argv: []string{"true"}, Timeout: 2 * time.Hour}, nil, nil)
	if !errors.Is(err, sbtypes.ErrInvalid) {
		t.Errorf("deadline above max: %v, want ErrInvalid", err)
	}
}

// TestExecStdinConnectionReuse: an exec whose stdin ended, or was still open when the command
// finished, leaves the client usable: kept-alive connections are not poisoned.
func TestExecStdinConnectionReuse(t *testing.T) {
	h := newHarness(t).start()
	ctx := context.Background()
	check := func(what string) {
		t.Helper()
		s, err := h.cl.ExecStream(ctx, sbtypes.ExecRequest{Shell: "echo a; sleep 0.2; echo b", Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		if _, err := s.Wait(&b, nil); err != nil || b.String() != "a\nb\n" {
			t.Fatalf("exec after %s: %q %v", what, b.String(), err)
		}
		if _, err := h.cl.List(ctx, "/"); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 3; i++ {
		out, _, res := run(t, h.cl, sbtypes.ExecRequest{Argv: []string{"cat"}, Stdin: strings.NewReader("x")})
		if out != "x" || res.ExitCode != 0 {
			t.Fatalf("cat: %q %+v", out, res)
		}
		check("stdin that ended")
		// stdin never closed by the caller; the command ignores it and ends.
		pr, pw := io.Pipe()
		_, _, res = run(t, h.cl, sbtypes.ExecRequest{Argv: []string{"true"}, Stdin: pr})
		pw.Close()
		if res.ExitCode != 0 {
			t.Fatalf("true: %+v", res)
		}
		check("stdin left open")
	}
}

// wchar reads how many bytes pid has written so far.
func wchar(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "wchar: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no wchar in /proc/%d/io", pid)
	return 0
}

// TestExecBackpressure: a caller that stops reading stops the command (its writes block); the
// agent does not buffer the output for it.
func TestExecBackpressure(t *testing.T) {
	h := newHarness(t).start()
	s, err := h.cl.ExecStream(context.Background(), sbtypes.ExecRequest{Shell: "echo $$; exec yes", MaxStdout: 1 << 40, Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ev, err := s.Next()
	if err != nil || ev.Output == nil {
		t.Fatalf("first event %+v %v", ev, err)
	}
	pid, err := strconv.Atoi(strings.Fields(string(ev.Output.Data))[0])
	if err != nil {
		t.Fatal(err)
	}
	// No more reads: yes must come to a stop once the pipe, the agent's read buffer and the
	// socket buffers are full — a few MiB, not without bound.
	var last int64 = -1
	eventually(t, "yes blocked by an unread stream", func() bool {
		n := wchar(t, pid)
		if n > 64<<20 {
			t.Fatalf("yes wrote %d bytes to a stream nobody reads", n)
		}
		stable := n == last
		last = n
		time.Sleep(50 * time.Millisecond)
		return stable
	})
	t.Logf("yes stopped after %d bytes", last)
}

// TestExecStdioBlocking: the command's ends of its stdio are blocking, as a shell would hand
// them over (the agent keeps its own ends non-blocking for its poller): a program reading
// stdin or writing output without expecting EAGAIN works.
func TestExecStdioBlocking(t *testing.T) {
	h := newHarness(t).start()
	const probe = `import fcntl, os, sys
sys.stdout.write(" ".join(str(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK) for fd in (0, 1, 2)))`
	for _, tc := range []struct {
		name  string
		stdin io.Reader
	}{{"no stdin", nil}, {"stdin", strings.NewReader("x")}} {
		t.Run(tc.name, func(t *testing.T) {
			out, errs, res := run(t, h.cl, sbtypes.ExecRequest{Argv: []string{"python3", "-c", probe}, Stdin: tc.stdin})
			if out != "0 0 0" || res.ExitCode != 0 {
				t.Errorf("O_NONBLOCK of fds 0 1 2: %q (stderr %q, %+v), want 0 0 0", out, errs, res)
			}
		})
	}
}

// TestExecOOMScore: a command (and what it forks) is what the OOM killer takes before the
// agent: its oom_score_adj is the most killable (issue 25: a full tmpfs OOM-killed the agent).
func TestExecOOMScore(t *testing.T) {
	h := newHarness(t).start()
	var out bytes.Buffer
	res, err := h.cl.Exec(context.Background(), sbtypes.ExecRequest{Shell: "cat /proc/self/oom_score_adj; sh -c 'cat /proc/self/oom_score_adj'", Timeout: time.Minute}, &out, io.Discard)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %+v %v", res, err)
	}
	if out.String() != "1000\n1000\n" {
		t.Errorf("oom_score_adj of the command and its child: %q, want 1000 for both", out.String())
	}
	// The agent itself is back at its own score once the command is forked.
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", h.proc.Process.Pid)); err != nil || string(b) != "0\n" {
		t.Errorf("the agent's oom_score_adj after a fork: %q %v, want 0", b, err)
	}
}

// TestExecOOMScoreRefills: below a reaper the agent never takes the code's score, not even
// while the next exec's reaper is started in the background after each exec (the reaper
// raises its own). Without that, a reader of the agent's score saw 1000 between execs.
func TestExecOOMScoreRefills(t *testing.T) {
	testutil.RequireRoot(t)
	h := newHarness(t).start()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if hl, err := h.cl.Health(ctx); err != nil || hl.KillScope != "subreaper" {
		t.Fatalf("health %+v %v, want killScope subreaper", hl, err)
	}
	path := fmt.Sprintf("/proc/%d/oom_score_adj", h.proc.Process.Pid)
	stop := make(chan struct{})
	seen := make(chan string, 1)
	go func() {
		defer close(seen)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if b, err := os.ReadFile(path); err == nil && string(b) != "0\n" {
				seen <- string(b)
				return
			}
		}
	}()
	for i := 0; i < 40; i++ {
		var out bytes.Buffer
		res, err := h.cl.Exec(ctx, sbtypes.ExecRequest{Shell: "cat /proc/self/oom_score_adj", Timeout: time.Minute}, &out, io.Discard)
		if err != nil || res.ExitCode != 0 || out.String() != "1000\n" {
			t.Fatalf("exec %d: %+v %q %v, want the code at 1000", i, res, out.String(), err)
		}
	}
	close(stop)
	if s, ok := <-seen; ok {
		t.Errorf("the agent's oom_score_adj between execs: %q, want 0 throughout", s)
	}
}
