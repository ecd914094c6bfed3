package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/runcode/runcodetest"
)

// TestFrontRunsInSpares: installed as airlock next to airlock-full, the front hands the first
// run (nothing parked) to the full CLI, which creates its sandbox and starts the filler; the
// next runs it serves itself from the spares, with the full CLI's output and exit statuses,
// text and JSON, and nothing of any run or spare is left at the end.
func TestFrontRunsInSpares(t *testing.T) {
	testutil.RequireRoot(t)
	agent, cleanup, err := runcodetest.BuildAgent()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	dir := t.TempDir()
	for _, b := range []struct{ out, pkg string }{{"airlock", "."}, {"airlock-full", "../airlock-full"}} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, b.out), b.pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}
	// The full CLI through a stand-in that logs each start's first argument.
	calls := filepath.Join(dir, "calls")
	wrapper := filepath.Join(dir, "full-logged")
	if err := os.WriteFile(wrapper, []byte("#!/bin/sh\necho \"$1\" >> "+calls+"\nexec "+filepath.Join(dir, "airlock-full")+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	stateDir, parent := runcodetest.StateDir(t), runcodetest.CgroupParent(t)
	env := append(os.Environ(), "AIRLOCK_AGENT="+agent, envFull+"="+wrapper, "AIRLOCK_SPARES=1")
	fillers := func() bool { return len(testutil.SpareFillers(stateDir)) == 0 }
	t.Cleanup(func() {
		waitUntil(t, "the fillers to exit", fillers)
		b, err := local.New(context.Background(), local.Options{StateDir: stateDir, CgroupParent: parent, AgentPath: agent})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		if _, err := b.RetireSpares(context.Background(), false); err != nil {
			t.Errorf("retiring the spares: %v", err)
		}
		list, _ := b.List(context.Background())
		for _, s := range list {
			t.Errorf("sandbox %s outlived its run", s.ID)
			_ = b.Terminate(context.Background(), s.ID)
		}
	})
	airlock := func(args ...string) (int, string, string) {
		t.Helper()
		cmd := exec.Command(filepath.Join(dir, "airlock"), append(args, "--state-dir", stateDir, "--cgroup-parent", parent)...)
		cmd.Env = env
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, stdout.String(), stderr.String()
	}
	fullRuns := func() int {
		b, _ := os.ReadFile(calls)
		return strings.Count(string(b), "run\n")
	}
	parked := func() bool {
		ents, _ := os.ReadDir(filepath.Join(stateDir, "spares"))
		for _, e := range ents {
			if idx, err := os.ReadDir(filepath.Join(stateDir, "spares", e.Name())); err == nil && strings.HasPrefix(e.Name(), "image-") && len(idx) > 0 {
				return true
			}
		}
		return false
	}

	if code, out, errs := airlock("run", "-c", "print(6*7)"); code != 0 || out != "42\n" {
		t.Fatalf("first run: %d %q %q", code, out, errs)
	}
	if fullRuns() != 1 {
		t.Fatalf("the first run (nothing parked) was not handed to the full CLI: %d full runs", fullRuns())
	}
	for i, tc := range []struct {
		args   []string
		code   int
		stdout string
		json   bool
	}{
		{args: []string{"run", "-c", "print(6*7)"}, stdout: "42\n"},
		{args: []string{"run", "-c", "import sys; print('out'); sys.exit(3)"}, code: 3, stdout: "out\n"},
		{args: []string{"-o", "json", "run", "-c", "print('j')"}, stdout: "j\n", json: true},
		{args: []string{"run", "--lang", "bash", "-c", "echo $((6*7))"}, stdout: "42\n"},
	} {
		waitUntil(t, "a parked spare", func() bool { return fillers() && parked() })
		code, out, errs := airlock(tc.args...)
		if tc.json {
			var res struct {
				ExitCode int    `json:"exit_code"`
				Stdout   string `json:"stdout"`
				Memory   string `json:"memory"`
			}
			if err := json.Unmarshal([]byte(out), &res); err != nil || res.ExitCode != tc.code || res.Stdout != tc.stdout || res.Memory != "512Mi" {
				t.Errorf("run %d %q: %d %q %q (%v)", i, tc.args, code, out, errs, err)
			}
		} else if code != tc.code || out != tc.stdout {
			t.Errorf("run %d %q: %d %q %q, want %d %q", i, tc.args, code, out, errs, tc.code, tc.stdout)
		}
		if fullRuns() != 1 {
			t.Fatalf("run %d %q with a spare parked went to the full CLI", i, tc.args)
		}
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestInstallAll: `go install ./cmd/...` installs every binary under the name the others look
// for: the installed airlock, with nothing set to point it anywhere and no airlock on PATH,
// finds the full CLI beside it, which runs the code and leaves nothing behind.
func TestInstallAll(t *testing.T) {
	testutil.RequireRoot(t)
	gobin := t.TempDir()
	install := exec.Command("go", "install", "github.com/airlock-sandbox/airlock/cmd/...")
	install.Env = append(os.Environ(), "GOBIN="+gobin, "CGO_ENABLED=0")
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("go install ./cmd/...: %v\n%s", err, out)
	}
	for _, name := range []string{"airlock", "airlock-full", "airlock-agent", "airlock-server", "airlock-operator"} {
		if _, err := os.Stat(filepath.Join(gobin, name)); err != nil {
			t.Errorf("go install ./cmd/... installed no %s: %v", name, err)
		}
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AIRLOCK_") && !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	// No spares: nothing outlives the run (the front hands it to the full CLI, whose path
	// this is about), and PATH without gobin: the siblings are found beside the executable.
	env = append(env, "AIRLOCK_SPARES=0", "PATH=/usr/local/bin:/usr/bin:/bin")
	stateDir, parent := runcodetest.StateDir(t), runcodetest.CgroupParent(t)
	run := exec.Command(filepath.Join(gobin, "airlock"), "run", "--state-dir", stateDir, "--cgroup-parent", parent, "-c", "print(42)")
	run.Env = env
	var stdout, stderr bytes.Buffer
	run.Stdout, run.Stderr = &stdout, &stderr
	if err := run.Run(); err != nil || stdout.String() != "42\n" {
		t.Fatalf("installed airlock run: %v, stdout %q, stderr %s", err, stdout.String(), stderr.String())
	}
	b, err := local.New(context.Background(), local.Options{StateDir: stateDir, CgroupParent: parent})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if list, _ := b.List(context.Background()); len(list) != 0 {
		t.Errorf("%d sandboxes outlived the run", len(list))
	}
}
