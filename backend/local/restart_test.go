package local

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/backend/local/sessions"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/sandbox"
)

type helperSession struct {
	ID  string `json:"id"`
	PID int    `json:"pid"`
}

// createInHelper runs the test binary as another process that creates n sandboxes in
// stateDir, then SIGKILLs it mid-session and returns what it had created.
func createInHelper(t *testing.T, stateDir string, n int) []helperSession {
	t.Helper()
	cmd, got := startHelper(t, stateDir, n)
	// The creating process dies without any chance to clean up.
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	return got
}

// startHelper runs the test binary as another process that creates n sandboxes in stateDir
// and waits; it returns the process (the caller kills and waits for it) and what it created.
func startHelper(t *testing.T, stateDir string, n int) (*exec.Cmd, []helperSession) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1", "AIRLOCK_HELPER_STATE="+stateDir,
		"AIRLOCK_HELPER_AGENT="+agentBin, fmt.Sprintf("AIRLOCK_HELPER_COUNT=%d", n))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var got []helperSession
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		if line == "ready" {
			break
		}
		var hs helperSession
		if err := json.Unmarshal([]byte(line), &hs); err != nil {
			continue // test framework chatter
		}
		got = append(got, hs)
	}
	if len(got) != n {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("helper created %d sandboxes, want %d", len(got), n)
	}
	return cmd, got
}

// TestReconcileExitedInit: a sandbox whose init has exited but is not yet reaped (what a run's
// filler finds right after the run killed its parked sandbox) is reaped as broken, not asked for an
// agent that is gone and reported as one that "does not answer".
func TestReconcileExitedInit(t *testing.T) {
	testutil.RequireRoot(t)
	stateDir := testStateDir(t)
	cmd, hs := startHelper(t, stateDir, 1)
	dead := hs[0]
	// The creator, stopped, cannot reap its init: killed, init stays a zombie.
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	// SIGSTOP takes each thread as it next leaves the kernel: until all are stopped, one could
	// still reap init (CI saw it once).
	waitStopped(t, cmd.Process.Pid)
	if err := unix.Kill(dead.PID, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if st, err := readStat(dead.PID); err != nil || st.State == 'Z' {
			if err != nil {
				t.Fatalf("init %d was reaped: the test needs it a zombie (%v)", dead.PID, err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("init %d did not exit", dead.PID)
		}
	}
	var logs testutil.SyncBuffer
	b, err := New(context.Background(), Options{StateDir: stateDir, AgentPath: agentBin, ImageCacheDir: filepath.Join(stateDir, "images"),
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if strings.Contains(logs.String(), "does not answer") || !strings.Contains(logs.String(), "reaped broken sandbox") {
		t.Errorf("the dead sandbox was not reaped as broken:\n%s", logs.String())
	}
	assertGone(t, b, dead.ID, dead.PID)
}

// waitStopped waits until every thread of process pid is stopped (stat state T).
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
		if err != nil || len(tasks) == 0 {
			t.Fatalf("threads of %d: %v", pid, err)
		}
		stopped := 0
		for _, task := range tasks {
			f, err := os.Open(task)
			if err != nil {
				stopped++ // exited
				continue
			}
			st, err := sessions.ParseStat(f)
			f.Close()
			if err == nil && st.State == 'T' {
				stopped++
			}
		}
		if stopped == len(tasks) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d: %d of %d threads stopped after SIGSTOP", pid, stopped, len(tasks))
		}
	}
}

// nsInode is the inode of a process's namespace link (net, mnt, ...).
func nsInode(t *testing.T, pid int, ns string) string {
	t.Helper()
	l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// nsHolders lists the host processes still in namespace link (e.g. "net:[4026532]").
func nsHolders(ns, link string) []string {
	var holders []string
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		if l, err := os.Readlink(filepath.Join(p, "ns", ns)); err == nil && l == link {
			holders = append(holders, filepath.Base(p))
		}
	}
	return holders
}

// liveAndBroken has another process create two sandboxes in a new state dir and die; then the
// second one breaks while no process watches it: its init dies.
func liveAndBroken(t *testing.T) (stateDir string, live, broken helperSession) {
	t.Helper()
	testutil.RequireRoot(t)
	stateDir = testStateDir(t)
	hs := createInHelper(t, stateDir, 2)
	live, broken = hs[0], hs[1]
	if err := unix.Kill(broken.PID, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	return stateDir, live, broken
}

func TestRestartAdopts(t *testing.T) {
	ctx := context.Background()
	stateDir, live, broken := liveAndBroken(t)
	netns, mntns := nsInode(t, live.PID, "net"), nsInode(t, live.PID, "mnt")

	b := newTestBackendAt(t, stateDir)
	if _, err := b.Get(ctx, broken.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("Get of the broken sandbox after restart: %v, want ErrNotFound", err)
	}
	assertGone(t, b, broken.ID, broken.PID)

	sess, err := b.Get(ctx, live.ID)
	if err != nil {
		t.Fatalf("the live sandbox was not adopted: %v", err)
	}
	if sess.State != sandbox.StateRunning {
		t.Errorf("adopted session state %q", sess.State)
	}
	list, err := b.List(ctx)
	if err != nil || len(list) != 1 || list[0].ID != live.ID {
		t.Errorf("List after restart = %v, %v; want only %s", list, err, live.ID)
	}
	a, err := b.Connect(ctx, live.ID)
	if err != nil {
		t.Fatal(err)
	}
	out, _, res := run(t, a, "echo adopted; sleep 1000 & echo bg")
	a.Close()
	if out != "adopted\nbg\n" || res.ExitCode != 0 {
		t.Fatalf("exec in the adopted sandbox: %q %+v", out, res)
	}

	if err := b.Terminate(ctx, live.ID); err != nil {
		t.Fatal(err)
	}
	assertGone(t, b, live.ID, live.PID)
	if h := nsHolders("net", netns); len(h) > 0 {
		t.Errorf("processes %v still in the sandbox's network namespace %s", h, netns)
	}
	if h := nsHolders("mnt", mntns); len(h) > 0 {
		t.Errorf("processes %v still in the sandbox's mount namespace %s", h, mntns)
	}
	if left := stateLeftovers(stateDir); len(left) > 0 {
		t.Errorf("state dir holds %v after terminating everything", left)
	}
}

// TestReconcileOrphanCgroup: a cgroup under this backend's parent without a state dir (the
// creating process died between making it and writing anything) is reaped by New.
func TestReconcileOrphanCgroup(t *testing.T) {
	testutil.RequireRoot(t)
	stateDir := testStateDir(t)
	b := newTestBackendAt(t, stateDir)
	id, _ := newSessionID()
	if _, err := b.cg.create(id, limits{CPUMillis: 100, MemoryBytes: 64 << 20, MaxProcesses: 8}); err != nil {
		t.Fatal(err)
	}
	// A process inside it, as if init had been started.
	cmd := exec.Command("sleep", "1000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	cg, err := b.cg.load(id)
	if err != nil {
		t.Fatal(err)
	}
	if err := cg.addProc(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	b.Close()
	b2, err := New(context.Background(), Options{StateDir: stateDir, AgentPath: agentBin})
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the process in the orphan cgroup survived reconcile")
	}
	if left := leftovers(b2, id, 0); len(left) > 0 {
		t.Errorf("orphan cgroup left %v", left)
	}
	if !strings.HasPrefix(b2.opts.CgroupParent, "airlock-") {
		t.Errorf("a test state dir must not share the default cgroup parent, got %q", b2.opts.CgroupParent)
	}
}

// TestOneShotDefersReconcile: a one-shot New (airlock run with parked sandboxes: its filler reconciles
// right after it) reaps nothing and adopts nothing up front, yet finds a live sandbox by id;
// the next plain New reaps what was broken. On a state dir with no master secret yet it makes
// one, under the lock, and reconciles as usual.
func TestOneShotDefersReconcile(t *testing.T) {
	ctx := context.Background()
	stateDir, live, broken := liveAndBroken(t)
	opts := Options{StateDir: stateDir, AgentPath: agentBin, ImageCacheDir: filepath.Join(stateDir, "images"), OneShot: true}
	d, err := New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Reaped()) != 0 {
		t.Errorf("the one-shot New reaped %v", d.Reaped())
	}
	if _, err := os.Stat(filepath.Join(stateDir, broken.ID)); err != nil {
		t.Errorf("the broken sandbox's state is gone after the deferring New: %v", err)
	}
	if d.known(live.ID) != nil {
		t.Errorf("the one-shot New adopted %s up front", live.ID)
	}
	if _, err := d.Get(ctx, live.ID); err != nil {
		t.Errorf("Get of the live sandbox through the one-shot New: %v", err)
	}
	d.Close()

	b := newTestBackendAt(t, stateDir) // reconciles: reaps the broken one, adopts the live one
	assertGone(t, b, broken.ID, broken.PID)
	if err := b.Terminate(ctx, live.ID); err != nil {
		t.Fatal(err)
	}
	assertGone(t, b, live.ID, live.PID)

	fresh := testStateDir(t)
	opts.StateDir, opts.ImageCacheDir = fresh, filepath.Join(fresh, "images")
	f, err := New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := os.Stat(filepath.Join(fresh, masterFile)); err != nil {
		t.Errorf("a one-shot New on a new state dir made no master secret: %v", err)
	}
}
