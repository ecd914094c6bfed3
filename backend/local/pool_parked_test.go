package local

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/backend/local/sessions"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
	"github.com/airlock-sandbox/airlock/token"
)

func parkedTmpl() spec.Sandbox {
	life := int64(600)
	d := spec.Sandbox{ID: "sp", Image: spec.Image{Host: true}, Labels: map[string]string{"purpose": "parked-test"}}
	d.Session.MaxLifetimeSeconds = &life
	return d
}

func parkedKey(t *testing.T) string {
	t.Helper()
	k, err := PoolKey(parkedTmpl())
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

func fill(t *testing.T, b *Backend, opts ParkOptions) {
	t.Helper()
	if err := b.FillParked(t.Context(), parkedTmpl(), opts); err != nil {
		t.Fatal(err)
	}
}

// fillParked fills parked sandboxes from empty and returns them, failing unless opts.Count are parked.
func fillParked(t *testing.T, b *Backend, opts ParkOptions) []sessions.Entry {
	t.Helper()
	fill(t, b, opts)
	parked, err := b.parkedEntries(parkedKey(t))
	if err != nil || len(parked) != opts.Count {
		t.Fatalf("parked %v %v, want %d", parked, err, opts.Count)
	}
	return parked
}

func TestParkRefusals(t *testing.T) {
	b := &Backend{opts: Options{StateDir: t.TempDir()}}
	withLabel := func(k string) spec.Sandbox {
		d := parkedTmpl()
		d.Labels[k] = "x"
		return d
	}
	for _, tt := range []struct {
		name string
		tmpl spec.Sandbox
		opts ParkOptions
		want string
	}{
		{"no count", parkedTmpl(), ParkOptions{MaxAge: time.Minute}, "parked sandboxes count 0"},
		{"too many", parkedTmpl(), ParkOptions{Count: sessions.MaxParked + 1, MaxAge: time.Minute}, "parked sandboxes count 9"},
		{"no max age", parkedTmpl(), ParkOptions{Count: 1}, "parked sandboxes maxAge 0s"},
		{"negative pool memory", parkedTmpl(), ParkOptions{Count: 1, MaxAge: time.Minute, Memory: -1}, "parked sandboxes memory -1"},
		{"max age past the lifetime", parkedTmpl(), ParkOptions{Count: 1, MaxAge: 10 * time.Minute}, "shorter than the template's lifetime (10m0s)"},
		{"parked label", withLabel(LabelParked), ParkOptions{Count: 1, MaxAge: time.Minute}, `label "airlock.spare"`},
		{"filler label", withLabel(labelParkedFiller), ParkOptions{Count: 1, MaxAge: time.Minute}, `label "airlock.spare.filler"`},
		{"pool label", withLabel(LabelPool), ParkOptions{Count: 1, MaxAge: time.Minute}, `label "airlock.pool"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := b.FillParked(t.Context(), tt.tmpl, tt.opts)
			if !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want ErrInvalid naming %q", err, tt.want)
			}
		})
	}
}

// TestParkAndClaim: a filler parks parked sandboxes with what its Prestart returned; another
// backend on the state dir (another process) claims each once, gets that, and runs in it.
func TestParkAndClaim(t *testing.T) {
	b := newTestBackend(t)
	key := parkedKey(t)
	fill(t, b, ParkOptions{Count: 2, MaxAge: time.Minute, Prestart: func(ctx context.Context, sess *sandbox.Session, a sandbox.Agent) ([]byte, error) {
		if out, _, res := run(t, a, "echo warm"); out != "warm\n" || res.ExitCode != 0 {
			return nil, fmt.Errorf("prestart exec: %q %+v", out, res)
		}
		return []byte(`"` + sess.ID + `"`), nil
	}})
	if n := b.ParkedCount(key); n != 2 {
		t.Fatalf("%d parked, want 2", n)
	}
	// Each entry carries the claimer's token, valid for the sandbox's whole life and no longer;
	// the claims below use it, not a key derived from the master secret, which a claimer now
	// reads wrong (restored before anything else needs it).
	entries, err := sessions.Parked(b.opts.StateDir, key)
	if err != nil || len(entries) != 2 {
		t.Fatalf("parked entries: %v, %v", entries, err)
	}
	for _, e := range entries {
		s := b.sessionOf(e.Session)
		ring := token.NewKeyRing(s.key.Public().(ed25519.PublicKey))
		want := token.Expect{Sandbox: s.rec.SandboxID, Session: s.rec.ID, Generation: s.rec.Generation, Class: token.Execute,
			Now: s.rec.ExpiresAt.Add(-time.Second)}
		if _, err := token.Verify(ring, e.Token, want); err != nil {
			t.Errorf("entry %s: its token a second before the sandbox's end: %v", e.Session, err)
		}
		if want.Now = s.rec.ExpiresAt; !expired(token.Verify(ring, e.Token, want)) {
			t.Errorf("entry %s: its token is still valid at the sandbox's end", e.Session)
		}
	}
	masterFile := filepath.Join(b.opts.StateDir, statedir.MasterFile)
	master, err := os.ReadFile(masterFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(masterFile, bytes.Repeat([]byte{7}, len(master)), 0o600); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := os.WriteFile(masterFile, master, 0o600); err != nil {
			t.Error(err)
		}
	}()
	self, err := sessions.SelfProc()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for range 2 {
		c := claimParked(t, b, key, time.Minute)
		if c == nil || seen[c.ID] || string(c.Prestart) != `"`+c.ID+`"` || c.Record.Spec.Labels[LabelParked] != key {
			t.Fatalf("claimed %+v (seen %v)", c, seen)
		}
		seen[c.ID] = true
		if _, err := os.Stat(filepath.Join(b.opts.StateDir, c.ID, sessions.ClaimPrefix+self)); err != nil {
			t.Errorf("no claim record: %v", err)
		}
		if out, _, _ := run(t, c.Agent, "echo $((6*7))"); out != "42\n" {
			t.Errorf("claimed parked sandbox ran %q", out)
		}
		if err := c.Kill(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := b.Terminate(t.Context(), c.ID); err != nil {
			t.Fatal(err)
		}
	}
	if c := claimParked(t, b, key, time.Minute); c != nil {
		t.Fatalf("a third claim of two parked sandboxes got %s", c.ID)
	}

	// A parked sandbox with less lifetime left than the claim needs is not handed out, but discarded:
	// claimed, for the claimer to terminate.
	parked := fillParked(t, b, ParkOptions{Count: 1, MaxAge: time.Minute})
	c, discarded, err := sessions.Claim(t.Context(), b.opts.StateDir, key, time.Hour)
	if c != nil || err != nil || len(discarded) != 1 || discarded[0] != parked[0].Session {
		t.Fatalf("a parked sandbox with 10 minutes left, claimed for an hour: %v %v, discarded %v", c, err, discarded)
	}
	if err := b.Terminate(t.Context(), parked[0].Session); err != nil {
		t.Fatal(err)
	}
}

// expired reports whether token.Verify refused as expired.
func expired(_ token.Claims, err error) bool { return errors.Is(err, token.ErrExpired) }

// claimParked is sessions.Claim on b's state dir, failing the test on an error or a discard.
func claimParked(t *testing.T, b *Backend, key string, minLeft time.Duration) *sessions.Claimed {
	t.Helper()
	c, discarded, err := sessions.Claim(t.Context(), b.opts.StateDir, key, minLeft)
	if err != nil || len(discarded) > 0 {
		t.Fatalf("claim: %v, discarded %v", err, discarded)
	}
	return c
}

// TestParkedReconcile: a new backend reaps parked sandboxes nobody can use (claimed by a process that is
// gone, or never parked by a filler that is gone), keeps parked ones, and drops the index
// entry of a parked sandbox that died.
func TestParkedReconcile(t *testing.T) {
	b := newTestBackend(t)
	key := parkedKey(t)
	parked := fillParked(t, b, ParkOptions{Count: 4, MaxAge: time.Minute})
	claimedDead, neverParked, kept, died := parked[0].Session, parked[1].Session, parked[2].Session, parked[3].Session
	pids := map[string]int{}
	for _, e := range parked {
		pids[e.Session] = b.sessionInitPID(e.Session)
	}
	dir := func(id string) string { return filepath.Join(b.opts.StateDir, id) }

	// Claimed by a process that is gone.
	if err := os.Rename(filepath.Join(b.parkedIndex(key), claimedDead), filepath.Join(dir(claimedDead), sessions.ClaimPrefix+deadOwner(t))); err != nil {
		t.Fatal(err)
	}
	// Made by a filler that is gone, never parked.
	if err := os.Remove(filepath.Join(b.parkedIndex(key), neverParked)); err != nil {
		t.Fatal(err)
	}
	rec, err := readRecord(dir(neverParked))
	if err != nil {
		t.Fatal(err)
	}
	rec.Spec.Labels[labelParkedFiller] = deadOwner(t)
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
	waitFor(t, "the dead parked sandbox's index entry swept", func() bool {
		_ = b2.sweepParkedIndex() // b's own reaper may remove the session dir after b2's reconcile
		_, err := os.Lstat(filepath.Join(b.parkedIndex(key), died))
		return errors.Is(err, os.ErrNotExist)
	})
	if n := b2.ParkedCount(key); n != 1 {
		t.Errorf("%d parked after reconcile, want 1 (%s)", n, kept)
	}
	c := claimParked(t, b2, key, time.Minute)
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

// TestParkedRetire: a filler terminates parked sandboxes older than MaxAge and parks new ones.
func TestParkedRetire(t *testing.T) {
	b := newTestBackend(t)
	key := parkedKey(t)
	old := fillParked(t, b, ParkOptions{Count: 1, MaxAge: time.Second})
	pid := b.sessionInitPID(old[0].Session)
	time.Sleep(1100 * time.Millisecond)
	fill(t, b, ParkOptions{Count: 1, MaxAge: time.Second})
	assertGone(t, b, old[0].Session, pid)
	now, _ := b.parkedEntries(key)
	if len(now) != 1 || now[0].Session == old[0].Session {
		t.Fatalf("parked after retiring %s: %v", old[0].Session, now)
	}
}

// TestRetireParked: every parked sandbox goes (a dry run only lists them).
func TestRetireParked(t *testing.T) {
	b := newTestBackend(t)
	key := parkedKey(t)
	parked := fillParked(t, b, ParkOptions{Count: 2, MaxAge: time.Minute})
	ids, err := b.RetireParked(t.Context(), true)
	if err != nil || len(ids) != 2 || b.ParkedCount(key) != 2 {
		t.Fatalf("dry run: %v %v, %d parked", ids, err, b.ParkedCount(key))
	}
	pids := map[string]int{}
	for _, e := range parked {
		pids[e.Session] = b.sessionInitPID(e.Session)
	}
	ids, err = b.RetireParked(t.Context(), false)
	if err != nil || len(ids) != 2 || b.ParkedCount(key) != 0 {
		t.Fatalf("retire: %v %v, %d parked", ids, err, b.ParkedCount(key))
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

// TestParkedGrowsWithMisses: a filler started by a run that found nothing parked grows the
// parked count by one, within the pool memory counted at the most a parked sandbox was
// measured to hold; without a pool memory the count stays at Count.
func TestParkedGrowsWithMisses(t *testing.T) {
	for _, tt := range []struct {
		name   string
		memory func(m int64) int64 // from one parked sandbox's measured memory
		want   []int               // parked after each of three missed fills
	}{
		{"no pool memory", func(int64) int64 { return 0 }, []int{1, 1, 1}},
		{"room for two", func(m int64) int64 { return 2*m + m/2 }, []int{2, 2, 2}},
		{"room for all", func(int64) int64 { return 1 << 40 }, []int{2, 3, 4}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := newTestBackend(t)
			key := parkedKey(t)
			t.Cleanup(func() {
				if _, err := b.RetireParked(context.Background(), false); err != nil {
					t.Error(err)
				}
			})
			// One fill with no miss measures a parked sandbox.
			fill(t, b, ParkOptions{Count: 1, MaxAge: time.Minute, Memory: 1 << 40})
			m := b.readParkedTarget(key).SandboxMemory
			if m <= 0 {
				t.Fatalf("a parked sandbox's memory was not measured: %+v", b.readParkedTarget(key))
			}
			for i, want := range tt.want {
				fill(t, b, ParkOptions{Count: 1, MaxAge: time.Minute, Memory: tt.memory(m), Missed: true})
				parked, err := b.parkedEntries(key)
				if err != nil || len(parked) != want {
					t.Errorf("after missed fill %d: %d parked (%v), want %d (target %+v)", i+1, len(parked), err, want, b.readParkedTarget(key))
				}
			}
		})
	}
}
