package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/gc"
	"github.com/airlock-sandbox/airlock/internal/kernfile"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

func TestGCFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"gc", "--min-age", "-1s"}, "--min-age -1s must not be negative"},
		{[]string{"gc", "extra"}, "unknown command"},
	} {
		if code, _, errs := cliIn(t, "", tc.args...); code == 0 || !strings.Contains(errs, tc.err) {
			t.Errorf("%v: exit %d, %q (want %q)", tc.args, code, errs, tc.err)
		}
	}
}

// TestGCDryRun: the dry run reports an orphan empty airlock-* cgroup and leaves it. (The
// removal itself is tested in internal/gc, on cgroups that test makes; a real run here would
// reach the host's own leftovers.)
func TestGCDryRun(t *testing.T) {
	testutil.RequireRoot(t)
	b := make([]byte, 4)
	rand.Read(b)
	orphan := filepath.Join(kernfile.CgroupRoot, "freezer", "airlock-gccli-"+hex.EncodeToString(b))
	if err := os.Mkdir(orphan, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(orphan) })
	code, out, errs := cliIn(t, "", "gc", "--dry-run", "--min-age", "0", "--state-dir", t.TempDir(), "-o", "json")
	var rep gc.Report
	if code != 0 || json.Unmarshal([]byte(out), &rep) != nil || !rep.DryRun {
		t.Fatalf("gc --dry-run: %d %q %q", code, out, errs)
	}
	if !slices.Contains(rep.Cgroups, orphan) {
		t.Fatalf("the orphan %s is not reported: %v", orphan, rep.Cgroups)
	}
	if _, err := os.Stat(orphan); err != nil {
		t.Fatalf("the dry run removed it: %v", err)
	}
	code, out, _ = cliIn(t, "", "gc", "--dry-run", "--min-age", "0", "--state-dir", t.TempDir())
	if code != 0 || !strings.Contains(out, "would remove cgroup "+orphan+"\n") || !strings.Contains(out, "would remove 0 session records") {
		t.Fatalf("text: %d %q", code, out)
	}
}
