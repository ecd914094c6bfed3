package local

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/image"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// sh runs a shell command in a session and fails the test unless it exits 0.
func sh(t *testing.T, b *Backend, id, cmd string) string {
	t.Helper()
	a, err := b.Connect(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	out, errs, res := run(t, a, cmd)
	if res.ExitCode != 0 {
		t.Fatalf("%q in %s: exit %d\nout %s\nerr %s", cmd, id, res.ExitCode, out, errs)
	}
	return out
}

// populate is what the round trip carries: files, modes, symlinks in and out, an empty
// directory, a hard link, a sticky directory, an old mtime, and a file in /tmp.
const populate = `set -e
cd "$HOME"
printf 'alpha\n' > a.txt
printf 'secret' > private; chmod 600 private
printf '#!/bin/sh\necho ran\n' > run.sh; chmod 755 run.sh
mkdir -p deep/er/est; printf 'x' > deep/er/est/leaf
mkdir empty; chmod 700 empty
mkdir shared; chmod 1777 shared
ln -s a.txt rel
ln -s /etc/passwd abs
ln -s / rootlink
ln -s ../../../../../../etc climb
ln a.txt hard
touch -d '2001-02-03 04:05:06' a.txt
printf 'tmpdata' > /tmp/t.txt
`

const describe = `cd "$HOME"
for f in a.txt private run.sh deep deep/er/est/leaf empty shared rel abs rootlink climb hard; do
  stat -c '%n %a %u:%g %F' "$f"
done
readlink rel abs rootlink climb
cat a.txt deep/er/est/leaf /tmp/t.txt; echo
stat -c '%Y' a.txt
stat -c '%i' a.txt hard | sort -u | wc -l
./run.sh
ls -A empty | wc -l
`

func TestSnapshotRoundTrip(t *testing.T) {
	b := newTestBackend(t)
	ctx := context.Background()
	if st := b.Capabilities(ctx).Entries[capability.Snapshot]; !st.Supported {
		t.Fatalf("capability snapshot: %+v", st)
	}
	parent, err := b.Create(ctx, hostDecl("snap-src"))
	if err != nil {
		t.Fatal(err)
	}
	sh(t, b, parent.ID, populate)
	want := sh(t, b, parent.ID, describe)

	info, err := b.Snapshot(ctx, parent.ID, "round-trip")
	if err != nil {
		t.Fatal(err)
	}
	if info.Name != "round-trip" || info.SessionID != parent.ID || info.Base != image.BaseHost || info.Digest == "" || info.Files == 0 || info.Size == 0 {
		t.Fatalf("snapshot %+v", info)
	}
	// The parent keeps running after the capture's freeze.
	if got, _ := b.Get(ctx, parent.ID); got.State != sandbox.StateRunning {
		t.Fatalf("parent after snapshot: %s", got.State)
	}
	if _, err := b.Snapshot(ctx, parent.ID, "round-trip"); !errors.Is(err, sandbox.ErrConflict) {
		t.Fatalf("the same name twice: %v", err)
	}

	d := hostDecl("snap-dst")
	d.Image = spec.Image{Snapshot: "round-trip"}
	child, err := b.Create(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	got := sh(t, b, child.ID, describe)
	if got != want {
		t.Fatalf("restored sandbox differs\nparent:\n%s\nchild:\n%s", want, got)
	}
	for _, s := range []string{"a.txt 644 1000:1000", "private 600 1000:1000", "run.sh 755", "empty 700", "shared 1777", "rel 777 1000:1000 symbolic link", "/etc/passwd\n/\n", "alpha\nxtmpdata", "981173106\n1\nran\n0\n"} {
		if !strings.Contains(got, s) {
			t.Errorf("restored sandbox lacks %q:\n%s", s, got)
		}
	}
	// The session directory no longer holds the remapped layer once the sandbox runs.
	if _, err := os.Stat(filepath.Join(b.opts.StateDir, child.ID, restoreFile)); !os.IsNotExist(err) {
		t.Errorf("%s left in the session directory: %v", restoreFile, err)
	}
}

// TestSnapshotNeverFollowsSymlinks: symlinks that point out of the sandbox (resolved from the
// host through /proc/<pid>/root they would reach the host's files) are stored as symlinks,
// and nothing of what they point to is in the layer.
func TestSnapshotNeverFollowsSymlinks(t *testing.T) {
	b := newTestBackend(t)
	ctx := context.Background()
	s, err := b.Create(ctx, hostDecl("snap-links"))
	if err != nil {
		t.Fatal(err)
	}
	sh(t, b, s.ID, `cd "$HOME" && ln -s / root && ln -s /etc etc && ln -s /etc/shadow shadow && ln -s ../../../../proc/1/root up`)
	if _, err := b.Snapshot(ctx, s.ID, "links"); err != nil {
		t.Fatal(err)
	}
	store, err := b.snapshotStore()
	if err != nil {
		t.Fatal(err)
	}
	info, err := store.Get("links")
	if err != nil {
		t.Fatal(err)
	}
	rc, err := store.OpenLayer(info)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	links := map[string]string{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch hdr.Typeflag {
		case tar.TypeSymlink:
			links[hdr.Name] = hdr.Linkname
		case tar.TypeDir:
			if hdr.Name != "workspace/" && hdr.Name != "tmp/" {
				t.Errorf("unexpected directory %s: a symlink was followed", hdr.Name)
			}
		default:
			t.Errorf("unexpected entry %s (type %c)", hdr.Name, hdr.Typeflag)
		}
	}
	want := map[string]string{"workspace/root": "/", "workspace/etc": "/etc", "workspace/shadow": "/etc/shadow", "workspace/up": "../../../../proc/1/root"}
	for k, v := range want {
		if links[k] != v {
			t.Errorf("%s -> %q, want %q (all: %v)", k, links[k], v, links)
		}
	}
}

func TestSnapshotListDelete(t *testing.T) {
	b := newTestBackend(t)
	ctx := context.Background()
	s, err := b.Create(ctx, hostDecl("snap-list"))
	if err != nil {
		t.Fatal(err)
	}
	sh(t, b, s.ID, `echo 1 > "$HOME/f"`)
	for _, n := range []string{"one", "two"} {
		if _, err := b.Snapshot(ctx, s.ID, n); err != nil {
			t.Fatal(err)
		}
	}
	names := func() string {
		list, err := b.ListSnapshots(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ns []string
		for _, x := range list {
			ns = append(ns, x.Name)
		}
		return strings.Join(ns, ",")
	}
	if got := names(); got != "one,two" {
		t.Fatalf("list %q", got)
	}
	// A sandbox made from a snapshot outlives the snapshot's deletion.
	d := hostDecl("from-one")
	d.Image = spec.Image{Snapshot: "one"}
	c, err := b.Create(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.DeleteSnapshot(ctx, "one"); err != nil {
		t.Fatal(err)
	}
	if got := names(); got != "two" {
		t.Fatalf("list after delete %q", got)
	}
	if _, err := os.Stat(filepath.Join(b.opts.ImageCacheDir, "snapshots", "meta", "one.json")); !os.IsNotExist(err) {
		t.Fatalf("store entry still there: %v", err)
	}
	if err := b.DeleteSnapshot(ctx, "one"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("deleting again: %v", err)
	}
	if _, err := b.Create(ctx, d); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("create from a deleted snapshot: %v", err)
	}
	if out := sh(t, b, c.ID, `cat "$HOME/f"`); out != "1\n" {
		t.Fatalf("child after its snapshot was deleted: %q", out)
	}
	// ... and can itself be snapshotted: its base was recorded in its session directory.
	if _, err := b.Snapshot(ctx, c.ID, "grandchild"); err != nil {
		t.Fatal(err)
	}
	if err := b.DeleteSnapshot(ctx, "two"); err != nil {
		t.Fatal(err)
	}
	if err := b.DeleteSnapshot(ctx, "grandchild"); err != nil {
		t.Fatal(err)
	}
	if got := names(); got != "" {
		t.Fatalf("list after deleting all %q", got)
	}
}

func TestSnapshotRefusals(t *testing.T) {
	b := newTestBackend(t)
	ctx := context.Background()
	s, err := b.Create(ctx, hostDecl("snap-ref"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Snapshot(ctx, s.ID, "bad/name"); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("bad name: %v", err)
	}
	if _, err := b.Fork(ctx, s.ID, 0); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("fork 0: %v", err)
	}
	if _, err := b.Fork(ctx, s.ID, MaxFork+1); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("fork too many: %v", err)
	}
	d := hostDecl("nosuch")
	d.Image = spec.Image{Snapshot: "nosuch"}
	if _, err := b.Create(ctx, d); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("create from a missing snapshot: %v", err)
	}
	// A snapshot bigger than the new sandbox's disk fails its create, and leaves nothing.
	sh(t, b, s.ID, `head -c 3000000 /dev/zero > "$HOME/big"`)
	if _, err := b.Snapshot(ctx, s.ID, "big"); err != nil {
		t.Fatal(err)
	}
	small := hostDecl("small")
	small.Image = spec.Image{Snapshot: "big"}
	small.Limits.Disk = "2Mi"
	if _, err := b.Create(ctx, small); err == nil || !strings.Contains(err.Error(), "disk limit") {
		t.Errorf("a snapshot larger than the disk: %v", err)
	}
	if list, _ := b.List(ctx); len(list) != 1 {
		t.Errorf("sessions after the failed create: %d", len(list))
	}
	// A paused sandbox is captured and stays paused.
	if err := b.Pause(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Snapshot(ctx, s.ID, "paused"); err != nil {
		t.Fatal(err)
	}
	if got, _ := b.Get(ctx, s.ID); got.State != sandbox.StatePaused {
		t.Errorf("state after snapshotting a paused sandbox: %s", got.State)
	}
	if err := b.Resume(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	// A terminated session has nothing to capture.
	if err := b.Terminate(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Snapshot(ctx, s.ID, "after"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("snapshot of a terminated session: %v", err)
	}
	if _, err := b.Fork(ctx, s.ID, 1); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("fork of a terminated session: %v", err)
	}
}

func TestFork(t *testing.T) {
	b := newTestBackend(t)
	ctx := context.Background()
	parent, err := b.Create(ctx, hostDecl("fork-parent"))
	if err != nil {
		t.Fatal(err)
	}
	sh(t, b, parent.ID, `echo parent > "$HOME/f"; mkdir "$HOME/d"`)
	kids, err := b.Fork(ctx, parent.ID, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(kids) != 2 || kids[0].ID == kids[1].ID || kids[0].ID == parent.ID {
		t.Fatalf("children %+v", kids)
	}
	snap := kids[0].Spec.Image.Snapshot
	if snap == "" || kids[1].Spec.Image.Snapshot != snap {
		t.Fatalf("children's image %+v %+v", kids[0].Spec.Image, kids[1].Spec.Image)
	}
	for _, k := range kids {
		if out := sh(t, b, k.ID, `cat "$HOME/f"; test -d "$HOME/d" && echo dir`); out != "parent\ndir\n" {
			t.Fatalf("child %s starts with %q", k.ID, out)
		}
	}
	sh(t, b, kids[0].ID, `echo child0 > "$HOME/f"; echo only0 > "$HOME/g"; rmdir "$HOME/d"`)
	sh(t, b, kids[1].ID, `echo only1 > "$HOME/h"`)
	check := func(id, want string) {
		t.Helper()
		out := sh(t, b, id, `cd "$HOME"; cat f; for x in g h d; do test -e $x && echo has-$x; done; true`)
		if out != want {
			t.Errorf("%s: %q, want %q", id, out, want)
		}
	}
	check(kids[0].ID, "child0\nhas-g\n")
	check(kids[1].ID, "parent\nhas-h\nhas-d\n")
	check(parent.ID, "parent\nhas-d\n")
	// The children are separate sandboxes: ending one leaves the others.
	if err := b.Terminate(ctx, kids[0].ID); err != nil {
		t.Fatal(err)
	}
	check(kids[1].ID, "parent\nhas-h\nhas-d\n")
	if err := b.DeleteSnapshot(ctx, snap); err != nil {
		t.Fatal(err)
	}
}

// TestSnapshotOCIImage: the snapshot of an image sandbox is that image plus one layer, and a
// sandbox from it has the image's files and the captured ones, in another workdir too.
func TestSnapshotOCIImage(t *testing.T) {
	b := newTestBackend(t)
	ctx := context.Background()
	layoutDir := writeOCILayout(t, minimalRootfs(t))
	d := hostDecl("snap-oci")
	d.Image = spec.Image{OCILayout: layoutDir}
	d.Workdir = "/home/work"
	s, err := b.Create(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	sh(t, b, s.ID, `echo mine > /home/work/mine`)
	if sum, err := b.Snapshot(ctx, s.ID, "oci"); err != nil || sum.Base != image.BaseImage {
		t.Fatalf("snapshot %+v %v", sum, err)
	}
	store, err := b.snapshotStore()
	if err != nil {
		t.Fatal(err)
	}
	info, err := store.Get("oci")
	if err != nil {
		t.Fatal(err)
	}
	if info.Base.Kind != image.BaseImage || info.Base.Source == nil || info.Base.Source.OCILayout != layoutDir || info.Workdir != "/home/work" {
		t.Fatalf("snapshot %+v", info)
	}
	img, err := store.Image(info)
	if err != nil {
		t.Fatal(err)
	}
	if ls, _ := img.Layers(); len(ls) != 2 {
		t.Fatalf("snapshot image has %d layers, want the image's 1 + 1", len(ls))
	}
	// The image source can go: the snapshot holds its base.
	if err := os.RemoveAll(layoutDir); err != nil {
		t.Fatal(err)
	}
	c := hostDecl("from-oci")
	c.Image = spec.Image{Snapshot: "oci"}
	child, err := b.Create(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if out := sh(t, b, child.ID, `cat /hello /workspace/mine; echo "$AIRLOCK_FROM_IMAGE"`); out != "from the image\nmine\nyes\n" {
		t.Fatalf("child: %q", out)
	}
	if _, err := b.Snapshot(ctx, child.ID, "oci-2"); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"oci", "oci-2"} {
		if err := b.DeleteSnapshot(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
}
