package local

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// TestTerminateFrozenExecCgroup: an exec's cgroup frozen on its own (the agent freezes one while
// it kills it, and may be killed itself before it thaws it) does not keep its processes, and so
// the sandbox, alive past terminate: thawing the sandbox's cgroup alone leaves such a child
// frozen.
func TestTerminateFrozenExecCgroup(t *testing.T) {
	x := newBox(t, nil)
	pid := x.b.sessionInitPID(x.sess.ID)
	execDone := make(chan error, 1)
	go func() {
		_, err := x.a.Exec(context.Background(), sandbox.ExecRequest{Shell: "echo started; exec sleep 1000", Timeout: 5 * time.Minute}, io.Discard, io.Discard)
		execDone <- err
	}()
	// The exec's own cgroup, once its process is in it.
	var execCg string
	deadline := time.Now().Add(30 * time.Second)
	for execCg == "" {
		dirs, _ := filepath.Glob(x.cgroupFile("freezer", map[int]string{1: "exec-*", 2: "code/exec-*"}[x.b.cg.version()]))
		for _, d := range dirs {
			if b, err := os.ReadFile(filepath.Join(d, "cgroup.procs")); err == nil && strings.TrimSpace(string(b)) != "" {
				execCg = d
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the exec's cgroup never held its process")
		}
		time.Sleep(10 * time.Millisecond)
	}
	file, frozen := "freezer.state", "FROZEN"
	if x.b.cg.version() == 2 {
		file, frozen = "cgroup.freeze", "1"
	}
	if err := os.WriteFile(filepath.Join(execCg, file), []byte(frozen), 0); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := x.b.Terminate(ctx, x.sess.ID); err != nil {
		t.Fatalf("terminate with a frozen exec cgroup: %v", err)
	}
	assertGone(t, x.b, x.sess.ID, pid)
	select {
	case <-execDone:
	case <-time.After(30 * time.Second):
		t.Fatal("the exec call did not end with its sandbox")
	}
}

// TestKill: Kill ends every process of an adopted sandbox and leaves its remains, untouched by
// its own watcher, to the next process (airlock run hands them to its filler); a sandbox it
// made itself, or one it does not know, it terminates whole.
func TestKill(t *testing.T) {
	testutil.RequireRoot(t)
	stateDir := testStateDir(t)
	made := createInHelper(t, stateDir, 2) // their maker is gone, as a parked sandbox's filler is
	b := newTestBackendAt(t, stateDir)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Besides init, a process that only init's death kills (the kernel, when a pid
	// namespace's init exits): Kill must wait for that too.
	for _, h := range made {
		a, err := b.Connect(ctx, h.ID)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.(processStarter).StartProcess(ctx, client.ProcessRequest{ExecRequest: sandbox.ExecRequest{
			Argv: []string{"sleep", "1000"}, Timeout: 5 * time.Minute,
		}}); err != nil {
			t.Fatal(err)
		}
		a.Close()
	}
	if err := b.Pause(ctx, made[1].ID); err != nil {
		t.Fatal(err)
	}
	for i, h := range made {
		procs := cgroupProcs(t, b, h.ID)
		if len(procs) < 2 {
			t.Fatalf("sandbox %d: %v in its cgroup, want init and sleep", i, procs)
		}
		if err := b.kill(ctx, h.ID); err != nil {
			t.Fatalf("kill sandbox %d (paused: %v): %v", i, i == 1, err)
		}
		for _, p := range procs {
			pid, _ := strconv.Atoi(p)
			if st, err := readStat(pid); err == nil && st.State != 'Z' {
				t.Errorf("sandbox %d: process %d is still running (state %c) after Kill", i, pid, st.State)
			}
		}
	}
	b.Close() // its watchers are done: whatever they were to remove is removed
	for _, h := range made {
		if _, err := os.Stat(filepath.Join(stateDir, h.ID)); err != nil {
			t.Errorf("sandbox %s: its state dir went with Kill (%v); it is the next process's to remove", h.ID, err)
		}
	}
	next := newTestBackendAt(t, stateDir) // reaps them as broken sandboxes
	for _, h := range made {
		if !slices.Contains(next.reaped, h.ID) {
			t.Errorf("sandbox %s not reaped by the next New (reaped %v)", h.ID, next.reaped)
		}
		assertGone(t, next, h.ID, h.PID)
	}

	own, err := next.Create(ctx, hostDecl("kill-own"))
	if err != nil {
		t.Fatal(err)
	}
	pid := next.sessionInitPID(own.ID)
	if err := next.kill(ctx, own.ID); err != nil {
		t.Fatalf("kill a sandbox of its own: %v", err)
	}
	if _, err := os.Stat(filepath.Join(stateDir, own.ID)); !os.IsNotExist(err) {
		t.Errorf("a sandbox of its own is terminated whole by Kill; its state dir: %v", err)
	}
	assertGone(t, next, own.ID, pid)
	if err := next.kill(ctx, "s-0123456789abcdef"); err != nil {
		t.Errorf("kill an absent session: %v", err)
	}
}

// TestTerminateTwiceSkipsMountTable: terminating a sandbox terminated already succeeds without
// reading the host's mount table (a whole table parsed per call for a directory that is gone).
func TestTerminateTwiceSkipsMountTable(t *testing.T) {
	b := newTestBackend(t)
	ctx := context.Background()
	s, err := b.Create(ctx, hostDecl("twice"))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Terminate(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	saved := mountInfo
	mountInfo = filepath.Join(t.TempDir(), "no-mountinfo") // any read of it fails
	defer func() { mountInfo = saved }()
	if err := b.Terminate(ctx, s.ID); err != nil {
		t.Fatalf("second terminate: %v", err)
	}
}
