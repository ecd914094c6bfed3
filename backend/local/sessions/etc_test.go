package sessions

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestSourceIDFormat: the identity string stays what earlier versions wrote into manifests
// (a different one would rebuild every copy once).
func TestSourceIDFormat(t *testing.T) {
	p := t.TempDir()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%d:%d:%o:%d:%d.%d:%d.%d", st.Dev, st.Ino, st.Mode, st.Size,
		st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec)
	if got := SourceID(p); got != want {
		t.Errorf("SourceID = %q, want %q", got, want)
	}
	if got := SourceID(filepath.Join(p, "absent")); got != "" {
		t.Errorf("SourceID of an absent path = %q, want empty", got)
	}
}

// TestEtcCurrent: a parked sandbox's /etc copy is current while its manifest names it and every source
// is unchanged; a changed source, a newer copy, a changed host name list or no manifest make it
// stale; a sandbox without a copy (not a host image) is always current.
func TestEtcCurrent(t *testing.T) {
	state := t.TempDir()
	cache := filepath.Join(state, EtcCacheDir)
	if err := os.MkdirAll(cache, 0o755); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(t.TempDir(), "motd")
	if err := os.WriteFile(src, []byte("one\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	write := func(m EtcManifest) {
		t.Helper()
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(EtcManifestPath(cache, m.Workdir), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	rec := func(workdir, etcDir string) *Record {
		r := &Record{RecordCore: RecordCore{EtcDir: etcDir}}
		r.Spec.Workdir = workdir
		return r
	}
	good := EtcManifest{Workdir: DefaultWorkdir, Dir: "v2-good", Names: HostEtc(), Sources: []EtcSource{{Path: src, ID: SourceID(src)}}}
	tests := []struct {
		name  string
		setup func()
		rec   *Record
		stale bool
	}{
		{"no copy", nil, rec("", ""), false},
		{"current (default workdir)", func() { write(good) }, rec("", "v2-good"), false},
		{"current (named workdir)", func() { m := good; m.Workdir = "/w"; write(m) }, rec("/w", "v2-good"), false},
		{"no manifest for the workdir", nil, rec("/elsewhere", "v2-good"), true},
		{"a newer copy", func() { m := good; m.Dir = "v2-newer"; write(m) }, rec("", "v2-good"), true},
		{"host names changed", func() { m := good; m.Names = append(HostEtc(), "python3.99"); write(m) }, rec("", "v2-good"), true},
		{"a source changed", func() {
			write(good)
			time.Sleep(10 * time.Millisecond) // a distinct mtime even on coarse clocks
			if err := os.WriteFile(src, []byte("two\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, rec("", "v2-good"), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.setup != nil {
				tt.setup()
			}
			if err := EtcCurrent(state, tt.rec); (err != nil) != tt.stale {
				t.Fatalf("EtcCurrent = %v, want stale %v", err, tt.stale)
			}
		})
	}
}
