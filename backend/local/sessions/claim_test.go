package sessions_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/backend/local/sessions"
	"github.com/airlock-sandbox/airlock/internal/kernfile"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

func parkedTmpl() spec.Sandbox {
	life := int64(600)
	d := spec.Sandbox{ID: "sp", Image: spec.Image{Host: true}, Labels: map[string]string{"purpose": "parked-test"}}
	d.Session.MaxLifetimeSeconds = &life
	return d
}

// testBackend is a runtime (the filler's side) and its state dir.
type testBackend struct {
	*local.Backend
	dir string
}

// newBackend is a runtime over a fresh, short state dir (unix socket paths are limited to 107
// bytes); the cleanup terminates whatever the test left.
func newBackend(t *testing.T) testBackend {
	t.Helper()
	testutil.RequireRoot(t)
	dir, err := os.MkdirTemp("", "als")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	b, err := local.New(context.Background(), local.Options{StateDir: dir, AgentPath: agentBin, ImageCacheDir: filepath.Join(dir, "images")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "s-") {
				if err := b.Terminate(ctx, e.Name()); err != nil {
					t.Errorf("cleanup: terminate %s: %v", e.Name(), err)
				}
			}
		}
		b.Close()
		parents, _ := filepath.Glob(filepath.Join(kernfile.CgroupRoot, "*", local.CgroupParentFor(dir)))
		for _, d := range append(parents, filepath.Join(kernfile.CgroupRoot, local.CgroupParentFor(dir))) {
			_ = os.Remove(d)
		}
	})
	return testBackend{b, dir}
}

// park fills n parked sandboxes of parkedTmpl and returns their key.
func park(t *testing.T, b testBackend, n int) string {
	t.Helper()
	if err := b.FillParked(t.Context(), parkedTmpl(), local.ParkOptions{Count: n, MaxAge: time.Minute}); err != nil {
		t.Fatal(err)
	}
	key, err := local.PoolKey(parkedTmpl())
	if err != nil {
		t.Fatal(err)
	}
	if n := b.ParkedCount(key); n == 0 {
		t.Fatal("nothing parked")
	}
	return key
}

// cgroupProcs lists the processes in every cgroup of the sandbox whose cgroup is rel, in every
// hierarchy.
func cgroupProcs(t *testing.T, rel string) []int {
	t.Helper()
	dirs, _ := filepath.Glob(filepath.Join(kernfile.CgroupRoot, "*", rel))
	dirs = append(dirs, filepath.Join(kernfile.CgroupRoot, rel))
	var pids []int
	for _, d := range dirs {
		_ = filepath.WalkDir(d, func(p string, de fs.DirEntry, err error) error {
			if err != nil || !de.IsDir() {
				return nil
			}
			raw, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			if err != nil {
				return nil
			}
			for _, f := range strings.Fields(string(raw)) {
				if pid, err := strconv.Atoi(f); err == nil {
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	return pids
}

// TestClaimRunKill: a claimed parked sandbox runs code through its agent; Kill returns once its init
// is gone and no process of it is left in any of its cgroups (a detached child included).
func TestClaimRunKill(t *testing.T) {
	b := newBackend(t)
	key := park(t, b, 1)
	dir := b.dir
	c, discarded, err := sessions.Claim(t.Context(), dir, key, time.Minute)
	if err != nil || c == nil || len(discarded) != 0 {
		t.Fatalf("claim: %v, discarded %v, %v", c, discarded, err)
	}
	if c.Record.ID != c.ID || c.Record.Spec.Labels[local.LabelParked] != key || c.Record.Spec.Workdir != spec.DefaultWorkdir {
		t.Fatalf("claimed record %+v", *c.Record)
	}
	if owner, _ := sessions.Claimer(filepath.Join(dir, c.ID)); owner == "" {
		t.Fatal("no claim file")
	}
	res, err := c.Agent.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"true"}, Timeout: 10 * time.Second}, io.Discard, io.Discard)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("true: %+v %v", res, err)
	}
	// A process that outlives its exec: the kill must take it too.
	res, err = c.Agent.Exec(t.Context(), sandbox.ExecRequest{Shell: "setsid sleep 600 >/dev/null 2>&1 < /dev/null &", Timeout: 10 * time.Second}, io.Discard, io.Discard)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("detached sleep: %+v %v", res, err)
	}
	if err := c.Kill(t.Context()); err != nil {
		t.Fatal(err)
	}
	if sessions.Running(c.Record.InitPID, c.Record.InitStart) {
		t.Errorf("init %d still running after Kill", c.Record.InitPID)
	}
	if pids := cgroupProcs(t, c.Record.Cgroup); len(pids) != 0 {
		t.Errorf("processes %v left in the sandbox's cgroups after Kill", pids)
	}
	if err := c.Kill(t.Context()); err != nil {
		t.Errorf("a second Kill: %v", err)
	}
	if err := b.Terminate(t.Context(), c.ID); err != nil {
		t.Fatal(err)
	}
}

// TestClaimNone: nothing parked (no index at all, or an empty one) is no parked sandbox and no error.
func TestClaimNone(t *testing.T) {
	dir := t.TempDir()
	for _, setup := range []func(){func() {}, func() {
		if err := os.MkdirAll(sessions.IndexDir(dir, "k"), 0o700); err != nil {
			t.Fatal(err)
		}
	}} {
		setup()
		if c, discarded, err := sessions.Claim(t.Context(), dir, "k", time.Minute); c != nil || discarded != nil || err != nil {
			t.Fatalf("claim with nothing parked: %v %v %v", c, discarded, err)
		}
	}
}

// TestClaimConcurrent: claimers racing for one parked sandbox: exactly one gets it, and no other
// takes (or discards) it.
func TestClaimConcurrent(t *testing.T) {
	b := newBackend(t)
	key := park(t, b, 1)
	var (
		mu   sync.Mutex
		won  []*sessions.Claimed
		errs []error
		wg   sync.WaitGroup
	)
	start := make(chan struct{})
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			c, discarded, err := sessions.Claim(context.Background(), b.dir, key, time.Minute)
			mu.Lock()
			defer mu.Unlock()
			if err != nil || len(discarded) != 0 {
				errs = append(errs, errors.Join(err, errors.New("discarded "+strings.Join(discarded, ","))))
			}
			if c != nil {
				won = append(won, c)
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(errs) != 0 {
		t.Errorf("claims failed: %v", errs)
	}
	if len(won) != 1 {
		t.Fatalf("%d claimers won the one parked sandbox", len(won))
	}
	if err := won[0].Kill(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestClaimDiscards: a parked sandbox the claimer cannot use is taken (its claim file names this
// process), returned in discarded for the caller to terminate, and the next one is tried.
func TestClaimDiscards(t *testing.T) {
	tests := []struct {
		name    string
		minLeft time.Duration
		spoil   func(t *testing.T, b testBackend, id string)
	}{
		{"too little lifetime left", time.Hour, nil},
		{"unreadable index entry", time.Minute, func(t *testing.T, b testBackend, id string) {
			key, err := local.PoolKey(parkedTmpl())
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(sessions.IndexDir(b.dir, key), id), []byte("{not json"), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"paused", time.Minute, func(t *testing.T, b testBackend, id string) {
			if err := b.Pause(t.Context(), id); err != nil {
				t.Fatal(err)
			}
		}},
		{"stale /etc copy", time.Minute, func(t *testing.T, b testBackend, id string) {
			// A host file the copy was made from changes: add one to its manifest, then
			// change it (the test may not touch the host's /etc).
			rec, err := sessions.ReadRecord(filepath.Join(b.dir, id))
			if err != nil || rec.EtcDir == "" {
				t.Fatalf("record %+v %v: a host-image parked sandbox has an /etc copy", rec, err)
			}
			path := sessions.EtcManifestPath(filepath.Join(b.dir, sessions.EtcCacheDir), rec.Spec.Workdir)
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var m sessions.EtcManifest
			if err := json.Unmarshal(raw, &m); err != nil {
				t.Fatal(err)
			}
			src := filepath.Join(t.TempDir(), "motd")
			if err := os.WriteFile(src, []byte("one\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			m.Sources = append(m.Sources, sessions.EtcSource{Path: src, ID: sessions.SourceID(src)})
			if raw, err = json.Marshal(m); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, raw, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := sessions.EtcCurrent(b.dir, rec); err != nil {
				t.Fatalf("current before the change: %v", err)
			}
			time.Sleep(10 * time.Millisecond) // a distinct mtime even on coarse clocks
			if err := os.WriteFile(src, []byte("two\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBackend(t)
			key := park(t, b, 1)
			parked, err := sessions.Parked(b.dir, key)
			if err != nil || len(parked) != 1 {
				t.Fatalf("parked %v %v", parked, err)
			}
			id := parked[0].Session
			if tt.spoil != nil {
				tt.spoil(t, b, id)
			}
			c, discarded, err := sessions.Claim(t.Context(), b.dir, key, tt.minLeft)
			if c != nil || err != nil || !slices.Equal(discarded, []string{id}) {
				t.Fatalf("claim: %v %v, discarded %v; want %s discarded", c, err, discarded, id)
			}
			self, err := sessions.SelfProc()
			if err != nil {
				t.Fatal(err)
			}
			if owner, _ := sessions.Claimer(filepath.Join(b.dir, id)); owner != self {
				t.Errorf("discarded parked sandbox claimed by %q, want this process (%s)", owner, self)
			}
			if n := b.ParkedCount(key); n != 0 {
				t.Errorf("%d still parked", n)
			}
			if err := b.Terminate(t.Context(), id); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestFillerWaitsForQuiet: runs back to back are left the machine. A filler holding the lock
// parks nothing until sessions.ParkQuiet after the last claim while something is still parked;
// the used sandbox a run queued for it (sessions.QueueUsed) is terminated then too; a claim
// that is not right behind another is not back to back, the next one is.
func TestFillerWaitsForQuiet(t *testing.T) {
	b := newBackend(t)
	key := park(t, b, 2)
	c, _, err := sessions.Claim(t.Context(), b.dir, key, time.Minute)
	if err != nil || c == nil {
		t.Fatalf("claim: %v %v", c, err)
	}
	claimed := time.Now()
	if c.BackToBack || c.Left != 1 {
		t.Errorf("the first claim: back to back %v, %d left; want false, 1", c.BackToBack, c.Left)
	}
	if err := c.Kill(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := sessions.QueueUsed(b.dir, key, []string{c.ID}); err != nil {
		t.Fatal(err)
	}
	if err := b.FillParked(t.Context(), parkedTmpl(), local.ParkOptions{Count: 2, MaxAge: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(claimed); waited < sessions.ParkQuiet {
		t.Errorf("the filler returned %v after the claim, before the quiet %v", waited, sessions.ParkQuiet)
	}
	ids, err := sessions.ParkedIDs(b.dir, key)
	if err != nil || len(ids) != 2 {
		t.Fatalf("parked after the fill: %v %v, want 2", ids, err)
	}
	fi, err := os.Stat(filepath.Join(sessions.IndexDir(b.dir, key), ids[0]))
	if err != nil {
		t.Fatal(err)
	}
	if at := fi.ModTime().Sub(claimed); at < sessions.ParkQuiet-10*time.Millisecond {
		t.Errorf("the refill was parked %v after the claim, before the quiet %v", at, sessions.ParkQuiet)
	}
	if _, err := os.Stat(filepath.Join(b.dir, c.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the queued used sandbox %s was not terminated: %v", c.ID, err)
	}
	if sessions.UsedPending(b.dir, key) {
		t.Error("the used queue is not empty")
	}
	// Two claims right behind each other: the second is back to back and takes the last.
	c1, _, err := sessions.Claim(t.Context(), b.dir, key, time.Minute)
	if err != nil || c1 == nil {
		t.Fatalf("claim: %v %v", c1, err)
	}
	c2, _, err := sessions.Claim(t.Context(), b.dir, key, time.Minute)
	if err != nil || c2 == nil {
		t.Fatalf("claim: %v %v", c2, err)
	}
	if !c2.BackToBack || c2.Left != 0 {
		t.Errorf("the second of two claims: back to back %v, %d left; want true, 0", c2.BackToBack, c2.Left)
	}
	for _, c := range []*sessions.Claimed{c1, c2} {
		if err := c.Kill(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := b.Terminate(t.Context(), c.ID); err != nil {
			t.Fatal(err)
		}
	}
}
