package local

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRootCloneDetachSparesHostMounts: a directory root with a shared mount below it (dockerd
// makes its data root shared, so every container's root is one) reaches the sandbox through a
// recursive clone that the host attaches and then lazily detaches. A clone of a shared mount
// joins its peer group, and a detach propagates to the peers: without the clone made private,
// detaching it unmounted the host's own mount below the image — a running container's root.
func TestRootCloneDetachSparesHostMounts(t *testing.T) {
	b := newTestBackend(t)
	root := minimalRootfs(t)
	// root/data: a shared mount (as dockerd's data root), root/data/merged a mount below it
	// (as a container's root: mounted under a shared parent, it is shared too).
	data := filepath.Join(root, "data")
	merged := filepath.Join(data, "merged")
	if err := os.MkdirAll(data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", data, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(data, unix.MNT_DETACH) })
	if err := unix.Mount("", data, "", unix.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(merged, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", merged, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(merged, unix.MNT_DETACH) })

	dir := filepath.Join(b.opts.StateDir, "s-00000000000000cc")
	if err := os.Mkdir(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	tree, err := b.rootTree(root, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer tree.Close()
	mp, err := attachImage(dir, tree)
	if err != nil {
		t.Fatal(err)
	}
	if !mounted(t, filepath.Join(mp, "data", "merged")) {
		t.Fatalf("the clone lacks the mount below the root")
	}
	if err := detachImage(dir); err != nil {
		t.Fatal(err)
	}
	if !mounted(t, merged) {
		t.Errorf("detaching the root's clone unmounted the host's %s", merged)
	}
	if !mounted(t, data) {
		t.Errorf("detaching the root's clone unmounted the host's %s", data)
	}
}
