package local

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/backend/local/sessions"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/spec"
)

func TestParseCgroupFile(t *testing.T) {
	v1 := `12:pids:/user.slice
11:cpu,cpuacct:/a/b
10:freezer:/
9:memory:/process_api/x
1:name=systemd:/init.scope
0::/
`
	got, err := parseCgroupFile(strings.NewReader(v1))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"pids": "/user.slice", "cpu": "/a/b", "cpuacct": "/a/b", "freezer": "/", "memory": "/process_api/x"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	// A host without one of the controllers this runtime needs is refused.
	if _, err := parseCgroupFile(strings.NewReader("0::/\n")); err == nil {
		t.Error("a v2-only cgroup file was accepted for the v1 driver")
	}
}

func TestSessionIDs(t *testing.T) {
	id, err := newSessionID()
	if err != nil {
		t.Fatal(err)
	}
	if err := checkSessionID(id); err != nil {
		t.Errorf("fresh id %q refused: %v", id, err)
	}
	for _, bad := range []string{"", "s-", "s-0123", "s-0123456789abcdeg", "../s-0123456789abcdef", "s-0123456789abcdef/..", "S-0123456789ABCDEF"} {
		if checkSessionID(bad) == nil {
			t.Errorf("session id %q accepted", bad)
		}
	}
}

func TestCgroupParentPerStateDir(t *testing.T) {
	if got := CgroupParentFor(DefaultStateDir); got != "airlock" {
		t.Errorf("default state dir parent = %q", got)
	}
	a, b := CgroupParentFor("/tmp/a"), CgroupParentFor("/tmp/b")
	if a == b || !strings.HasPrefix(a, "airlock-") {
		t.Errorf("parents %q and %q must differ and be prefixed", a, b)
	}
}

func TestMountPoints(t *testing.T) {
	mi := `22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
90 27 0:4 net:[4026532] /run/airlock/s-0123456789abcdef/runsc/null-netns rw - nsfs nsfs rw
91 27 0:50 / /tmp/with\040space rw - tmpfs tmpfs rw
`
	got, err := mountPoints(strings.NewReader(mi))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/proc", "/", "/run/airlock/s-0123456789abcdef/runsc/null-netns", "/tmp/with space"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestRecordJSON: session.json is what it was before the record's core moved to parked sandboxes
// (sandboxes made by an older binary are still found and reaped, and it finds ours): every
// field round-trips both ways with the flat record it replaced, and sessions.ReadRecord reads
// the core and the spec fields a claimer needs from it.
func TestRecordJSON(t *testing.T) {
	// flatRecord is record as it was, one struct.
	type flatRecord struct {
		ID            string       `json:"id"`
		SandboxID     string       `json:"sandboxId"`
		InitPID       int          `json:"initPid"`
		InitStart     uint64       `json:"initStart"`
		Cgroup        string       `json:"cgroup"`
		CgroupVersion int          `json:"cgroupVersion"`
		Generation    uint64       `json:"generation"`
		CreatedAt     time.Time    `json:"createdAt"`
		ExpiresAt     time.Time    `json:"expiresAt"`
		Spec          spec.Sandbox `json:"spec"`
		LandlockABI   int          `json:"landlockAbi"`
		EtcDir        string       `json:"etcDir,omitempty"`
		Runtime       string       `json:"runtime,omitempty"`
		IDRange       int          `json:"idRange,omitempty"`
		IDBase        int          `json:"idBase,omitempty"`
	}
	at := time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)
	decl := spec.Sandbox{ID: "box", Workdir: "/w", Labels: map[string]string{"a": "b"}, Image: spec.Image{Host: true}}
	flat := flatRecord{
		ID: "s-0123456789abcdef", SandboxID: "box", InitPID: 42, InitStart: 4242, Cgroup: "/airlock/s-0123456789abcdef",
		CgroupVersion: 1, Generation: 3, CreatedAt: at, ExpiresAt: at.Add(time.Hour), Spec: decl, LandlockABI: 4,
		EtcDir: "v2-abc", Runtime: "gvisor", IDRange: 7, IDBase: 165536,
	}
	nested := record{RecordCore: sessions.RecordCore{
		ID: flat.ID, SandboxID: flat.SandboxID, InitPID: flat.InitPID, InitStart: flat.InitStart, Cgroup: flat.Cgroup,
		CgroupVersion: flat.CgroupVersion, Generation: flat.Generation, CreatedAt: flat.CreatedAt, ExpiresAt: flat.ExpiresAt,
		LandlockABI: flat.LandlockABI, EtcDir: flat.EtcDir, Runtime: flat.Runtime, IDRange: flat.IDRange, IDBase: flat.IDBase,
	}, Spec: decl}
	fields := func(v any) map[string]json.RawMessage {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	fromFlat, fromNested := fields(flat), fields(nested)
	if len(fromFlat) != len(fromNested) {
		t.Fatalf("%d fields, the flat record had %d", len(fromNested), len(fromFlat))
	}
	for k, v := range fromFlat {
		if !bytes.Equal(fromNested[k], v) {
			t.Errorf("field %q: %s, the flat record wrote %s", k, fromNested[k], v)
		}
	}

	// Written the old way, read the new way (and by a claimer); and the reverse.
	dir := t.TempDir()
	b, err := json.MarshalIndent(flat, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, recordFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := readRecord(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(*got, nested) {
		t.Errorf("read %+v, want %+v", *got, nested)
	}
	light, err := sessions.ReadRecord(dir)
	if err != nil {
		t.Fatal(err)
	}
	if light.RecordCore != nested.RecordCore || light.Spec.Workdir != "/w" || !maps.Equal(light.Spec.Labels, decl.Labels) {
		t.Errorf("sessions.ReadRecord: %+v", *light)
	}
	if err := writeRecord(dir, &nested); err != nil {
		t.Fatal(err)
	}
	var back flatRecord
	if err := sessions.DecodeRecord(dir, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, flat) {
		t.Errorf("flat record read back %+v, want %+v", back, flat)
	}
}

// mountsAt counts the mounts whose mount point is dir.
func mountsAt(t *testing.T, dir string) int {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	points, err := mountPoints(f)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range points {
		if p == dir {
			n++
		}
	}
	return n
}

func onTmpfs(t *testing.T, dir string) bool {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return st.Type == unix.TMPFS_MAGIC
}

// TestStateDirOwnTmpfs: a state dir New makes itself gets a tmpfs of its own when its
// filesystem is on disk (once, however many starts), again after a reboot emptied it (the
// marker beneath), and a sandbox runs on it; a directory someone else made stays as it is.
func TestStateDirOwnTmpfs(t *testing.T) {
	testutil.RequireRoot(t)
	parent, err := os.MkdirTemp("", "al")
	if err == nil {
		err = os.Chmod(parent, 0o711) // the sandbox's mapped root traverses it
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := RemoveStateDir(parent); err != nil {
			t.Errorf("RemoveStateDir: %v", err)
		}
		if _, err := os.Stat(parent); !os.IsNotExist(err) {
			t.Errorf("RemoveStateDir left %s: %v", parent, err)
		}
	})
	if onTmpfs(t, parent) {
		t.Skipf("%s is on tmpfs already: nothing for the runtime to mount", parent)
	}

	theirs := filepath.Join(parent, "theirs")
	if err := os.Mkdir(theirs, 0o711); err != nil {
		t.Fatal(err)
	}
	newTestBackendAt(t, theirs)
	if onTmpfs(t, theirs) || mountsAt(t, theirs) != 0 {
		t.Errorf("a state dir someone else made got a tmpfs: %d mounts on it", mountsAt(t, theirs))
	}

	ours := filepath.Join(parent, "ours")
	b := newTestBackendAt(t, ours)
	newTestBackendAt(t, ours) // a second start on it
	if !onTmpfs(t, ours) || mountsAt(t, ours) != 1 {
		t.Fatalf("state dir made by New: tmpfs %v, %d mounts on it, want a tmpfs, one", onTmpfs(t, ours), mountsAt(t, ours))
	}
	ctx := context.Background()
	s, err := b.Create(ctx, hostDecl("tmpfs"))
	if err != nil {
		t.Fatal(err)
	}
	a, err := b.Connect(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if out, _, res := run(t, a, "echo ok"); strings.TrimSpace(out) != "ok" || res.ExitCode != 0 {
		t.Fatalf("exec on a tmpfs state dir: %q, %+v", out, res)
	}
	if err := b.Terminate(ctx, s.ID); err != nil {
		t.Fatal(err)
	}

	// A reboot: the tmpfs is gone, the marker beneath is all that is left.
	if err := unix.Unmount(ours, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(ours); len(entries) != 1 || entries[0].Name() != tmpfsMarker {
		t.Fatalf("beneath the tmpfs: %v, want only %s", entries, tmpfsMarker)
	}
	newTestBackendAt(t, ours)
	if !onTmpfs(t, ours) || mountsAt(t, ours) != 1 {
		t.Errorf("after a reboot: tmpfs %v, %d mounts, want a tmpfs again, one", onTmpfs(t, ours), mountsAt(t, ours))
	}
}

// TestRemoveStateDirInThreadNamespace: a thread in a mount namespace of its own (not the
// main thread's) removes a state dir with a tmpfs mounted in that namespace only. Read from
// /proc/self (the main thread's table), the mount is missed and the removal fails busy.
func TestRemoveStateDirInThreadNamespace(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o711); err != nil {
		t.Fatal(err)
	}
	// A test's goroutine can run on any thread, the main one included. A goroutine that lands
	// on the main thread keeps it (locked, parked until the test ends) and another is started:
	// that one cannot be on the main thread.
	release := make(chan struct{})
	defer close(release)
	errc := make(chan error, 1)
	var attempt func()
	attempt = func() {
		// Never unlocked off the main thread: the thread, in its own mount namespace, ends with
		// this goroutine.
		runtime.LockOSThread()
		if unix.Gettid() == os.Getpid() {
			go attempt()
			<-release
			runtime.UnlockOSThread()
			return
		}
		err := unix.Unshare(unix.CLONE_NEWNS)
		if err == nil {
			err = unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, "")
		}
		if err == nil {
			err = unix.Mount("airlock-state", state, "tmpfs", 0, "mode=0711")
		}
		if err == nil {
			err = RemoveStateDir(dir)
			if _, serr := os.Stat(dir); err == nil && !os.IsNotExist(serr) {
				err = fmt.Errorf("RemoveStateDir left %s: %v", dir, serr)
			}
		}
		errc <- err
	}
	go attempt()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}
