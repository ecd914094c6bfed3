package spares

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/kernfile"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// TestOpenRefuses: each check a claim makes of a spare it took, on a fabricated spare whose
// init is this test process and whose agent does not exist, so that a check that is missing
// shows as the agent's error instead of its own (the root tests in claim_test.go park real
// spares, which fail several checks at once: a paused agent does not answer either). The
// /etc check runs beside the agent's and yields to its error: TestClaimDiscards has it.
func TestOpenRefuses(t *testing.T) {
	testutil.RequireRoot(t) // a frozen cgroup
	state := t.TempDir()
	master := make([]byte, 32)
	self, err := StartTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	// An empty cgroup, frozen: what a paused spare's freezer shows.
	rel := "airlock-spares-test-" + strings.TrimPrefix(filepath.Base(state), "Test")
	version, frozen := 1, "FROZEN"
	if _, err := os.Stat(filepath.Join(kernfile.CgroupRoot, "freezer")); err != nil {
		version, frozen = 2, "1"
	}
	fz := FreezerOf(&RecordCore{Cgroup: "/" + rel, CgroupVersion: version})
	if err := os.Mkdir(fz.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(fz.Dir) })
	if err := os.WriteFile(fz.StateFile(), []byte(frozen), 0); err != nil {
		t.Fatal(err)
	}
	base := func() Record {
		var r Record
		r.RecordCore = RecordCore{ID: "s-0123456789abcdef", SandboxID: "box", InitPID: os.Getpid(), InitStart: self, ExpiresAt: time.Now().Add(time.Hour)}
		return r
	}
	tests := []struct {
		name string
		edit func(r *Record)
		want string
	}{
		{"agent", func(r *Record) {}, "agent.sock"},
		{"another session's record", func(r *Record) { r.ID = "s-fedcba9876543210" }, "names session"},
		{"gVisor", func(r *Record) { r.Runtime = "gvisor" }, `runtime "gvisor"`},
		{"too little lifetime left", func(r *Record) { r.ExpiresAt = time.Now().Add(time.Second) }, "of lifetime left"},
		{"init gone", func(r *Record) { r.InitPID = gone.Process.Pid }, "no such process"},
		{"init another process", func(r *Record) { r.InitStart = self + 1 }, "is gone"},
		{"paused", func(r *Record) { r.Cgroup, r.CgroupVersion = "/"+rel, version }, "paused"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := base()
			tt.edit(&r)
			dir := filepath.Join(state, "s-0123456789abcdef")
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			raw, err := json.Marshal(r)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, RecordFile), raw, 0o600); err != nil {
				t.Fatal(err)
			}
			c, err := open(t.Context(), state, Entry{Session: "s-0123456789abcdef"}, master, time.Minute)
			if c != nil || err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("open: %v, %v; want an error naming %q", c, err, tt.want)
			}
		})
	}
}
