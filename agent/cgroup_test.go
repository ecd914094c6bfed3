package agent_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/agent"
	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

// testCgroup creates a cgroup for one agent under hierarchy and removes it after the test
// (after the agent has stopped: cleanups run last-registered first).
func testCgroup(t *testing.T, hierarchy string) string {
	t.Helper()
	dir := filepath.Join(hierarchy, "airlock-test-"+randHex(4))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := syscall.Rmdir(dir); err != nil {
			t.Errorf("remove test cgroup %s: %v", dir, err)
		}
	})
	return dir
}

// cgroupKinds are the kill scopes this host can run: v1 freezer, and v2 where cgroup2 is
// mounted (here: the hybrid /sys/fs/cgroup/unified).
func cgroupKinds(t *testing.T) map[string]func(h *harness) string {
	t.Helper()
	testutil.RequireRoot(t)
	kinds := map[string]func(h *harness) string{}
	if _, err := os.Stat("/sys/fs/cgroup/freezer/tasks"); err == nil {
		kinds["cgroup-v1"] = func(h *harness) string {
			dir := testCgroup(t, "/sys/fs/cgroup/freezer")
			h.cfg.CgroupV1Freezer = dir
			return dir
		}
	}
	for _, mnt := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		if _, err := os.Stat(mnt + "/cgroup.subtree_control"); err == nil {
			kinds["cgroup-v2"] = func(h *harness) string {
				dir := testCgroup(t, mnt)
				h.cfg.CgroupV2 = dir
				return dir
			}
			break
		}
	}
	if len(kinds) == 0 {
		t.Fatal("no cgroup v1 freezer or cgroup v2 mount on this host")
	}
	return kinds
}

// killScopes are cgroupKinds and the subreaper, the scope of an agent without a cgroup (its
// setup gives an empty directory: there are no exec cgroups to be left over).
func killScopes(t *testing.T) map[string]func(h *harness) string {
	kinds := cgroupKinds(t)
	kinds["subreaper"] = func(h *harness) string { return t.TempDir() }
	return kinds
}

// execCgroups lists the exec cgroups left below base.
func execCgroups(t *testing.T, base string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(base, "exec-*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// treeScript starts a process tree built to escape a process-group kill: a setsid'd child, a
// double-forked setsid'd grandchild (its parent exits at once), a plain background child. It
// prints "ready" once every pid is on disk, then waits.
func treeScript(dir string) string {
	// The tree's output goes to /dev/null so that a survivor shows as a live pid, not as a
	// stream that never ends.
	return fmt.Sprintf(`cd %s
setsid sh -c 'echo $$ > p1; exec sleep 1000' >/dev/null 2>&1 &
sh -c 'setsid sh -c "echo \$\$ > p2; exec sleep 1001" &' >/dev/null 2>&1
sleep 1002 >/dev/null 2>&1 & echo $! > p3
while [ ! -s p1 ] || [ ! -s p2 ] || [ ! -s p3 ]; do sleep 0.01; done
echo ready
sleep 1003`, dir)
}

// killedAtDeadline runs script (it records its processes' pids in dir as p1, p2, p3, prints
// "ready" once they are up, then waits) with a deadline, and checks that the deadline killed
// every one of them and removed its exec cgroup below base.
func killedAtDeadline(ctx context.Context, t *testing.T, cl *client.Client, script func(dir string) string, timeout time.Duration, base string) {
	t.Helper()
	dir := t.TempDir()
	s, err := cl.ExecStream(ctx, sbtypes.ExecRequest{Shell: script(dir), Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	res, err := s.Wait(&out, nil)
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != "ready\n" {
		t.Fatalf("the processes were not all started before the deadline (slow host?): stdout %q", out.String())
	}
	if !res.TimedOut || res.Signal != "SIGKILL" {
		t.Errorf("result %+v, want timedOut SIGKILL", res)
	}
	requireAllDead(t, treePids(t, dir))
	if left := execCgroups(t, base); len(left) > 0 {
		t.Errorf("exec cgroups left: %v", left)
	}
}

func treePids(t *testing.T, dir string) []int {
	var pids []int
	for _, f := range []string{"p1", "p2", "p3"} {
		pids = append(pids, readPid(t, filepath.Join(dir, f)))
	}
	return pids
}

func requireAllDead(t *testing.T, pids []int) {
	t.Helper()
	// The kill returns only once the cgroup is empty, so this holds at once; polling only
	// allows for the zombie being reaped by whoever inherited it.
	for _, pid := range pids {
		if alive(pid) {
			eventually(t, fmt.Sprintf("pid %d gone", pid), func() bool { return !alive(pid) })
		}
	}
}

// TestCgroupKillV1Rounds: a v1 kill empties the exec cgroup from its listing alone when what is
// left stops forking once killed (no freeze: each costs the host a global freezer mutex and a
// static key patch), and falls back to freezing it each round, which also empties it.
func TestCgroupKillV1Rounds(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := os.Stat("/sys/fs/cgroup/freezer/tasks"); err != nil {
		t.Skip("no cgroup v1 freezer on this host")
	}
	// The fork loop starts a background sleep as fast as it can; each kill round catches some
	// sleeps forked before the loop's own SIGKILL arrived.
	forkLoop := func(dir string) string {
		return fmt.Sprintf(`cd %s; echo $$ > p1; sleep 1000 >/dev/null 2>&1 & echo $! > p2; sleep 1000 >/dev/null 2>&1 & echo $! > p3; echo ready; while :; do sleep 1000 >/dev/null 2>&1 & done`, dir)
	}
	for _, tc := range []struct {
		name   string
		script func(dir string) string
		rounds int
		frozen string // "never", "always", or "either" (a fork loop may outrun the listing rounds)
	}{
		// Rounds without limit: that the listing alone empties a tree that stops forking does not
		// depend on the dying processes leaving the listing within the default rounds' ~15 ms,
		// which a loaded host does not promise (they die at nice 19).
		{"tree, listing", treeScript, 1 << 20, "never"},
		{"tree, freezer", treeScript, 0, "always"},
		{"fork loop, listing first", forkLoop, agent.V1UnfrozenRounds, "either"},
		{"fork loop, freezer", forkLoop, 0, "always"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.env = []string{fmt.Sprintf("%s=%d", envUnfrozenRounds, tc.rounds)}
			base := testCgroup(t, "/sys/fs/cgroup/freezer")
			h.cfg.CgroupV1Freezer = base
			h.start()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			killedAtDeadline(ctx, t, h.cl, tc.script, 2*time.Second, base)
			n := strings.Count(h.stderr.String(), "freeze "+base+"/")
			if tc.frozen == "never" && n > 0 || tc.frozen == "always" && n == 0 {
				t.Errorf("%d freezes, want %s", n, tc.frozen)
			} else {
				t.Logf("%d freezes", n)
			}
		})
	}
}

// TestCgroupKill: nothing an exec started survives its deadline, its caller's disconnect, or
// its own end: setsid and double-fork included, and its cgroup is removed. The same holds for
// the subreaper, where there is no cgroup.
func TestCgroupKill(t *testing.T) {
	for kind, setup := range killScopes(t) {
		t.Run(kind, func(t *testing.T) {
			h := newHarness(t)
			base := setup(h)
			h.start()
			// A hang guard: a kill that does not work shows as a failed call, not a stuck suite.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			hl, err := h.cl.Health(ctx)
			if err != nil || hl.KillScope != kind {
				t.Fatalf("health %+v %v, want killScope %s", hl, err, kind)
			}

			t.Run("deadline", func(t *testing.T) {
				killedAtDeadline(ctx, t, h.cl, treeScript, 3*time.Second, base)
			})

			t.Run("disconnect", func(t *testing.T) {
				dir := t.TempDir()
				s, err := h.cl.ExecStream(ctx, sbtypes.ExecRequest{Shell: treeScript(dir), Timeout: time.Hour})
				if err != nil {
					t.Fatal(err)
				}
				ev, err := s.Next()
				if err != nil || ev.Output == nil || string(ev.Output.Data) != "ready\n" {
					t.Fatalf("first event %+v %v", ev, err)
				}
				pids := treePids(t, dir)
				for _, pid := range pids {
					if !alive(pid) {
						t.Fatalf("pid %d not running before the disconnect", pid)
					}
				}
				s.Close()
				requireAllDead(t, pids)
				eventually(t, "exec cgroup removed", func() bool { return len(execCgroups(t, base)) == 0 })
			})

			t.Run("leftovers die with the exec", func(t *testing.T) {
				dir := t.TempDir()
				out, _, res := run(t, h.cl, sbtypes.ExecRequest{Shell: fmt.Sprintf(`cd %s; setsid sleep 1000 >/dev/null 2>&1 & echo $! > p1; sh -c 'setsid sleep 1000 >/dev/null 2>&1 & echo $! > p2'; sleep 1000 >/dev/null 2>&1 & echo $! > p3; echo done`, dir)})
				if out != "done\n" || res.ExitCode != 0 || res.TimedOut {
					t.Fatalf("stdout %q result %+v", out, res)
				}
				requireAllDead(t, treePids(t, dir))
				if left := execCgroups(t, base); len(left) > 0 {
					t.Errorf("exec cgroups left: %v", left)
				}
			})

			t.Run("background process removal", func(t *testing.T) {
				dir := t.TempDir()
				p, err := h.cl.StartProcess(ctx, client.ProcessRequest{ExecRequest: sbtypes.ExecRequest{Shell: treeScript(dir), Timeout: time.Hour}})
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
				if err := h.cl.RemoveProcess(ctx, p.ID); err != nil {
					t.Fatal(err)
				}
				requireAllDead(t, treePids(t, dir))
				if left := execCgroups(t, base); len(left) > 0 {
					t.Errorf("exec cgroups left: %v", left)
				}
			})
		})
	}
}

// TestSocketGivenToItsUser: with SocketUID the socket belongs to that uid, still mode 0600,
// and the agent answers through it.
func TestSocketGivenToItsUser(t *testing.T) {
	testutil.RequireRoot(t)
	h := newHarness(t)
	const user = 65533
	h.cfg.CodeUID, h.cfg.CodeGID, h.cfg.AllowRootCode = 65534, 65534, false
	h.cfg.SocketUID = user
	h.start()
	sock := strings.TrimPrefix(h.cfg.Listen, "unix:")
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if uid := fi.Sys().(*syscall.Stat_t).Uid; uid != user || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket uid %d mode %v, want %d 0600", uid, fi.Mode().Perm(), user)
	}
	if _, err := h.cl.Health(context.Background()); err != nil {
		t.Errorf("health through the socket: %v", err)
	}
}

// TestCodeRunsUnprivileged: commands run as CodeUID/CodeGID with no supplementary groups and
// no capabilities, and cannot signal the agent.
func TestCodeRunsUnprivileged(t *testing.T) {
	testutil.RequireRoot(t)
	h := newHarness(t)
	h.cfg.CodeUID, h.cfg.CodeGID, h.cfg.AllowRootCode = 65534, 65534, false
	if err := os.Chmod(h.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	h.start()
	ctx := context.Background()
	out, _, res := run(t, h.cl, sbtypes.ExecRequest{Shell: "id -u; id -g; id -G; grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status | head -2"})
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if res.ExitCode != 0 || len(lines) < 5 || lines[0] != "65534" || lines[1] != "65534" || lines[2] != "65534" {
		t.Fatalf("identity %q %+v", out, res)
	}
	for _, l := range lines[3:] {
		if !strings.HasSuffix(l, "0000000000000000") {
			t.Errorf("capabilities not dropped: %s", l)
		}
	}
	_, errs, res := run(t, h.cl, sbtypes.ExecRequest{Shell: fmt.Sprintf("kill -9 %d", h.proc.Process.Pid)})
	if res.ExitCode == 0 {
		t.Errorf("code could signal the agent: %q", errs)
	}
	if _, err := h.cl.Health(ctx); err != nil {
		t.Fatalf("agent gone: %v", err)
	}
	// Files the API writes belong to the code's uid.
	if err := h.cl.WriteFile(ctx, "/owned", strings.NewReader("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := h.cl.Mkdir(ctx, "/d1/d2", 0); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"owned", "d1", "d1/d2"} {
		fi, err := os.Stat(filepath.Join(h.root, p))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != 65534 || st.Gid != 65534 {
			t.Errorf("%s owned by %d:%d, want 65534:65534", p, st.Uid, st.Gid)
		}
	}
}

// TestOOMKilled: an exec the kernel OOM-kills inside the sandbox's memory cgroup says so.
func TestOOMKilled(t *testing.T) {
	testutil.RequireRoot(t)
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	var memRel string
	sc := bufio.NewScanner(strings.NewReader(string(self)))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) == 3 && parts[1] == "memory" {
			memRel = parts[2]
		}
	}
	if memRel == "" {
		t.Skip("no cgroup v1 memory hierarchy on this host")
	}
	h := newHarness(t)
	h.cfg.CgroupV1Freezer = testCgroup(t, "/sys/fs/cgroup/freezer")
	// Below the test's own memory cgroup, so the limit nests inside whatever this session has.
	mem := testCgroup(t, filepath.Join("/sys/fs/cgroup/memory", memRel))
	if err := os.WriteFile(filepath.Join(mem, "memory.limit_in_bytes"), []byte("512M"), 0); err != nil {
		t.Fatal(err)
	}
	h.cfg.CgroupV1Memory = mem
	h.start()
	// The agent (and so every command) lives in the memory cgroup, as in a sandbox.
	if err := os.WriteFile(filepath.Join(mem, "cgroup.procs"), []byte(fmt.Sprint(h.proc.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Move the agent out before its cgroup is removed (if it is still running).
		_ = os.WriteFile(filepath.Join("/sys/fs/cgroup/memory", memRel, "cgroup.procs"), []byte(fmt.Sprint(h.proc.Process.Pid)), 0)
	})
	hl, err := h.cl.Health(context.Background())
	if err != nil || !hl.Features["oomDetection"] {
		t.Fatalf("health %+v %v: want oomDetection", hl, err)
	}
	// tail keeps the current line in memory; /dev/zero never ends it.
	_, _, res := run(t, h.cl, sbtypes.ExecRequest{Argv: []string{"tail", "-n", "1", "/dev/zero"}, Timeout: time.Minute})
	if !res.OOMKilled || res.Signal != "SIGKILL" || res.TimedOut {
		t.Errorf("result %+v, want oomKilled", res)
	}
	_, _, res = run(t, h.cl, sbtypes.ExecRequest{Shell: "kill -9 $$"})
	if res.OOMKilled {
		t.Errorf("a plain SIGKILL was reported as an OOM kill: %+v", res)
	}
	// The victim is not the exec's main process: the shell survives it and exits normally.
	out, _, res := run(t, h.cl, sbtypes.ExecRequest{Shell: "tail -n 1 /dev/zero; echo rc=$?", Timeout: time.Minute})
	if out != "rc=137\n" || res.ExitCode != 0 || !res.OOMKilled {
		t.Errorf("stdout %q result %+v, want the grandchild's OOM kill reported (oomKilled, exit 0)", out, res)
	}
	// Per exec: a later exec without an OOM kill is not marked by the earlier ones.
	if _, _, res := run(t, h.cl, sbtypes.ExecRequest{Shell: "exit 137"}); res.OOMKilled {
		t.Errorf("an exec with no OOM kill during it reported one: %+v", res)
	}
}

// fdHolder receives one descriptor over a unix socket, acknowledges it, and writes lateMarker
// into it after 10 s: a process of another exec keeping this exec's output open.
const fdHolder = `import socket, sys, time, os
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1]); s.listen(1)
print("listening", flush=True)
c, _ = s.accept()
_, fds, _, _ = socket.recv_fds(c, 1, 1)
c.sendall(b"k")
time.sleep(10)
os.write(fds[0], b"` + lateMarker + `\n")
`

// fdSender hands its stdout to the holder, waits for the acknowledgement, says so, and then
// exits or (argv[2] == "sleep") runs into its deadline.
const fdSender = `import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
socket.send_fds(s, [b"x"], [1])
s.recv(1)
print("sent", flush=True)
if sys.argv[2] == "sleep":
    time.sleep(1000)
`

const lateMarker = "LATE-MARKER"

// TestOutputNotHeldByAnotherExec: a process in another exec that got this exec's stdout (by
// SCM_RIGHTS) cannot keep this exec's call open past its end: once its own processes are dead
// (exit or deadline) the agent forwards what was written and sends the terminal frame. Without
// the bound the call would return only when the holder writes its marker, 10 s later.
func TestOutputNotHeldByAnotherExec(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	for kind, setup := range cgroupKinds(t) {
		t.Run(kind, func(t *testing.T) {
			h := newHarness(t)
			setup(h)
			h.start()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cases := []struct {
				name string
				mode string
				tty  bool
				to   time.Duration
			}{
				{"exit", "exit", false, time.Minute},
				{"deadline", "sleep", false, 2 * time.Second},
				{"tty exit", "exit", true, time.Minute},
			}
			for i, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					sock := filepath.Join(h.dir, fmt.Sprintf("holder%d.sock", i))
					p, err := h.cl.StartProcess(ctx, client.ProcessRequest{ExecRequest: sbtypes.ExecRequest{Argv: []string{"python3", "-c", fdHolder, sock}, Timeout: time.Minute}})
					if err != nil {
						t.Fatal(err)
					}
					defer func() {
						if err := h.cl.RemoveProcess(context.Background(), p.ID); err != nil {
							t.Errorf("remove holder: %v", err)
						}
					}()
					att, err := h.cl.Attach(ctx, p.ID, true)
					if err != nil {
						t.Fatal(err)
					}
					ev, err := att.Next()
					att.Close()
					if err != nil || ev.Output == nil || string(ev.Output.Data) != "listening\n" {
						t.Fatalf("holder: %+v %v", ev, err)
					}
					var out strings.Builder
					res, err := h.cl.Exec(ctx, sbtypes.ExecRequest{Argv: []string{"python3", "-c", fdSender, sock, tc.mode}, Timeout: tc.to, TTY: tc.tty}, &out, nil)
					if err != nil {
						t.Fatal(err)
					}
					if strings.Contains(out.String(), lateMarker) {
						t.Fatalf("the call waited for another exec's process holding its stdout: %q %+v", out.String(), res)
					}
					if !strings.HasPrefix(out.String(), "sent") {
						t.Errorf("output %q, want the sender's own line", out.String())
					}
					if tc.mode == "sleep" && !res.TimedOut {
						t.Errorf("result %+v, want timedOut", res)
					}
					if tc.mode == "exit" && (res.ExitCode != 0 || res.TimedOut) {
						t.Errorf("result %+v, want exit 0", res)
					}
				})
			}
		})
	}
}

// TestExecBornInItsCgroup: the command starts inside its own exec cgroup (its first
// instruction already runs there: no window to fork outside), and the agent's threads are all
// back in the sandbox's cgroup afterwards (the spawner thread left the exec cgroup).
func TestExecBornInItsCgroup(t *testing.T) {
	for kind, setup := range cgroupKinds(t) {
		t.Run(kind, func(t *testing.T) {
			h := newHarness(t)
			base := setup(h)
			h.start()
			// The spare's directory shows a moment before the agent offers it, so an exec in that
			// moment makes its own cgroup (and the spare waits for the next): count takes.
			took, offered := 0, 0
			for i := range 5 {
				// v1: from the second exec on, the spare cgroup made after the last one is
				// there to be taken (renamed to the exec's name).
				var spare string
				if kind == "cgroup-v1" && i > 0 {
					spare = waitSpare(t, base)
				}
				s, err := h.cl.ExecStream(context.Background(), sbtypes.ExecRequest{Argv: []string{"cat", "/proc/self/cgroup"}, Timeout: time.Minute})
				if err != nil {
					t.Fatal(err)
				}
				var out strings.Builder
				if res, err := s.Wait(&out, nil); err != nil || res.ExitCode != 0 {
					t.Fatalf("%+v %v", res, err)
				}
				want := "/" + filepath.Base(base) + "/exec-" + s.ID
				if kind == "cgroup-v2" {
					// Its cgroup namespace is rooted at its exec cgroup (where it is from
					// outside: below).
					want = "/"
				}
				if !cgroupHas(out.String(), kind, want) {
					t.Errorf("exec %s ran in\n%s\nwant its %s cgroup ending in %s", s.ID, out.String(), kind, want)
				}
				if spare != "" {
					offered++
					if spare == "spare-"+s.ID {
						took++
					}
				}
			}
			if offered > 0 && took == 0 {
				t.Errorf("no exec of %d took the spare cgroup made for it", offered)
			}
			if kind == "cgroup-v2" {
				// Seen from outside, the running command is in its exec cgroup, which holds it.
				s, err := h.cl.ExecStream(context.Background(), sbtypes.ExecRequest{Shell: "echo up; exec sleep 30", Timeout: 20 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				if ev, err := s.Next(); err != nil || ev.Output == nil || string(ev.Output.Data) != "up\n" {
					t.Fatalf("first event %+v %v", ev, err)
				}
				dir := filepath.Join(base, "exec-"+s.ID)
				procs, err := os.ReadFile(dir + "/cgroup.procs")
				pids := strings.Fields(string(procs))
				if err != nil || len(pids) != 1 {
					t.Fatalf("%s holds %v (%v), want the command", dir, pids, err)
				}
				b, err := os.ReadFile("/proc/" + pids[0] + "/cgroup")
				if err != nil || !cgroupHas(string(b), kind, "/"+filepath.Base(base)+"/exec-"+s.ID) {
					t.Errorf("the command %s is in\n%s(%v)\nwant %s", pids[0], b, err, dir)
				}
				s.Close()
			}
			defer func() {
				// Stopped, the agent leaves no cgroup behind, spare included.
				h.stop()
				if left, _ := filepath.Glob(filepath.Join(base, "*-*")); len(left) > 0 {
					t.Errorf("cgroups left after the agent stopped: %v", left)
				}
			}()
			tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/cgroup", h.proc.Process.Pid))
			if err != nil || len(tasks) == 0 {
				t.Fatal(tasks, err)
			}
			for _, task := range tasks {
				b, err := os.ReadFile(task)
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(string(b), "/exec-") {
					t.Errorf("agent thread %s is still in an exec cgroup:\n%s", task, b)
				}
			}
		})
	}
}

// waitSpare waits for the agent's one spare exec cgroup below base and returns its name.
func waitSpare(t *testing.T, base string) string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		m, err := filepath.Glob(filepath.Join(base, "spare-*"))
		if err != nil {
			t.Fatal(err)
		}
		if len(m) > 1 {
			t.Fatalf("%d spare cgroups, want at most 1: %v", len(m), m)
		}
		if len(m) == 1 {
			return filepath.Base(m[0])
		}
	}
	t.Fatal("no spare exec cgroup appeared")
	return ""
}

// cgroupHas reports whether /proc/<pid>/cgroup text places the process in a cgroup whose path
// ends in suffix, in the freezer hierarchy (v1) or the unified one (v2).
func cgroupHas(text, kind, suffix string) bool {
	for _, l := range strings.Split(text, "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) != 3 {
			continue
		}
		v1 := kind == "cgroup-v1" && parts[1] == "freezer"
		v2 := kind == "cgroup-v2" && parts[0] == "0" && parts[1] == ""
		if (v1 || v2) && strings.HasSuffix(parts[2], suffix) {
			return true
		}
	}
	return false
}

// TestExecCgroupRecycled (v1): an exec that ends with nothing left in its cgroup hands the
// cgroup on as the next spare (the same kernel directory, renamed: no rmdir and mkdir per
// exec), while the cgroup of an exec that was killed (frozen for the kill) or that left
// processes behind is removed and the spare made anew.
func TestExecCgroupRecycled(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := os.Stat("/sys/fs/cgroup/freezer/tasks"); err != nil {
		t.Fatal("no cgroup v1 freezer on this host")
	}
	h := newHarness(t)
	base := testCgroup(t, "/sys/fs/cgroup/freezer")
	h.cfg.CgroupV1Freezer = base
	h.start()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// inode of a cgroup directory: the kernel gives every new one a new number.
	ino := func(dir string) uint64 {
		t.Helper()
		var st syscall.Stat_t
		if err := syscall.Stat(dir, &st); err != nil {
			t.Fatal(err)
		}
		return st.Ino
	}
	tests := []struct {
		name     string
		req      sbtypes.ExecRequest
		finish   func(w io.WriteCloser)
		timedOut bool
		recycled bool
	}{
		{"clean exit", sbtypes.ExecRequest{Argv: []string{"cat"}, Timeout: time.Minute}, func(w io.WriteCloser) { w.Close() }, false, true},
		{"deadline kill", sbtypes.ExecRequest{Argv: []string{"cat"}, Timeout: 300 * time.Millisecond}, nil, true, false},
		{"leftover process", sbtypes.ExecRequest{Shell: "setsid sleep 1000 >/dev/null 2>&1 </dev/null & read x", Timeout: time.Minute}, func(w io.WriteCloser) { w.Close() }, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if ctx.Err() != nil {
				t.Fatal(ctx.Err())
			}
			pr, pw := io.Pipe()
			defer pw.Close()
			tc.req.Stdin = pr
			s, err := h.cl.ExecStream(ctx, tc.req)
			if err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(base, "exec-"+s.ID)
			running := ino(dir)
			if tc.finish != nil {
				tc.finish(pw)
			}
			res, err := s.Wait(nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if res.TimedOut != tc.timedOut {
				t.Fatalf("result %+v, want timedOut %v", res, tc.timedOut)
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("exec cgroup %s still there after the exec: %v", dir, err)
			}
			spare := filepath.Join(base, waitSpare(t, base))
			if got := ino(spare) == running; got != tc.recycled {
				t.Errorf("spare %s is the exec's cgroup: %v, want %v", spare, got, tc.recycled)
			}
			if b, err := os.ReadFile(spare + "/freezer.state"); err != nil || strings.TrimSpace(string(b)) != "THAWED" {
				t.Errorf("spare freezer.state %q %v, want THAWED", b, err)
			}
			if b, err := os.ReadFile(spare + "/tasks"); err != nil || len(b) != 0 {
				t.Errorf("spare tasks %q %v, want none", b, err)
			}
		})
	}
	// The recycled cgroup works as a fresh one: the next exec is born in it.
	s, err := h.cl.ExecStream(ctx, sbtypes.ExecRequest{Argv: []string{"cat", "/proc/self/cgroup"}, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if res, err := s.Wait(&out, nil); err != nil || res.ExitCode != 0 {
		t.Fatalf("%+v %v", res, err)
	}
	if !cgroupHas(out.String(), "cgroup-v1", "/"+filepath.Base(base)+"/exec-"+s.ID) {
		t.Errorf("exec %s ran in\n%s", s.ID, out.String())
	}
}
