package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/backend/local/sessions"
	"github.com/airlock-sandbox/airlock/internal/cli"
	"github.com/airlock-sandbox/airlock/internal/runcli"
	"github.com/airlock-sandbox/airlock/internal/sched"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/runcode/core"
	"github.com/airlock-sandbox/airlock/spec"
)

// useParked turns parked sandboxes on for the test's runs (their filler is this test binary run as the
// CLI) and, when it ends, waits for the fillers to exit and terminates the parked sandboxes they parked.
func (e runtimeEnv) useParked(t *testing.T) {
	t.Helper()
	t.Setenv(runcli.EnvPool, "1")
	t.Setenv("AIRLOCK_CLI_TEST_EXEC", "1")
	t.Cleanup(func() {
		waitFor(t, "the fillers to exit", func() bool { return len(testutil.PoolFillers(e.stateDir)) == 0 })
		b := e.open(t)
		defer b.Close()
		// Parked parked sandboxes are their fillers' until claimed (List does not show them to this
		// process): claimed and terminated as airlock gc --pool does.
		if _, err := b.RetireParked(context.Background(), false); err != nil {
			t.Errorf("retiring the parked sandboxes: %v", err)
		}
	})
}

func (e runtimeEnv) parkedIndex(t *testing.T) string {
	t.Helper()
	key, err := local.PoolKey(parkedTemplate(spec.Image{Host: true}))
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(local.ParkedDir(e.stateDir), key)
}

// waitParked waits for a parked host-image parked sandbox and returns its session id, starting a filler
// when none is parked or running.
func (e runtimeEnv) waitParked(t *testing.T) string {
	t.Helper()
	var id string
	deadline := time.Now().Add(60 * time.Second)
	for started := false; ; {
		ents, _ := os.ReadDir(e.parkedIndex(t))
		if len(ents) > 0 {
			id = ents[0].Name()
			break
		}
		if !started && len(testutil.PoolFillers(e.stateDir)) == 0 {
			if _, err := e.filler(t).Start(nil, false); err != nil {
				t.Fatal(err)
			}
			started = true
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(local.ParkedDir(e.stateDir), fillLog))
			t.Fatalf("no spare parked within 60s; filler log:\n%s", log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return id
}

// settledParked lists the parked sandboxes once the filler has stopped parking more (the same
// entries for 4 × sessions.ParkQuiet: it parks within ParkQuiet of the last claim, or of
// the previous park).
func (e runtimeEnv) settledParked(t *testing.T) []string {
	t.Helper()
	list := func() []string {
		ents, err := os.ReadDir(e.parkedIndex(t))
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, d := range ents {
			ids = append(ids, d.Name())
		}
		return ids
	}
	last, since := list(), time.Now()
	deadline := time.Now().Add(60 * time.Second)
	for time.Since(since) < 4*sessions.ParkQuiet || len(last) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the parked sandboxes did not settle within 60s: %v", last)
		}
		time.Sleep(20 * time.Millisecond)
		if now := list(); !slices.Equal(now, last) {
			last, since = now, time.Now()
		}
	}
	return last
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRunParkedLeaveStdoutAlone: the filler a run starts holds none of the run's standard
// streams (each is /dev/null), so a caller reading the run's output to its end gets EOF when
// the run exits, not when the filler does.
func TestRunParkedLeaveStdoutAlone(t *testing.T) {
	testutil.RequireRoot(t)
	env := newRuntimeEnv(t)
	env.useParked(t)
	checked := 0
	for i := 0; i < 5 && checked == 0; i++ { // later runs claim the parked sandboxes earlier ones parked
		if i > 0 {
			env.waitParked(t)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		cmd := exec.CommandContext(ctx, os.Args[0], append([]string{"run", "-c", "print(6*7)"}, env.flags()...)...)
		out, err := cmd.Output()
		expired := ctx.Err()
		cancel()
		if expired != nil || err != nil || string(out) != "42\n" {
			t.Fatalf("run %d: %q %v (context %v)", i, out, err, expired)
		}
		// The filler works for a while after the run is out (a create, python's start).
		for _, pid := range testutil.PoolFillers(env.stateDir) {
			for fd := range 3 {
				target, err := os.Readlink(filepath.Join("/proc", pid, "fd", strconv.Itoa(fd)))
				if err != nil {
					continue // it exited meanwhile
				}
				if target != "/dev/null" {
					t.Errorf("filler %s has fd %d on %s", pid, fd, target)
				}
				checked++
			}
		}
	}
	if checked == 0 {
		t.Fatal("no filler was seen running after any of 5 runs")
	}
}

// TestGCPool: gc --pool lists the parked sandboxes (--dry-run, which keeps them) and
// terminates them; the termination itself is backend/local's TestRetireParked.
func TestGCPool(t *testing.T) {
	testutil.RequireRoot(t)
	env := newRuntimeEnv(t)
	env.useParked(t)
	id := env.waitParked(t)
	waitFor(t, "the filler to exit", func() bool { return len(testutil.PoolFillers(env.stateDir)) == 0 })
	code, out, errs := cliIn(t, "", "gc", "--pool", "--dry-run", "--min-age", "1h", "--state-dir", env.stateDir)
	if code != 0 || !strings.Contains(out, "would terminate parked sandbox "+id+"\n") || !strings.Contains(out, "would terminate 1 parked sandboxes\n") {
		t.Fatalf("gc --pool --dry-run: %d %q %q", code, out, errs)
	}
	if _, err := os.Stat(filepath.Join(env.parkedIndex(t), id)); err != nil {
		t.Fatalf("the dry run took the parked sandbox: %v", err)
	}
	b := env.open(t)
	defer b.Close()
	ids, err := b.RetireParked(context.Background(), false)
	if err != nil || len(ids) != 1 || ids[0] != id {
		t.Fatalf("retire: %v %v", ids, err)
	}
}

// filler is the filler of the environment's host-image parked sandboxes: this test binary as the CLI.
func (e runtimeEnv) filler(t *testing.T) runcli.Filler {
	t.Helper()
	f, err := newFiller(&cli.BackendFlags{StateDir: e.stateDir, CgroupParent: e.parent}, spec.Image{Host: true}, 1)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestRunParkedInProcess: runcli.RunParked (airlock run's path with parked sandboxes, in both binaries)
// runs the code in the parked sandbox and returns only once every process of it is gone,
// handing its remains to the filler it starts with the parked sandbox's id; with nothing parked it runs
// nothing and says so.
func TestRunParkedInProcess(t *testing.T) {
	testutil.RequireRoot(t)
	env := newRuntimeEnv(t)
	env.useParked(t)
	parked := env.waitParked(t)
	waitFor(t, "the filler to exit", func() bool { return len(testutil.PoolFillers(env.stateDir)) == 0 })
	initPID := env.initPID(t, parked)
	// The filler is a script that records its arguments (whole, by a rename): the remains stay
	// for this test.
	dir := t.TempDir()
	argsFile := filepath.Join(dir, "args")
	script := filepath.Join(dir, "filler")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho \"$@\" > "+argsFile+".tmp && mv "+argsFile+".tmp "+argsFile+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	f := env.filler(t)
	f.Exe = script
	req, err := core.Normalize(core.Request{Language: "python", Code: "print(6*7)"})
	if err != nil {
		t.Fatal(err)
	}
	r := runcli.ParkedRun{StateDir: env.stateDir, ImageKey: imageKey(spec.Image{Host: true}), Req: req,
		Opts: core.Options{}, Filler: f, Log: slog.New(slog.DiscardHandler)}
	out, err := runcli.RunParked(t.Context(), r)
	if err != nil || !out.Ran || out.Result.Stdout != "42\n" || out.Result.ExitCode != 0 {
		t.Fatalf("run in the parked sandbox: %+v %v", out, err)
	}
	if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", initPID)); err == nil && !strings.Contains(string(st), ") Z ") {
		t.Errorf("the parked sandbox's init %d is alive after the run: %s", initPID, st)
	}
	waitFor(t, "the filler script", func() bool { _, err := os.Stat(argsFile); return err == nil })
	if args, _ := os.ReadFile(argsFile); !strings.Contains(string(args), "--terminate "+parked+" ") {
		t.Errorf("the filler got %q, want --terminate %s", args, parked)
	}
	if _, err := os.Stat(filepath.Join(env.stateDir, parked)); err != nil {
		t.Errorf("the remains are the filler's to remove, but the state dir is gone: %v", err)
	}
	b := env.open(t)
	defer b.Close()
	if err := b.Terminate(t.Context(), parked); err != nil { // what the filler does first
		t.Fatal(err)
	}
	if out, err := runcli.RunParked(t.Context(), r); err != nil || out.Ran || len(out.Discarded) != 0 {
		t.Fatalf("with nothing parked: %+v %v, want nothing run", out, err)
	}
}

// TestRunParkedKilledAtExit: a run that took a parked sandbox exits only once every process of it is
// gone (a detached child of the code too), and the filler it starts removes the rest. End to
// end, the init check would also pass were the filler quick enough to kill it first:
// TestRunParkedInProcess is the one that pins the run's own kill.
func TestRunParkedKilledAtExit(t *testing.T) {
	testutil.RequireRoot(t)
	env := newRuntimeEnv(t)
	env.useParked(t)
	id := env.waitParked(t)
	initPID := env.initPID(t, id)
	const marker = "987.654321" // the detached child's argument: findable on the host
	code := `import subprocess
subprocess.Popen(["sleep", "` + marker + `"], start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print("started")`
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, os.Args[0], append([]string{"run", "-c", code}, env.flags()...)...).Output()
	// First, before the filler it started can end them: the parked sandbox's init is PID 1 of its pid
	// namespace, so with it gone so is every process that was in the sandbox.
	initStat, initErr := os.ReadFile(fmt.Sprintf("/proc/%d/stat", initPID))
	if err != nil || string(out) != "started\n" {
		t.Fatalf("run: %q %v", out, err)
	}
	if _, err := os.Stat(filepath.Join(env.parkedIndex(t), id)); !os.IsNotExist(err) {
		t.Fatalf("the run did not take the parked sandbox %s: %v", id, err)
	}
	if initErr == nil && !strings.Contains(string(initStat), ") Z ") {
		t.Errorf("the parked sandbox's init %d outlived airlock run: %s", initPID, initStat)
	}
	if pids := processesWithArg(marker); len(pids) > 0 {
		t.Errorf("the code's detached child outlived airlock run: pids %v", pids)
	}

	waitFor(t, "the used parked sandbox's state dir to be removed", func() bool {
		_, err := os.Stat(filepath.Join(env.stateDir, id))
		return os.IsNotExist(err)
	})
	for _, ctrl := range []string{"pids", "memory", "freezer", ""} { // v1 hierarchies, v2's root
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", ctrl, env.parent, id)); !os.IsNotExist(err) {
			t.Errorf("the used parked sandbox's cgroup %s is left: %v", filepath.Join(ctrl, env.parent, id), err)
		}
	}
	waitFor(t, "the filler to exit", func() bool { return len(testutil.PoolFillers(env.stateDir)) == 0 })
	log, _ := os.ReadFile(filepath.Join(local.ParkedDir(env.stateDir), fillLog))
	for _, l := range strings.Split(string(log), "\n") {
		if strings.Contains(l, id) && strings.Contains(l, "failed") {
			t.Errorf("the filler failed on the used parked sandbox: %s", l)
		}
	}
}

// initPID reads the host pid of a sandbox's init from its record.
func (e runtimeEnv) initPID(t *testing.T, id string) int {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(e.stateDir, id, "session.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		InitPID int `json:"initPid"`
	}
	if err := json.Unmarshal(raw, &rec); err != nil || rec.InitPID <= 0 {
		t.Fatalf("the record of %s: %v %s", id, err, raw)
	}
	return rec.InitPID
}

// processesWithArg lists the host's processes with arg among their arguments (zombies have
// none: they hold nothing).
func processesWithArg(arg string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), "\x00"+arg+"\x00") {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestFillerWaitsForItsGate: a filler started gated (as airlock run starts it, while it kills
// its parked sandbox) does nothing with the state dir until its gate closes: not even the local runtime's
// start, which makes the state dir's master key.
func TestFillerWaitsForItsGate(t *testing.T) {
	testutil.RequireRoot(t)
	env := newRuntimeEnv(t)
	env.useParked(t)
	f := env.filler(t)
	f.Memory = "64Mi" // a run's --pool-memory, handed to its filler
	gate, err := f.Start(nil, true)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the filler to start", func() bool { return len(testutil.PoolFillers(env.stateDir)) == 1 })
	if args := processesWithArg("--pool-memory"); len(args) != 1 || !slices.Contains(processesWithArg("64Mi"), args[0]) {
		t.Errorf("the filler's processes with --pool-memory 64Mi among their arguments: %v, %v", args, processesWithArg("64Mi"))
	}
	// Every thread of the filler runs idle (SCHED_IDLE), before its gate opens and after (it
	// makes the parked sandboxes idle): a run as root under normal scheduling at nice 0 starts
	// it so; a run already niced (this suite run under nice) leaves it as its own, which the
	// filler inherits (Start).
	normal, own := sched.Normal()
	fillerIdle := normal && own == 0 && sched.Supported()
	filler, err := strconv.Atoi(testutil.PoolFillers(env.stateDir)[0])
	if err != nil {
		t.Fatal(err)
	}
	fillerThreads, err := sched.Threads(filler)
	if err != nil {
		t.Fatal(err)
	}
	for tid, th := range fillerThreads {
		if th.Idle != fillerIdle || th.Nice != own {
			t.Errorf("filler thread %d runs %+v before its gate opened, want idle %v at nice %d (this test runs at nice %d)", tid, th, fillerIdle, own, own)
		}
	}
	key := filepath.Join(env.stateDir, "master.key")
	for range 50 { // ungated, the runtime's start makes the key within a few ms of the filler's
		time.Sleep(10 * time.Millisecond)
		if _, err := os.Stat(key); err == nil {
			t.Fatal("the filler opened the runtime before its gate closed")
		}
	}
	if err := gate.Close(); err != nil {
		t.Fatal(err)
	}
	id := env.waitParked(t) // parked once the gate is closed
	// The parked sandbox it made runs under normal scheduling at the run's own nice (0 unless
	// the suite is niced), put back from the filler's idle before it was parked
	// (local.ParkOptions.Raise): its init, agent and pre-started python (the code's process to
	// be), every thread.
	procs := append([]int{env.initPID(t, id)}, descendants(env.initPID(t, id))...)
	if len(procs) < 2 {
		t.Fatalf("the parked sandbox's processes: %v, want init and the pre-started python at least", procs)
	}
	for _, pid := range procs {
		threads, err := sched.Threads(pid)
		if err != nil {
			t.Fatal(err)
		}
		for tid, th := range threads {
			if th.Idle || th.Nice != own {
				t.Errorf("parked sandbox process %d thread %d runs %+v, want normal at nice %d", pid, tid, th, own)
			}
		}
	}
}

// descendants lists the processes below pid (children, their children, ...).
func descendants(pid int) []int {
	parent := map[int]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if pp, err := strconv.Atoi(f[1]); err == nil {
			parent[p] = pp
		}
	}
	var out []int
	for p := range parent {
		for a, depth := parent[p], 0; a > 1 && depth < 64; a, depth = parent[a], depth+1 {
			if a == pid {
				out = append(out, p)
				break
			}
		}
	}
	return out
}

// TestRunTerminatesDiscardedParked: a parked sandbox the lean front claimed and could not use comes to
// this CLI, the same process, as --parked-discarded; the filler of its run terminates it. Left
// alone it would live on, claimed by a process that is still alive, until its lifetime ends.
func TestRunTerminatesDiscardedParked(t *testing.T) {
	testutil.RequireRoot(t)
	env := newRuntimeEnv(t)
	env.useParked(t)
	id := env.waitParked(t)
	waitFor(t, "the filler to exit", func() bool { return len(testutil.PoolFillers(env.stateDir)) == 0 })
	owner, err := sessions.SelfProc()
	if err != nil {
		t.Fatal(err)
	}
	if !sessions.Take(env.stateDir, filepath.Base(env.parkedIndex(t)), id, owner) {
		t.Fatalf("could not claim the parked sandbox %s", id)
	}
	args := append([]string{"--parked-discarded", id, "-c", "print(6*7)"}, env.flags()...)
	if code, out, errs := runCommand(t, "text", args, ""); code != 0 || out != "42\n" {
		t.Fatalf("run: %d %q %q", code, out, errs)
	}
	waitFor(t, "the discarded parked sandbox's state dir to be removed", func() bool {
		_, err := os.Stat(filepath.Join(env.stateDir, id))
		return os.IsNotExist(err)
	})
}
