package agent_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

// procField reads one "Key:" line of /proc/PID/status.
func procField(pid int, key string) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, key+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// startSleeper starts a background process that prints "$$ $PPID" and becomes `sleep 1000`,
// and returns the process, its pid and its parent's once it is sleep.
func startSleeper(ctx context.Context, t *testing.T, cl *client.Client) (client.Process, int, int) {
	t.Helper()
	p, err := cl.StartProcess(ctx, client.ProcessRequest{ExecRequest: sbtypes.ExecRequest{Shell: "echo $$ $PPID; exec sleep 1000", Timeout: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := cl.Attach(ctx, p.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ev, err := s.Next()
	if err != nil || ev.Output == nil {
		t.Fatalf("first event %+v %v", ev, err)
	}
	var pid, ppid int
	if _, err := fmt.Sscan(string(ev.Output.Data), &pid, &ppid); err != nil {
		t.Fatalf("output %q: %v", ev.Output.Data, err)
	}
	eventually(t, "the process is sleep", func() bool {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		return string(comm) == "sleep\n"
	})
	return p, pid, ppid
}

// TestReaper: without a cgroup, a command runs below a reaper of its own, and what the caller
// sees of it is what it saw with the process group alone: every exit status and signal death
// alike, $$ the command's own pid, signals through the processes API delivered to the command.
// The reaper keeps none of the command's stdio.
func TestReaper(t *testing.T) {
	testutil.RequireRoot(t)
	h := newHarness(t).start()
	pg := newHarness(t)
	pg.env = []string{envNoReaper + "=1"}
	pg.start()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, c := range []struct {
		h    *harness
		want string
	}{{h, "subreaper"}, {pg, "process-group"}} {
		if hl, err := c.h.cl.Health(ctx); err != nil || hl.KillScope != c.want {
			t.Fatalf("health %+v %v, want killScope %s", hl, err, c.want)
		}
	}

	t.Run("exit statuses", func(t *testing.T) {
		for code := range 256 {
			out, errs, res := run(t, h.cl, sbtypes.ExecRequest{Shell: fmt.Sprintf("echo %d; echo e >&2; exit %d", code, code)})
			if res.ExitCode != code || res.Signal != "" || res.TimedOut || out != fmt.Sprintf("%d\n", code) || errs != "e\n" {
				t.Fatalf("exit %d: stdout %q stderr %q result %+v", code, out, errs, res)
			}
		}
	})

	t.Run("signal deaths as with the process group", func(t *testing.T) {
		for _, sig := range []string{"TERM", "KILL", "INT", "HUP", "QUIT", "ABRT", "SEGV", "USR1", "PIPE", "ALRM"} {
			req := sbtypes.ExecRequest{Shell: "kill -" + sig + " $$; sleep 10"}
			_, _, got := run(t, h.cl, req)
			_, _, want := run(t, pg.cl, req)
			got.Duration, want.Duration = 0, 0
			if got != want || got.Signal != "SIG"+sig || got.ExitCode != -1 {
				t.Errorf("kill -%s $$: %+v, with the process group %+v", sig, got, want)
			}
		}
	})

	t.Run("the command is an ordinary process below its reaper", func(t *testing.T) {
		p, pid, ppid := startSleeper(ctx, t, h.cl)
		if pid == 1 || pid == ppid {
			t.Fatalf("$$ %d, $PPID %d", pid, ppid)
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", ppid))
		if arg0, _, _ := bytes.Cut(cmdline, []byte{0}); string(arg0) != "airlock-exec-reaper" {
			t.Errorf("the command's parent runs %q, want the reaper", cmdline)
		}
		if pp := procField(ppid, "PPid"); pp != strconv.Itoa(h.proc.Process.Pid) {
			t.Errorf("the reaper's parent is %s, want the agent %d", pp, h.proc.Process.Pid)
		}
		// Its own session and group, as with the process group scope.
		if sid := procField(pid, "NSsid"); sid != strconv.Itoa(pid) {
			t.Errorf("the command's session %s, want its own (%d)", sid, pid)
		}
		// The reaper holds no pipe and no terminal: the command's output ends with it.
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", ppid))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", ppid, e.Name()))
			n, _ := strconv.Atoi(e.Name())
			if n <= 2 && l != "/dev/null" || strings.HasPrefix(l, "pipe:") || strings.HasPrefix(l, "/dev/pts") {
				t.Errorf("the reaper holds fd %d: %s", n, l)
			}
		}
		// A signal through the API reaches the command, not the reaper.
		if err := h.cl.Signal(ctx, p.ID, "TERM"); err != nil {
			t.Fatal(err)
		}
		res, err := h.cl.Wait(ctx, p.ID)
		if err != nil || res.Signal != "SIGTERM" || res.ExitCode != -1 || res.TimedOut {
			t.Fatalf("after SIGTERM: %+v %v", res, err)
		}
		requireAllDead(t, []int{pid, ppid})
	})

	t.Run("a signal the command handles", func(t *testing.T) {
		p, err := h.cl.StartProcess(ctx, client.ProcessRequest{ExecRequest: sbtypes.ExecRequest{
			Shell: "trap 'exit 7' USR1; echo ready; while :; do sleep 0.05; done", Timeout: time.Hour}})
		if err != nil {
			t.Fatal(err)
		}
		s, err := h.cl.Attach(ctx, p.ID, true)
		if err != nil {
			t.Fatal(err)
		}
		ev, err := s.Next()
		s.Close()
		if err != nil || ev.Output == nil || string(ev.Output.Data) != "ready\n" {
			t.Fatalf("first event %+v %v", ev, err)
		}
		if err := h.cl.Signal(ctx, p.ID, "USR1"); err != nil {
			t.Fatal(err)
		}
		if res, err := h.cl.Wait(ctx, p.ID); err != nil || res.ExitCode != 7 || res.Signal != "" {
			t.Fatalf("after SIGUSR1: %+v %v", res, err)
		}
	})

	t.Run("a terminal", func(t *testing.T) {
		out, _, res := run(t, h.cl, sbtypes.ExecRequest{Shell: `[ "$(cut -d' ' -f6 /proc/$$/stat)" = $$ ] && tty && exit 3`, TTY: true})
		if res.ExitCode != 3 || !strings.HasPrefix(out, "/dev/pts/") {
			t.Errorf("stdout %q result %+v", out, res)
		}
	})

	// Code running as the agent's user can kill its reaper: the exec then cannot vouch for
	// what the command started and says so.
	t.Run("reaper killed", func(t *testing.T) {
		var out bytes.Buffer
		_, err := h.cl.Exec(ctx, sbtypes.ExecRequest{Shell: "kill -KILL $PPID; while :; do :; done", Timeout: time.Minute}, &out, &out)
		if !errors.Is(err, sbtypes.ErrOutcomeUnknown) {
			t.Errorf("exec whose reaper was killed: %v (output %q), want outcome unknown", err, out.String())
		}
		if _, _, res := run(t, h.cl, sbtypes.ExecRequest{Shell: "echo alive"}); res.ExitCode != 0 {
			t.Errorf("the next exec: %+v", res)
		}
	})

	// The reaper started ahead for the next exec can die while it waits (killed from outside;
	// once it was lost across a gVisor pause): the exec gets a reaper started then.
	t.Run("reaper started ahead killed", func(t *testing.T) {
		ahead := aheadReaper(t, h)
		if err := syscall.Kill(ahead, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the killed reaper is gone", func() bool {
			_, err := os.Stat(fmt.Sprintf("/proc/%d", ahead))
			return err != nil
		})
		if out, _, res := run(t, h.cl, sbtypes.ExecRequest{Shell: "echo alive"}); res.ExitCode != 0 || out != "alive\n" {
			t.Errorf("the exec after its reaper was killed: %+v %q", res, out)
		}
	})

	// The reaper started ahead can also end after the agent handed it the command but before
	// it read it (lost across a gVisor pause, the CI saw): its socket then resets the agent's
	// end with the command unread, so nothing ran, and another reaper runs the command.
	t.Run("reaper started ahead lost with the command unread", func(t *testing.T) {
		pidfd, err := unix.PidfdOpen(aheadReaper(t, h), 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(pidfd)
		// Stopped, it reads nothing; its control socket (a copy held here meanwhile) shows
		// when the command has been written to it.
		ctl, err := unix.PidfdGetfd(pidfd, 3, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.PidfdSendSignal(pidfd, unix.SIGSTOP, nil, 0); err != nil {
			unix.Close(ctl)
			t.Fatal(err)
		}
		type result struct {
			out string
			res sbtypes.ExecResult
			err error
		}
		done := make(chan result, 1)
		go func() {
			var out bytes.Buffer
			res, err := h.cl.Exec(ctx, sbtypes.ExecRequest{Shell: "echo alive", Timeout: time.Minute}, &out, &out)
			done <- result{out.String(), res, err}
		}()
		eventually(t, "the command is in the stopped reaper's socket", func() bool {
			n, err := unix.IoctlGetInt(ctl, unix.SIOCINQ)
			return err == nil && n > 0
		})
		unix.Close(ctl)
		if err := unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0); err != nil {
			t.Fatal(err)
		}
		r := <-done
		if r.err != nil || r.res.ExitCode != 0 || r.out != "alive\n" {
			t.Errorf("the exec whose reaper was lost with its command unread: %v %+v %q", r.err, r.res, r.out)
		}
	})

	// Signals the reaper catches are dropped, not fatal to it.
	t.Run("reaper ignores catchable signals", func(t *testing.T) {
		dir := t.TempDir()
		out, _, res := run(t, h.cl, sbtypes.ExecRequest{Shell: fmt.Sprintf(
			"cd %s; setsid sleep 1000 >/dev/null 2>&1 & echo $! > p1; for s in TERM INT HUP QUIT USR1 USR2 ALRM TSTP; do kill -$s $PPID || exit 9; done; echo done", dir)})
		if out != "done\n" || res.ExitCode != 0 || res.Signal != "" {
			t.Fatalf("stdout %q result %+v", out, res)
		}
		requireAllDead(t, []int{readPid(t, dir+"/p1")})
	})
}

// TestReaperOutOfCodesReach: code running as another user can neither signal nor trace its
// reaper, and what it leaves behind dies with the exec.
func TestReaperOutOfCodesReach(t *testing.T) {
	testutil.RequireRoot(t)
	h := newHarness(t)
	h.cfg.CodeUID, h.cfg.CodeGID, h.cfg.AllowRootCode = 65534, 65534, false
	if err := os.Chmod(h.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	h.start()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	out, errs, res := run(t, h.cl, sbtypes.ExecRequest{Shell: fmt.Sprintf(
		"cd %s; setsid sleep 1000 >/dev/null 2>&1 & echo $! > p1; echo $PPID > r; kill -KILL $PPID 2>/dev/null && echo killed; kill -STOP $PPID 2>/dev/null && echo stopped; id -u", dir)})
	if out != "65534\n" || res.ExitCode != 0 {
		t.Fatalf("stdout %q stderr %q result %+v", out, errs, res)
	}
	requireAllDead(t, []int{readPid(t, dir+"/p1"), readPid(t, dir+"/r")})
}

// TestReaperUnavailable: an agent that cannot start reapers keeps the process group and says so.
func TestReaperUnavailable(t *testing.T) {
	h := newHarness(t)
	h.env = []string{envNoReaper + "=1"}
	h.start()
	hl, err := h.cl.Health(context.Background())
	if err != nil || hl.KillScope != "process-group" {
		t.Fatalf("health %+v %v, want killScope process-group", hl, err)
	}
	out, _, res := run(t, h.cl, sbtypes.ExecRequest{Shell: "cat /proc/$PPID/cmdline"})
	if res.ExitCode != 0 || strings.HasPrefix(out, "airlock-exec-reaper") {
		t.Errorf("stdout %q result %+v: the command runs below a reaper", out, res)
	}
}

// aheadReaper runs an exec and returns the pid of the reaper h's agent then starts ahead for
// the next one.
func aheadReaper(t *testing.T, h *harness) int {
	t.Helper()
	run(t, h.cl, sbtypes.ExecRequest{Shell: "true"})
	var ahead int
	eventually(t, "a reaper waits for the next exec", func() bool {
		ahead = waitingReaper(h.proc.Process.Pid)
		return ahead > 0
	})
	return ahead
}

// waitingReaper returns the pid of an agent's child that is an exec reaper with no command
// below it (the one started ahead), or 0.
func waitingReaper(agent int) int {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", agent))
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, field := range strings.Fields(string(b)) {
			pid, err := strconv.Atoi(field)
			if err != nil {
				continue
			}
			cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if !strings.HasPrefix(string(cmd), "airlock-exec-reaper\x00") {
				continue
			}
			kids, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
			busy := false
			for _, k := range kids {
				if c, _ := os.ReadFile(k); len(strings.TrimSpace(string(c))) > 0 {
					busy = true
				}
			}
			if !busy {
				return pid
			}
		}
	}
	return 0
}
