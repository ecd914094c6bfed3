package local

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/backend/local/gvisor"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/sandbox/conformance"
	"github.com/airlock-sandbox/airlock/spec"
)

// runscForTest is $AIRLOCK_RUNSC, else runsc on PATH. The gVisor tests skip when none is
// usable (the capability then says why), but fail when $AIRLOCK_RUNSC names one that is not:
// CI builds runsc and sets it (.ci/run), so there they never skip.
func runscForTest(t *testing.T) string {
	t.Helper()
	p, err := gvisor.Find(os.Getenv("AIRLOCK_RUNSC"))
	if err != nil && os.Getenv("AIRLOCK_RUNSC") != "" {
		t.Fatalf("gVisor: AIRLOCK_RUNSC=%s: %v", os.Getenv("AIRLOCK_RUNSC"), err)
	}
	if err != nil {
		t.Skipf("gVisor: %v", err)
	}
	return p
}

func newGVisorBackend(t *testing.T, runsc string) *Backend {
	b := newTestBackend(t)
	b.opts.RunscPath = runsc
	b.runscPath = ""
	b.caps = b.capabilitySet()
	if !b.caps().Has("gvisor") {
		t.Fatalf("runsc %s is usable but the capability says %q", runsc, b.caps().Entries["gvisor"].Reason)
	}
	return b
}

func TestConformanceGVisor(t *testing.T) {
	runsc := runscForTest(t)
	conformance.Run(t, func(t *testing.T) sandbox.Backend { return newGVisorBackend(t, runsc) }, conformance.Options{
		Decl: func(id string) spec.Sandbox {
			return spec.Sandbox{ID: id, Image: spec.Image{Host: true}, Runtime: spec.RuntimeGVisor}
		},
		// The floor under gVisor; the set is the backend's, walked by TestConformance.
		Basic: true,
	})
}

// newGVisorSession creates a gVisor sandbox of the host image (mutate adjusts the declaration)
// on a backend of its own.
func newGVisorSession(t *testing.T, id string, mutate func(*spec.Sandbox)) (*Backend, *sandbox.Session) {
	t.Helper()
	b := newGVisorBackend(t, runscForTest(t))
	d := hostDecl(id)
	d.Runtime = spec.RuntimeGVisor
	if mutate != nil {
		mutate(&d)
	}
	sess, err := b.Create(context.Background(), d)
	if err != nil {
		t.Fatal(err)
	}
	return b, sess
}

// TestGVisorKernel: the code talks to gVisor's kernel, not the host's, and the sandbox leaves
// nothing behind.
func TestGVisorKernel(t *testing.T) {
	b, sess := newGVisorSession(t, "gv", nil)
	ctx := context.Background()
	pid := b.sessionInitPID(sess.ID)
	a, err := b.Connect(ctx, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	out, _, res := run(t, a, "uname -r; python3 -c 'print(2+2)'; id -u")
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	host := unix.ByteSliceToString(uts.Release[:])
	lines := strings.Split(out, "\n")
	if res.ExitCode != 0 || len(lines) < 3 || lines[0] == host || lines[1] != "4" || lines[2] != "1000" {
		t.Fatalf("in gVisor: %q %+v (host kernel %s)", out, res, host)
	}
	if err := b.Terminate(ctx, sess.ID); err != nil {
		t.Fatal(err)
	}
	assertGone(t, b, sess.ID, pid)
}

// TestGVisorLifetime: a gVisor sandbox ends at its lifetime like a native one (here the
// backend's timer ends it, gVisor's agent having no deadline of its own) and leaves nothing.
func TestGVisorLifetime(t *testing.T) {
	life := int64(2)
	b, sess := newGVisorSession(t, "gv-life", func(d *spec.Sandbox) { d.Session.MaxLifetimeSeconds = &life })
	ctx := context.Background()
	pid := b.sessionInitPID(sess.ID)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := b.Get(ctx, sess.ID); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the gVisor sandbox outlived its lifetime")
		}
		time.Sleep(100 * time.Millisecond)
	}
	assertGone(t, b, sess.ID, pid)
}

// TestGVisorDirImage: a directory image under gVisor, read-only, with the runtime's mount
// points made by runsc.
func TestGVisorDirImage(t *testing.T) {
	runsc := runscForTest(t)
	root := minimalRootfs(t)
	b := newGVisorBackend(t, runsc)
	ctx := context.Background()
	sess, err := b.Create(ctx, spec.Sandbox{ID: "gv-dir", Image: spec.Image{Dir: root}, Runtime: spec.RuntimeGVisor})
	if err != nil {
		t.Fatal(err)
	}
	a, err := b.Connect(ctx, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	out, errs, res := run(t, a, "cat /hello; echo x > /hello 2>/dev/null || echo ro; echo w > probe && cat probe; id -u")
	if res.ExitCode != 0 || out != "from the image\nro\nw\n1000\n" {
		t.Errorf("out %q err %q res %+v", out, errs, res)
	}
	if _, err := os.Stat(filepath.Join(root, "workspace")); err == nil {
		t.Error("runsc created the workdir inside the image directory")
	}
}

// TestGVisorLimits: runsc puts the sandbox in a host cgroup of the runtime's naming that holds
// the declared limits, on cgroup v1 and v2 alike.
func TestGVisorLimits(t *testing.T) {
	b, sess := newGVisorSession(t, "gv-limits", func(d *spec.Sandbox) { d.Limits.Memory, d.Limits.CPU = "200Mi", "500m" })
	ctx := context.Background()
	defer b.Terminate(ctx, sess.ID)
	read := func(ctrl, name string) string {
		raw, err := os.ReadFile(filepath.Join(sessionCgroupDir(b, sess.ID, ctrl), name))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(raw))
	}
	mem := "209715200"
	want := map[[2]string]string{
		{"memory", "memory.limit_in_bytes"}: mem, {"cpu", "cpu.cfs_quota_us"}: "50000",
	}
	if b.cg.version() == 2 {
		want = map[[2]string]string{{"", "memory.max"}: mem, {"", "cpu.max"}: "50000 100000"}
	}
	for f, v := range want {
		if got := read(f[0], f[1]); got != v {
			t.Errorf("%s = %q, want %q", f[1], got, v)
		}
	}
	if procs := cgroupProcs(t, b, sess.ID); !slices.Contains(procs, strconv.Itoa(b.sessionInitPID(sess.ID))) {
		t.Errorf("the Sentry %d is not in the sandbox's cgroup (procs %v)", b.sessionInitPID(sess.ID), procs)
	}
}
