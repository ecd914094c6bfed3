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
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/backend/local/idrange"
	"github.com/airlock-sandbox/airlock/sandbox"
)

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
	stale := filepath.Join(dir, idrange.Dir, "3")
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
		if owner, err := os.Readlink(filepath.Join(dir, idrange.Dir, strconv.Itoa(rec.IDRange))); err != nil || owner != hs.ID {
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
