package main

import (
	"context"
	"os"
	"path/filepath"
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
