package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/sandbox"
)

// TestIDAllocator: two allocators over one state dir (two processes) never hand out the same
// range; a full set is refused naming the option; only the holder frees a range; sweep frees
// the ranges of sessions whose state dir is gone and keeps the others.
func TestIDAllocator(t *testing.T) {
	state := t.TempDir()
	const ranges = 6
	a1, err := newIDAllocator(state, 100000, ranges)
	if err != nil {
		t.Fatal(err)
	}
	a2, err := newIDAllocator(state, 100000, ranges)
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		id      string
		k, base int
		err     error
	}
	res := make(chan got, ranges)
	var wg sync.WaitGroup
	for i := range ranges {
		a := a1
		if i%2 == 1 {
			a = a2
		}
		id := fmt.Sprintf("s-%016x", i)
		wg.Go(func() {
			k, base, err := a.claim(id)
			res <- got{id, k, base, err}
		})
	}
	wg.Wait()
	close(res)
	owner := map[int]string{}
	byID := map[string]int{}
	for g := range res {
		if g.err != nil {
			t.Fatalf("claim %s: %v", g.id, g.err)
		}
		if prev, ok := owner[g.k]; ok {
			t.Fatalf("range %d given to %s and %s", g.k, prev, g.id)
		}
		if want := 100000 + (g.k+1)*idRange; g.base != want {
			t.Errorf("range %d: base %d, want %d", g.k, g.base, want)
		}
		owner[g.k] = g.id
		byID[g.id] = g.k
	}
	if _, _, err := a1.claim("s-00000000000000aa"); !errors.Is(err, sandbox.ErrRefused) || !strings.Contains(err.Error(), "uidRanges 6") {
		t.Fatalf("claim with every range taken: %v, want ErrRefused naming uidRanges", err)
	}
	// Only the holder frees.
	k0 := byID["s-0000000000000000"]
	if err := a2.release(k0, "s-0000000000000001"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a2.claim("s-00000000000000aa"); !errors.Is(err, sandbox.ErrRefused) {
		t.Fatalf("a range was freed by a session that does not hold it: %v", err)
	}
	if err := a2.release(k0, "s-0000000000000000"); err != nil {
		t.Fatal(err)
	}
	if k, _, err := a1.claim("s-00000000000000aa"); err != nil || k != k0 {
		t.Fatalf("claim after release: range %d, %v; want the freed range %d", k, err, k0)
	}
	if err := a1.releaseAll("s-0000000000000001"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(state, idRangesDir, strconv.Itoa(byID["s-0000000000000001"]))); !os.IsNotExist(err) {
		t.Errorf("releaseAll left the claim: %v", err)
	}
	// Sweep: sessions 2 and aa have a state dir, the others do not.
	for _, id := range []string{"s-0000000000000002", "s-00000000000000aa"} {
		if err := os.Mkdir(filepath.Join(state, id), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("../not-a-session", filepath.Join(state, idRangesDir, "junk")); err != nil {
		t.Fatal(err)
	}
	if err := a1.sweep(state); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(filepath.Join(state, idRangesDir))
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range entries {
		o, _ := os.Readlink(filepath.Join(state, idRangesDir, e.Name()))
		left = append(left, o)
	}
	if len(left) != 2 || !strings.Contains(strings.Join(left, " "), "s-0000000000000002") || !strings.Contains(strings.Join(left, " "), "s-00000000000000aa") {
		t.Errorf("after sweep the claims are %v, want those of s-...02 and s-...aa", left)
	}
}

// hostIDs returns the real, effective, saved and fs uids and gids of pid as the host sees them.
func hostIDs(t *testing.T, pid int) (uids, gids []string) {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Uid:"); ok {
			uids = strings.Fields(v)
		}
		if v, ok := strings.CutPrefix(l, "Gid:"); ok {
			gids = strings.Fields(v)
		}
	}
	return uids, gids
}

// codeHostIDs runs a command in the session and reads its host uid and gid from the host's
// /proc while it runs.
func codeHostIDs(t *testing.T, b *Backend, id string) (uids, gids []string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, err := b.Connect(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	marker := fmt.Sprintf("%d.%d", 100+len(id), time.Now().UnixNano()%1000000)
	done := make(chan error, 1)
	go func() {
		var out bytes.Buffer
		_, err := a.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sleep", marker}, Timeout: 2 * time.Minute}, &out, &out)
		done <- err
	}()
	defer func() { cancel(); <-done }()
	want := "sleep\x00" + marker + "\x00"
	for {
		entries, err := os.ReadDir("/proc")
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if c, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && string(c) == want {
				return hostIDs(t, pid)
			}
		}
		select {
		case err := <-done:
			t.Fatalf("the command ended before it was found in /proc: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func newRangesBackend(t *testing.T, stateDir string, ranges int) *Backend {
	t.Helper()
	b, err := New(context.Background(), Options{StateDir: stateDir, AgentPath: agentBin, ImageCacheDir: filepath.Join(stateDir, "images"), UIDRanges: ranges})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		list, _ := b.List(ctx)
		for _, s := range list {
			if err := b.Terminate(ctx, s.ID); err != nil {
				t.Errorf("cleanup: terminate %s: %v", s.ID, err)
			}
		}
		b.Close()
		for _, d := range cgroupParentDirs(b) {
			_ = os.Remove(d)
		}
	})
	return b
}

func (b *Backend) recordOf(t *testing.T, id string) record {
	t.Helper()
	b.mu.Lock()
	s := b.sessions[id]
	b.mu.Unlock()
	if s == nil {
		t.Fatalf("session %s is not known", id)
	}
	return s.rec
}

// TestSandboxesHaveTheirOwnHostIDs: the code of two live sandboxes runs under different host
// uids and gids (read from the host's /proc), each its own range's id 1000, init its range's
// id 0; no range is free while both live, and a range comes back only after terminate.
func TestSandboxesHaveTheirOwnHostIDs(t *testing.T) {
	b := newTestBackend(t) // the root check and a state dir
	b = newRangesBackend(t, b.opts.StateDir, 2)
	ctx := context.Background()
	var ids []string
	seen := map[string]string{}
	for _, name := range []string{"one", "two"} {
		s, err := b.Create(ctx, hostDecl(name))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, s.ID)
		rec := b.recordOf(t, s.ID)
		if rec.IDBase < b.opts.UIDBase+idRange {
			t.Errorf("%s maps id 0 to %d, inside the images' range %d..%d", name, rec.IDBase, b.opts.UIDBase, b.opts.UIDBase+idRange-1)
		}
		uids, gids := codeHostIDs(t, b, s.ID)
		want := strconv.Itoa(rec.IDBase + 1000)
		for _, v := range append(append([]string(nil), uids...), gids...) {
			if v != want {
				t.Errorf("%s: code runs as host uids %v gids %v, want %s for all", name, uids, gids, want)
				break
			}
		}
		if prev, ok := seen[uids[0]]; ok {
			t.Errorf("the code of %s and %s runs as the same host uid %s", prev, name, uids[0])
		}
		seen[uids[0]] = name
		if u, _ := hostIDs(t, rec.InitPID); len(u) == 0 || u[0] != strconv.Itoa(rec.IDBase) {
			t.Errorf("%s: init runs as host uid %v, want %d", name, u, rec.IDBase)
		}
	}
	first := b.recordOf(t, ids[0])
	if _, err := b.Create(ctx, hostDecl("three")); !errors.Is(err, sandbox.ErrRefused) {
		t.Fatalf("a third sandbox with two ranges: %v, want ErrRefused", err)
	}
	if err := b.Terminate(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	s, err := b.Create(ctx, hostDecl("three"))
	if err != nil {
		t.Fatalf("create after terminate freed a range: %v", err)
	}
	if got := b.recordOf(t, s.ID); got.IDBase != first.IDBase || got.IDRange != first.IDRange {
		t.Errorf("after terminate the new sandbox got range %d (base %d), want the freed %d (base %d)", got.IDRange, got.IDBase, first.IDRange, first.IDBase)
	}
}

// TestIDRangesSurviveRestart: sandboxes another process created and left running keep their
// ranges when a new process adopts them; its own creates get others; a claim whose session is
// gone is freed by the reconcile.
func TestIDRangesSurviveRestart(t *testing.T) {
	dir := testStateDir(t)
	created := createInHelper(t, dir, 2)
	stale := filepath.Join(dir, idRangesDir, "3")
	if err := os.Symlink("s-00000000000000ff", stale); err != nil {
		t.Fatal(err)
	}
	b := newTestBackendAt(t, dir)
	if _, err := os.Lstat(stale); !os.IsNotExist(err) {
		t.Errorf("the claim of a session that is gone survived reconcile: %v", err)
	}
	taken := map[int]string{}
	for _, hs := range created {
		rec := b.recordOf(t, hs.ID)
		if rec.IDBase == 0 {
			t.Fatalf("adopted %s has no id range in its record", hs.ID)
		}
		if owner, err := os.Readlink(filepath.Join(dir, idRangesDir, strconv.Itoa(rec.IDRange))); err != nil || owner != hs.ID {
			t.Errorf("adopted %s: claim of range %d is %q, %v", hs.ID, rec.IDRange, owner, err)
		}
		if prev, ok := taken[rec.IDRange]; ok {
			t.Errorf("%s and %s share range %d", prev, hs.ID, rec.IDRange)
		}
		taken[rec.IDRange] = hs.ID
		uids, _ := codeHostIDs(t, b, hs.ID)
		if uids[0] != strconv.Itoa(rec.IDBase+1000) {
			t.Errorf("adopted %s: code runs as host uid %s, want %d", hs.ID, uids[0], rec.IDBase+1000)
		}
	}
	ctx := context.Background()
	for i := range 3 {
		s, err := b.Create(ctx, hostDecl(fmt.Sprintf("after-%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		rec := b.recordOf(t, s.ID)
		if prev, ok := taken[rec.IDRange]; ok {
			t.Errorf("new %s got range %d of live %s", s.ID, rec.IDRange, prev)
		}
		taken[rec.IDRange] = s.ID
	}
}
