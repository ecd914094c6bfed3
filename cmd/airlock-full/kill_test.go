package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// startRun starts airlock run as a process of its own with args (and the environment's
// flags), and returns it once the code has printed its first line.
func (e runtimeEnv) startRun(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], append(append([]string{"run"}, args...), e.flags()...)...)
	cmd.Env = append(os.Environ(), "AIRLOCK_CLI_TEST_EXEC=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "up\n" {
		t.Fatalf("the run's first line: %q %v", line, err)
	}
	return cmd
}

// sessions lists the session directories in the state dir.
func (e runtimeEnv) sessions(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir(e.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range ents {
		if _, err := os.Stat(filepath.Join(e.stateDir, d.Name(), "session.json")); err == nil {
			ids = append(ids, d.Name())
		}
	}
	return ids
}

// TestColdRunKilledIsReaped: a cold airlock run SIGKILLed mid-run leaves its one-shot sandbox
// running (nothing of the CLI is left to end it), and the next run on the same state dir
// reaps it instead of adopting it as live; gc's dry run lists it (issue 25).
func TestColdRunKilledIsReaped(t *testing.T) {
	testutil.RequireRoot(t)
	env := newRuntimeEnv(t)
	run := env.startRun(t, "--spares", "0", "--timeout", "300s", "-c", "import time\nprint('up', flush=True)\ntime.sleep(600)")
	ids := env.sessions(t)
	if len(ids) != 1 {
		t.Fatalf("sessions during the run: %v, want one", ids)
	}
	initPID := env.initPID(t, ids[0])
	if err := run.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = run.Wait()
	// The sandbox outlives the CLI (its agent ends the exec whose caller went away, not the
	// sandbox): what the next run must reap.
	if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", initPID)); err != nil || strings.Contains(string(st), ") Z ") {
		t.Fatalf("the sandbox's init %d ended with the CLI: nothing left to reap (%v)", initPID, err)
	}
	stale, err := local.StaleSessions(env.stateDir)
	if err != nil || !slices.Contains(stale, ids[0]) {
		t.Errorf("StaleSessions (gc --dry-run) = %v %v, want the killed run's session %s", stale, err, ids[0])
	}
	if code, out, errs := runCLI(t, append([]string{"run", "--spares", "0", "-c", "print(1)"}, env.flags()...)...); code != 0 || out != "1\n" {
		t.Fatalf("the next run: %d %q %q", code, out, errs)
	}
	if slices.Contains(env.sessions(t), ids[0]) {
		t.Errorf("the killed run's session %s outlived the next run's reconcile", ids[0])
	}
	waitFor(t, "the killed run's sandbox to be gone", func() bool {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", initPID))
		return err != nil || strings.Contains(string(st), ") Z ")
	})
}

// TestSpareRunKilledKeepsItsDeadline: airlock run in a parked spare, SIGKILLed mid-run, still
// has its code killed at its --timeout: the deadline is the agent's, inside the sandbox, not
// the CLI's (issue 25: the code ran on until the spare's lifetime, 11 minutes).
func TestSpareRunKilledKeepsItsDeadline(t *testing.T) {
	testutil.RequireRoot(t)
	env := newRuntimeEnv(t)
	env.useSpares(t)
	id := env.waitSpare(t)
	const marker = "765.43219"
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGHUP} {
		t.Run(sig.String(), func(t *testing.T) {
			if sig != syscall.SIGKILL {
				id = env.waitSpare(t)
			}
			run := env.startRun(t, "--timeout", "3s", "-c",
				"import subprocess, time\nsubprocess.Popen(['sleep', '"+marker+"'])\nprint('up', flush=True)\ntime.sleep(600)")
			if _, err := os.Stat(filepath.Join(env.spareIndex(t), id)); !os.IsNotExist(err) {
				t.Fatalf("the run did not take the parked spare %s: %v", id, err)
			}
			if err := run.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			err := run.Wait()
			if sig == syscall.SIGHUP {
				// A closed terminal ends the run as SIGTERM does: the CLI exits (not killed by
				// the signal) having ended the code.
				if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() < 0 {
					t.Errorf("after SIGHUP the run ended %v, want an exit of its own", err)
				}
			}
			waitFor(t, "the code to be killed at its deadline", func() bool { return len(processesWithArg(marker)) == 0 })
		})
	}
}
