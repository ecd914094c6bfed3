package gc

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/internal/kernfile"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/runcode/runcodetest"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The hierarchies the local runtime makes its cgroups in (cgroup v1, as on this host and CI).
var v1 = []string{"freezer", "pids", "cpu", "cpuacct", "memory"}

func cgDirs(rel string) []string {
	var out []string
	for _, h := range v1 {
		out = append(out, filepath.Join(kernfile.CgroupRoot, h, rel))
	}
	return out
}

func existing(dirs []string) []string {
	var out []string
	for _, d := range dirs {
		if _, err := os.Stat(d); err == nil {
			out = append(out, d)
		}
	}
	return out
}

func mkdirs(t *testing.T, dirs []string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// removeTestTree is the cleanup for a cgroup tree the test made, should gc have left it.
func removeTestTree(dirs []string) {
	for _, d := range dirs {
		var tree []string
		filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				tree = append(tree, p)
			}
			return nil
		})
		slices.Reverse(tree)
		for _, p := range tree {
			os.Remove(p)
		}
	}
}

// TestGC: a live sandbox survives, whether or not its state dir is known; an orphan empty
// cgroup (in a live parent, and a whole orphan parent) goes; a stale record goes through the
// backend's reconcile; the dry run reports the same and changes nothing. Only cgroups this
// test made are looked at (Match): the host's own leftovers are not touched.
func TestGC(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := os.Stat(filepath.Join(kernfile.CgroupRoot, "freezer", "cgroup.procs")); err != nil {
		t.Fatalf("this test needs cgroup v1 hierarchies at %s: %v", kernfile.CgroupRoot, err)
	}
	agent, cleanup, err := runcodetest.BuildAgent()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	t.Setenv("AIRLOCK_AGENT", agent)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stateDir := runcodetest.StateDir(t)
	parent := runcodetest.CgroupParent(t)
	b, err := local.New(ctx, local.Options{StateDir: stateDir, CgroupParent: parent})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := b.Create(ctx, spec.Sandbox{ID: "gc-live", Image: spec.Image{Host: true}, Session: spec.Session{MaxLifetimeSeconds: new(int64(600))}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Terminate(context.Background(), sess.ID); err != nil {
			t.Errorf("terminate: %v", err)
		}
		b.Close()
	})
	liveDirs := existing(cgDirs(filepath.Join(parent, sess.ID)))
	if len(liveDirs) != len(v1) {
		t.Fatalf("the live sandbox's cgroups: %v", liveDirs)
	}

	rnd := make([]byte, 4)
	rand.Read(rnd)
	orphanTop := "airlock-gctest-" + hex.EncodeToString(rnd)
	orphanSession := "s-00000000000000aa"
	inParent := cgDirs(filepath.Join(parent, orphanSession))
	mkdirs(t, cgDirs(filepath.Join(parent, orphanSession, "code"))) // nested, as the runtime's
	topDirs := cgDirs(orphanTop)
	mkdirs(t, cgDirs(filepath.Join(orphanTop, "s-00000000000000ab")))
	t.Cleanup(func() { removeTestTree(inParent); removeTestTree(topDirs) })

	// A stale record: its init is a process that is gone.
	stale := "s-00000000000000bb"
	if err := os.Mkdir(filepath.Join(stateDir, stale), 0o700); err != nil {
		t.Fatal(err)
	}
	rec := fmt.Sprintf(`{"id":%q,"sandboxId":"gone","initPid":%d,"initStart":1}`, stale, 1<<22-1)
	if err := os.WriteFile(filepath.Join(stateDir, stale, "session.json"), []byte(rec), 0o600); err != nil {
		t.Fatal(err)
	}

	ours := func(n string) bool { return n == parent || n == orphanTop }
	sorted := func(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }
	wantGone := sorted(slices.Concat(inParent, cgDirs(filepath.Join(parent, orphanSession, "code")), topDirs, cgDirs(filepath.Join(orphanTop, "s-00000000000000ab"))))

	// Dry run: the same report, nothing changed.
	rep, err := Run(ctx, Options{StateDirs: []string{stateDir}, Match: ours, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(sorted(rep.Cgroups), wantGone) {
		t.Fatalf("dry run cgroups:\n got %v\nwant %v\nkept %v", sorted(rep.Cgroups), wantGone, rep.Kept)
	}
	if !slices.Equal(rep.Sessions, []string{filepath.Join(stateDir, stale)}) {
		t.Fatalf("dry run sessions: %v", rep.Sessions)
	}
	if len(existing(wantGone)) != len(wantGone) {
		t.Fatal("the dry run removed cgroups")
	}
	if _, err := os.Stat(filepath.Join(stateDir, stale)); err != nil {
		t.Fatalf("the dry run removed the stale record: %v", err)
	}

	// Too young: MinAge spares everything that changed recently.
	rep, err = Run(ctx, Options{Match: ours, MinAge: time.Hour, Reconcile: noReconcile(t)})
	if err != nil || len(rep.Cgroups) != 0 {
		t.Fatalf("min age: removed %v, %v", rep.Cgroups, err)
	}

	// No state dir known: the live sandbox is still spared (it has processes).
	rep, err = Run(ctx, Options{Match: func(n string) bool { return n == parent }, Reconcile: noReconcile(t)})
	if err != nil {
		t.Fatal(err)
	}
	if len(existing(liveDirs)) != len(v1) {
		t.Fatalf("gc without state dirs removed the live sandbox's cgroups: %v", rep.Cgroups)
	}
	if !slices.ContainsFunc(rep.Kept, func(k string) bool { return strings.Contains(k, sess.ID+": has processes") }) {
		t.Fatalf("kept: %v", rep.Kept)
	}
	if len(existing(inParent)) != 0 {
		t.Fatalf("the orphan next to the live sandbox stayed: %v", existing(inParent))
	}

	// For real, with the state dir: the stale record through reconcile, the orphan parent.
	mkdirs(t, cgDirs(filepath.Join(parent, orphanSession, "code")))
	rep, err = Run(ctx, Options{StateDirs: []string{stateDir}, Match: ours})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(sorted(rep.Cgroups), wantGone) {
		t.Fatalf("cgroups removed:\n got %v\nwant %v", sorted(rep.Cgroups), wantGone)
	}
	if left := existing(wantGone); len(left) != 0 {
		t.Fatalf("reported removed but present: %v", left)
	}
	if !slices.Equal(rep.Sessions, []string{filepath.Join(stateDir, stale)}) {
		t.Fatalf("sessions: %v", rep.Sessions)
	}
	if _, err := os.Stat(filepath.Join(stateDir, stale)); !os.IsNotExist(err) {
		t.Fatalf("stale record: %v", err)
	}
	if !slices.ContainsFunc(rep.Kept, func(k string) bool { return k == parent+"/"+sess.ID+": a session of a state dir" }) {
		t.Fatalf("kept: %v", rep.Kept)
	}

	// The live sandbox still runs.
	ag, err := b.Connect(ctx, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	res, err := ag.Exec(ctx, sandbox.ExecRequest{Argv: []string{"/bin/echo", "alive"}, Timeout: 30 * time.Second}, &out, nil)
	if err != nil || res.ExitCode != 0 || out.String() != "alive\n" {
		t.Fatalf("exec after gc: %q %+v %v", out.String(), res, err)
	}
	if len(existing(liveDirs)) != len(v1) {
		t.Fatal("the live sandbox's cgroups are gone")
	}
}

func noReconcile(t *testing.T) func(context.Context, string) ([]string, error) {
	return func(context.Context, string) ([]string, error) {
		t.Error("reconcile called without a state dir")
		return nil, nil
	}
}

// TestGCKeepTops: with KeepTops the matched cgroup's empty children go and it stays (a
// rootless user's delegated cgroup is root's); without, it goes too.
func TestGCKeepTops(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := os.Stat(filepath.Join(kernfile.CgroupRoot, "freezer", "cgroup.procs")); err != nil {
		t.Fatalf("this test needs cgroup v1 hierarchies at %s: %v", kernfile.CgroupRoot, err)
	}
	rnd := make([]byte, 4)
	rand.Read(rnd)
	top := "airlock-gctest-" + hex.EncodeToString(rnd)
	topDirs := cgDirs(top)
	t.Cleanup(func() { removeTestTree(topDirs) })
	ours := func(n string) bool { return n == top }
	for _, keep := range []bool{true, false} {
		mkdirs(t, cgDirs(filepath.Join(top, "a3f0", "s-00000000000000ac")))
		rep, err := Run(context.Background(), Options{Match: ours, KeepTops: keep, Reconcile: noReconcile(t)})
		if err != nil {
			t.Fatal(err)
		}
		if left := existing(cgDirs(filepath.Join(top, "a3f0"))); len(left) != 0 {
			t.Errorf("keep %v: children left: %v", keep, left)
		}
		if kept := len(existing(topDirs)) == len(topDirs); kept != keep {
			t.Errorf("keep %v: the top is there: %v (report %+v)", keep, kept, rep)
		}
	}
}
