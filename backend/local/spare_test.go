package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/backend/local/spares"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

func spareTmpl() spec.Sandbox {
	life := int64(600)
	d := spec.Sandbox{ID: "sp", Image: spec.Image{Host: true}, Labels: map[string]string{"purpose": "spare-test"}}
	d.Session.MaxLifetimeSeconds = &life
	return d
}

func spareKey(t *testing.T) string {
	t.Helper()
	k, err := SpareKey(spareTmpl())
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// deadOwner names a process that is not running: this pid with another start time.
func deadOwner(t *testing.T) string {
	t.Helper()
	start, err := startTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d-%d", os.Getpid(), start+1)
}

func fill(t *testing.T, b *Backend, opts SpareOptions) {
	t.Helper()
	if err := b.FillSpares(t.Context(), spareTmpl(), opts); err != nil {
		t.Fatal(err)
	}
}

// fillParked fills spares from empty and returns them, failing unless opts.Count are parked.
func fillParked(t *testing.T, b *Backend, opts SpareOptions) []spares.Entry {
	t.Helper()
	fill(t, b, opts)
	parked, err := b.parkedSpares(spareKey(t))
	if err != nil || len(parked) != opts.Count {
		t.Fatalf("parked %v %v, want %d", parked, err, opts.Count)
	}
	return parked
}

func TestSpareRefusals(t *testing.T) {
	b := &Backend{opts: Options{StateDir: t.TempDir()}}
	withLabel := func(k string) spec.Sandbox {
		d := spareTmpl()
		d.Labels[k] = "x"
		return d
	}
	for _, tt := range []struct {
		name string
		tmpl spec.Sandbox
		opts SpareOptions
		want string
	}{
		{"no count", spareTmpl(), SpareOptions{MaxAge: time.Minute}, "spares count 0"},
		{"too many", spareTmpl(), SpareOptions{Count: spares.MaxSpares + 1, MaxAge: time.Minute}, "spares count 9"},
		{"no max age", spareTmpl(), SpareOptions{Count: 1}, "spares maxAge 0s"},
		{"max age past the lifetime", spareTmpl(), SpareOptions{Count: 1, MaxAge: 10 * time.Minute}, "shorter than the template's lifetime (10m0s)"},
		{"spare label", withLabel(LabelSpare), SpareOptions{Count: 1, MaxAge: time.Minute}, `label "airlock.spare"`},
		{"filler label", withLabel(LabelSpareFiller), SpareOptions{Count: 1, MaxAge: time.Minute}, `label "airlock.spare.filler"`},
		{"pool label", withLabel(LabelPool), SpareOptions{Count: 1, MaxAge: time.Minute}, `label "airlock.pool"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := b.FillSpares(t.Context(), tt.tmpl, tt.opts)
			if !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want ErrInvalid naming %q", err, tt.want)
			}
		})
	}
}

// TestSpareParkAndClaim: a filler parks spares with what its Prestart returned; another
// backend on the state dir (another process) claims each once, gets that, and runs in it.
func TestSpareParkAndClaim(t *testing.T) {
	b := newTestBackend(t)
	key := spareKey(t)
	fill(t, b, SpareOptions{Count: 2, MaxAge: time.Minute, Prestart: func(ctx context.Context, sess *sandbox.Session, a sandbox.Agent) ([]byte, error) {
		if out, _, res := run(t, a, "echo warm"); out != "warm\n" || res.ExitCode != 0 {
			return nil, fmt.Errorf("prestart exec: %q %+v", out, res)
		}
		return []byte(`"` + sess.ID + `"`), nil
	}})
	if n := b.ParkedSpares(key); n != 2 {
		t.Fatalf("%d parked, want 2", n)
	}
	owner, err := spares.SelfOwner()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for range 2 {
		c := claimSpare(t, b, key, time.Minute)
		if c == nil || seen[c.ID] || string(c.Prestart) != `"`+c.ID+`"` || c.Record.Spec.Labels[LabelSpare] != key {
			t.Fatalf("claimed %+v (seen %v)", c, seen)
		}
		seen[c.ID] = true
		if _, err := os.Stat(filepath.Join(b.opts.StateDir, c.ID, spares.ClaimPrefix+owner)); err != nil {
			t.Errorf("no claim record: %v", err)
		}
		if out, _, _ := run(t, c.Agent, "echo $((6*7))"); out != "42\n" {
			t.Errorf("claimed spare ran %q", out)
		}
		if err := c.Kill(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := b.Terminate(t.Context(), c.ID); err != nil {
			t.Fatal(err)
		}
	}
	if c := claimSpare(t, b, key, time.Minute); c != nil {
		t.Fatalf("a third claim of two spares got %s", c.ID)
	}

	// A spare with less lifetime left than the claim needs is not handed out, but discarded:
	// claimed, for the claimer to terminate.
	parked := fillParked(t, b, SpareOptions{Count: 1, MaxAge: time.Minute})
	c, discarded, err := spares.Claim(t.Context(), b.opts.StateDir, key, time.Hour)
	if c != nil || err != nil || len(discarded) != 1 || discarded[0] != parked[0].Session {
		t.Fatalf("a spare with 10 minutes left, claimed for an hour: %v %v, discarded %v", c, err, discarded)
	}
	if err := b.Terminate(t.Context(), parked[0].Session); err != nil {
		t.Fatal(err)
	}
}

// claimSpare is spares.Claim on b's state dir, failing the test on an error or a discard.
func claimSpare(t *testing.T, b *Backend, key string, minLeft time.Duration) *spares.Claimed {
	t.Helper()
	c, discarded, err := spares.Claim(t.Context(), b.opts.StateDir, key, minLeft)
	if err != nil || len(discarded) > 0 {
		t.Fatalf("claim: %v, discarded %v", err, discarded)
	}
	return c
}

// TestSpareReconcile: a new backend reaps spares nobody can use (claimed by a process that is
// gone, or never parked by a filler that is gone), keeps parked ones, and drops the index
// entry of a parked spare that died.
func TestSpareReconcile(t *testing.T) {
	b := newTestBackend(t)
	key := spareKey(t)
	parked := fillParked(t, b, SpareOptions{Count: 4, MaxAge: time.Minute})
	claimedDead, neverParked, kept, died := parked[0].Session, parked[1].Session, parked[2].Session, parked[3].Session
	pids := map[string]int{}
	for _, e := range parked {
		pids[e.Session] = b.sessionInitPID(e.Session)
	}
	dir := func(id string) string { return filepath.Join(b.opts.StateDir, id) }

	// Claimed by a process that is gone.
	if err := os.Rename(filepath.Join(b.spareIndex(key), claimedDead), filepath.Join(dir(claimedDead), spares.ClaimPrefix+deadOwner(t))); err != nil {
		t.Fatal(err)
	}
	// Made by a filler that is gone, never parked.
	if err := os.Remove(filepath.Join(b.spareIndex(key), neverParked)); err != nil {
		t.Fatal(err)
	}
	rec, err := readRecord(dir(neverParked))
	if err != nil {
		t.Fatal(err)
	}
	rec.Spec.Labels[LabelSpareFiller] = deadOwner(t)
	if err := writeRecord(dir(neverParked), rec); err != nil {
		t.Fatal(err)
	}
	// Parked, then died (its lifetime ended, say).
	if err := syscall.Kill(pids[died], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}

	b2 := newTestBackendAt(t, b.opts.StateDir)
	assertGone(t, b2, claimedDead, pids[claimedDead])
	assertGone(t, b2, neverParked, pids[neverParked])
	assertGone(t, b2, died, pids[died])
	waitFor(t, "the dead spare's index entry swept", func() bool {
		_ = b2.sweepSpareIndex() // b's own reaper may remove the session dir after b2's reconcile
		_, err := os.Lstat(filepath.Join(b.spareIndex(key), died))
		return errors.Is(err, os.ErrNotExist)
	})
	if n := b2.ParkedSpares(key); n != 1 {
		t.Errorf("%d parked after reconcile, want 1 (%s)", n, kept)
	}
	c := claimSpare(t, b2, key, time.Minute)
	if c == nil || c.ID != kept {
		t.Fatalf("claim after reconcile: %+v, want %s", c, kept)
	}
	if err := c.Kill(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := b2.Terminate(t.Context(), c.ID); err != nil {
		t.Fatal(err)
	}
}

// TestSpareRetire: a filler terminates parked spares older than MaxAge and parks new ones.
func TestSpareRetire(t *testing.T) {
	b := newTestBackend(t)
	key := spareKey(t)
	old := fillParked(t, b, SpareOptions{Count: 1, MaxAge: time.Second})
	pid := b.sessionInitPID(old[0].Session)
	time.Sleep(1100 * time.Millisecond)
	fill(t, b, SpareOptions{Count: 1, MaxAge: time.Second})
	assertGone(t, b, old[0].Session, pid)
	now, _ := b.parkedSpares(key)
	if len(now) != 1 || now[0].Session == old[0].Session {
		t.Fatalf("parked after retiring %s: %v", old[0].Session, now)
	}
}

// TestRetireSpares: every parked spare goes (a dry run only lists them).
func TestRetireSpares(t *testing.T) {
	b := newTestBackend(t)
	key := spareKey(t)
	parked := fillParked(t, b, SpareOptions{Count: 2, MaxAge: time.Minute})
	ids, err := b.RetireSpares(t.Context(), true)
	if err != nil || len(ids) != 2 || b.ParkedSpares(key) != 2 {
		t.Fatalf("dry run: %v %v, %d parked", ids, err, b.ParkedSpares(key))
	}
	pids := map[string]int{}
	for _, e := range parked {
		pids[e.Session] = b.sessionInitPID(e.Session)
	}
	ids, err = b.RetireSpares(t.Context(), false)
	if err != nil || len(ids) != 2 || b.ParkedSpares(key) != 0 {
		t.Fatalf("retire: %v %v, %d parked", ids, err, b.ParkedSpares(key))
	}
	for id, pid := range pids {
		assertGone(t, b, id, pid)
	}
}

// fakeHostEtc makes b's host-image /etc a copy of a fake host /etc holding only motd, and
// returns a function that rewrites it (a change the next create's /etc copy check sees).
func fakeHostEtc(t *testing.T, b *Backend, motd string) func(string) {
	t.Helper()
	src := t.TempDir()
	mustWrite(t, filepath.Join(src, "motd"), motd, 0o644)
	b.etc.src, b.etc.names = src, func() []string { return []string{"motd"} }
	return func(content string) {
		time.Sleep(10 * time.Millisecond) // a distinct mtime even on coarse clocks
		mustWrite(t, filepath.Join(src, "motd"), content, 0o644)
	}
}
