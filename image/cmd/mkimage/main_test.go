package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"go.uber.org/goleak"

	"github.com/airlock-sandbox/airlock/image"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/spec"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestPackAndResolve packs a directory both ways, resolves each through the image package and
// finds the same tree; packing again gives the same image.
func TestPackAndResolve(t *testing.T) {
	testutil.RequireRoot(t)
	src := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "usr/bin"), 0o755))
	must(os.WriteFile(filepath.Join(src, "usr/bin/tool"), []byte("#!/bin/sh\n"), 0o755))
	must(os.Symlink("usr/bin", filepath.Join(src, "bin")))
	must(os.Link(filepath.Join(src, "usr/bin/tool"), filepath.Join(src, "usr/bin/alias")))
	must(os.Mkdir(filepath.Join(src, "tmp"), 0o777))
	must(os.Chmod(filepath.Join(src, "tmp"), os.ModeSticky|0o777))

	out := t.TempDir()
	oci, archive := filepath.Join(out, "oci"), filepath.Join(out, "img.tar")
	for _, gz := range []bool{false, true, false} {
		must(run(src, oci, archive, "airlock.local/test:1", "/workspace", nil, gz))
	}
	idx, err := layout.ImageIndexFromPath(oci)
	must(err)
	im, err := idx.IndexManifest()
	must(err)
	if len(im.Manifests) != 1 {
		t.Fatalf("layout holds %d manifests after repacking, want 1", len(im.Manifests))
	}

	cache := t.TempDir()
	var dirs []string
	for _, s := range []spec.Image{{OCILayout: oci}, {Tarball: archive}} {
		dir, err := image.Resolve(context.Background(), s, cache, nil)
		must(err)
		dirs = append(dirs, dir)
	}
	if dirs[0] != dirs[1] {
		t.Errorf("layout and archive of one directory resolved to different entries: %v", dirs)
	}
	dir := dirs[0]
	if l, err := os.Readlink(filepath.Join(dir, "bin")); err != nil || l != "usr/bin" {
		t.Errorf("bin -> %q, %v", l, err)
	}
	a, err1 := os.Stat(filepath.Join(dir, "usr/bin/tool"))
	b, err2 := os.Stat(filepath.Join(dir, "usr/bin/alias"))
	must(err1)
	must(err2)
	if a.Sys().(*syscall.Stat_t).Ino != b.Sys().(*syscall.Stat_t).Ino || a.Mode().Perm() != 0o755 {
		t.Errorf("tool/alias: not one inode, or mode %v", a.Mode())
	}
	if fi, err := os.Stat(filepath.Join(dir, "tmp")); err != nil || fi.Mode()&os.ModeSticky == 0 {
		t.Errorf("tmp lost its sticky bit: %v, %v", fi, err)
	}
	e, err := image.Inspect(dir)
	must(err)
	if e.Config.WorkingDir != "/workspace" || len(e.Config.Env) == 0 {
		t.Errorf("config = %+v", e.Config)
	}
}

// TestMkrootfsEndToEnd builds the host-binaries rootfs with hack/mkrootfs.sh, packs it, resolves
// it with the local runtime's id shift, and runs python from the cache entry under chroot.
func TestMkrootfsEndToEnd(t *testing.T) {
	testutil.RequireRoot(t)
	if testing.Short() {
		t.Skip("builds a ~150 MB rootfs from host binaries")
	}
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("no /usr/bin/python3 on this host")
	}
	out := t.TempDir()
	script, err := filepath.Abs("../../../hack/mkrootfs.sh")
	if err != nil {
		t.Fatal(err)
	}
	oci := filepath.Join(out, "oci")
	cmd := exec.Command(script, "--oci-layout", oci, filepath.Join(out, "rootfs"))
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mkrootfs: %v\n%s", err, b)
	}
	// Idempotent: a second run changes nothing.
	before, _ := os.Stat(filepath.Join(oci, "index.json"))
	if b, err := exec.Command(script, "--oci-layout", oci, filepath.Join(out, "rootfs")).CombinedOutput(); err != nil || !strings.Contains(string(b), "up to date") {
		t.Fatalf("second mkrootfs run: %v\n%s", err, b)
	}
	after, _ := os.Stat(filepath.Join(oci, "index.json"))
	if !before.ModTime().Equal(after.ModTime()) {
		t.Error("second mkrootfs run rewrote the layout")
	}

	dir, err := image.ResolveWith(context.Background(), spec.Image{OCILayout: oci}, filepath.Join(out, "cache"), image.ResolveOptions{UIDBase: 100000})
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, "usr/bin/python3"))
	if err != nil {
		t.Fatal(err)
	}
	if uid := fi.Sys().(*syscall.Stat_t).Uid; uid != 100000 {
		t.Errorf("python3 owned by host uid %d, want 100000 (sandbox root)", uid)
	}
	b, err := exec.Command("chroot", dir, "/usr/bin/python3", "-c", "import json, ssl; print(json.dumps(2+2))").CombinedOutput()
	if err != nil || strings.TrimSpace(string(b)) != "4" {
		t.Fatalf("python in the resolved root: %v\n%s", err, b)
	}
}
