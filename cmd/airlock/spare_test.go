package main

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/internal/cli"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/spec"
)

// useSpares turns spares on for the test's runs (their filler is this test binary run as the
// CLI) and, when it ends, waits for the fillers to exit and terminates the spares they parked.
func (e runtimeEnv) useSpares(t *testing.T) {
	t.Helper()
	t.Setenv(envSpares, "1")
	t.Setenv("AIRLOCK_CLI_TEST_EXEC", "1")
	t.Cleanup(func() {
		waitFor(t, "the fillers to exit", func() bool { return len(testutil.SpareFillers(e.stateDir)) == 0 })
		b := e.open(t)
		defer b.Close()
		// Parked spares are their fillers' until claimed (List does not show them to this
		// process): claimed and terminated as airlock gc --spares does.
		if _, err := b.RetireSpares(context.Background(), false); err != nil {
			t.Errorf("retiring the spares: %v", err)
		}
	})
}

func (e runtimeEnv) spareIndex(t *testing.T) string {
	t.Helper()
	key, err := local.SpareKey(spareTemplate(spec.Image{Host: true}))
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(local.SparesDir(e.stateDir), key)
}

// waitSpare waits for a parked host-image spare and returns its session id, starting a filler
// when none is parked or running.
func (e runtimeEnv) waitSpare(t *testing.T) string {
	t.Helper()
	var id string
	deadline := time.Now().Add(60 * time.Second)
	for started := false; ; {
		ents, _ := os.ReadDir(e.spareIndex(t))
		if len(ents) > 0 {
			id = ents[0].Name()
			break
		}
		if !started && len(testutil.SpareFillers(e.stateDir)) == 0 {
			if err := startFiller(&cli.BackendFlags{StateDir: e.stateDir, CgroupParent: e.parent}, spec.Image{Host: true}, 1); err != nil {
				t.Fatal(err)
			}
			started = true
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(local.SparesDir(e.stateDir), fillLog))
			t.Fatalf("no spare parked within 60s; filler log:\n%s", log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return id
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

// TestRunSparesLeaveStdoutAlone: the filler a run starts holds none of the run's standard
// streams (each is /dev/null), so a caller reading the run's output to its end gets EOF when
// the run exits, not when the filler does.
func TestRunSparesLeaveStdoutAlone(t *testing.T) {
	testutil.RequireRoot(t)
	env := newRuntimeEnv(t)
	env.useSpares(t)
	checked := 0
	for i := 0; i < 5 && checked == 0; i++ { // later runs claim the spares earlier ones parked
		if i > 0 {
			env.waitSpare(t)
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
		for _, pid := range testutil.SpareFillers(env.stateDir) {
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

// TestGCSpares: gc --spares lists the parked spares (--dry-run, which keeps them) and
// terminates them; the termination itself is backend/local's TestRetireSpares.
func TestGCSpares(t *testing.T) {
	testutil.RequireRoot(t)
	env := newRuntimeEnv(t)
	env.useSpares(t)
	id := env.waitSpare(t)
	waitFor(t, "the filler to exit", func() bool { return len(testutil.SpareFillers(env.stateDir)) == 0 })
	code, out, errs := cliIn(t, "", "gc", "--spares", "--dry-run", "--min-age", "1h", "--state-dir", env.stateDir)
	if code != 0 || !strings.Contains(out, "would terminate spare "+id+"\n") || !strings.Contains(out, "would terminate 1 spares\n") {
		t.Fatalf("gc --spares --dry-run: %d %q %q", code, out, errs)
	}
	if _, err := os.Stat(filepath.Join(env.spareIndex(t), id)); err != nil {
		t.Fatalf("the dry run took the spare: %v", err)
	}
	b := env.open(t)
	defer b.Close()
	ids, err := b.RetireSpares(context.Background(), false)
	if err != nil || len(ids) != 1 || ids[0] != id {
		t.Fatalf("retire: %v %v", ids, err)
	}
}

// TestSpareRunClaim: the pool airlock run hands runcode claims a parked spare, and creates a
// sandbox of the template when none is parked (runcode.Pool's contract).
func TestSpareRunClaim(t *testing.T) {
	testutil.RequireRoot(t)
	env := newRuntimeEnv(t)
	env.useSpares(t)
	parked := env.waitSpare(t)
	waitFor(t, "the filler to exit", func() bool { return len(testutil.SpareFillers(env.stateDir)) == 0 })
	b := env.open(t)
	defer b.Close()
	p, err := newSpareRun(b, spec.Image{Host: true}, 30*time.Second, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{parked, ""} {
		s, err := p.Claim(t.Context())
		if err != nil || s == nil {
			t.Fatalf("claim %d: %v %v", i, s, err)
		}
		if want != "" && s.ID != want {
			t.Errorf("claim %d got %s, want the parked %s", i, s.ID, want)
		}
		if want == "" && (s.ID == parked || s.Labels[local.LabelSpare] != "") {
			t.Errorf("claim %d with nothing parked got %s (labels %v), want a new sandbox", i, s.ID, s.Labels)
		}
		p.Discard(s.ID)
	}
	if err := p.wait(); err != nil {
		t.Fatal(err)
	}
}
