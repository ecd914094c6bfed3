package local

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// A directory root (an unpacked image, a directory image) reaches the sandbox as a clone of
// its mount tree that the host makes read-only, nosuid and nodev, and those flags must stay:
// the kernel locks a mount's flags only when the mount reaches a less privileged user
// namespace by a namespace copy, so the host attaches the clone in its own namespace at
// <session>/image just before init is cloned (CLONE_NEWUSER|CLONE_NEWNS copies and locks it)
// and detaches its own copy right after; init mirrors the root from its locked copy (nsinit's
// dirRoot). Binds init made itself of an unlocked mount, it could remount read-write, and so
// could the sandbox's root after it: for a directory image, write the image's world-writable
// files on the host. A create that dies between attach and detach leaves the mount, which
// destroy detaches before it removes the session dir.
//
// An unpacked image's files belong to UIDBase+id on the host (image.ResolveOptions.UIDBase),
// a range no sandbox maps: seen from a sandbox, every one of them would be the overflow id's
// (nobody), so an image's /home/app owned by its uid 1000, mode 0700, would be closed to the
// code running as 1000. Its clone is idmapped too (mount_setattr(2) needs the host, root in
// the initial user namespace, for that), through a user namespace taking UIDBase+id to the
// sandbox's own range: inside, every file shows the owner the image gave it. Nothing on disk
// changes and no sandbox process ever holds a cache file's host id; a sandbox's root owns the
// image's files through the mapping, which is why the lock above matters most here (with a
// writable mount it could rewrite the shared cache for every later sandbox).

// imageMount is the session dir's mount point of a directory root's clone.
const imageMount = "image"

// rootTree returns a detached, read-only clone of the mount tree at src. With fileBase not 0
// the clone is idmapped: files owned by fileBase+id on disk show as hostBase+id (so as id in a
// sandbox mapping 0 to hostBase).
func (b *Backend) rootTree(src string, fileBase, hostBase int) (*os.File, error) {
	// Private: a clone of a shared mount joins its peer group, and the detach after init's copy
	// would propagate to the peers, unmounting the host's own mounts below src (a container's
	// root under dockerd's shared data root, for one).
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV, Propagation: unix.MS_PRIVATE}
	if fileBase != 0 {
		ns, err := b.idmapUserns(fileBase, hostBase)
		if err != nil {
			return nil, err
		}
		defer ns.Close()
		attr.Attr_set |= unix.MOUNT_ATTR_IDMAP
		attr.Userns_fd = uint64(ns.Fd())
	}
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return nil, &os.PathError{Op: "open_tree", Path: src, Err: err}
	}
	tree := os.NewFile(uintptr(fd), src)
	if err := unix.MountSetattr(int(tree.Fd()), "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, attr); err != nil {
		tree.Close()
		return nil, &os.PathError{Op: "mount_setattr", Path: src, Err: err}
	}
	return tree, nil
}

// idmapUserns returns a user namespace mapping fileBase.. to hostBase.. (uids and gids, one
// range). A user namespace exists only as some process's: a child is cloned into one and its
// map written (exec.Cmd does both), and the namespace is held by an fd on it. The child is
// killed at once; until it is reaped its credentials, and so the namespace, stay readable
// through /proc/<pid>/ns/user — it is our child, its pid cannot be reused meanwhile.
func (b *Backend) idmapUserns(fileBase, hostBase int) (*os.File, error) {
	self, err := os.Open(b.agentPath)
	if err != nil {
		return nil, fmt.Errorf("agent binary: %w", err)
	}
	defer self.Close()
	ids := []syscall.SysProcIDMap{{ContainerID: fileBase, HostID: hostBase, Size: idRange}}
	cmd := &exec.Cmd{
		// Any binary will do, it never gets to run: the agent's, by descriptor, as for init.
		Path:        "/proc/self/fd/3",
		Args:        []string{"airlock-idmap"},
		Env:         []string{},
		Dir:         "/",
		ExtraFiles:  []*os.File{self},
		SysProcAttr: &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER, UidMappings: ids, GidMappings: ids},
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("idmap user namespace: %w", err)
	}
	ns, nsErr := os.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid))
	_ = cmd.Process.Kill()
	_ = cmd.Wait() // killed: its status says so
	if nsErr != nil {
		return nil, fmt.Errorf("idmap user namespace: %w", nsErr)
	}
	return ns, nil
}

// attachImage mounts tree at dir/image in the host's mount namespace, for init's clone to
// copy (and lock); detachImage removes the host's copy.
func attachImage(dir string, tree *os.File) (string, error) {
	mp := filepath.Join(dir, imageMount)
	if err := os.Mkdir(mp, 0o700); err != nil {
		return "", err
	}
	if err := unix.MoveMount(int(tree.Fd()), "", unix.AT_FDCWD, mp, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return "", &os.PathError{Op: "move_mount", Path: mp, Err: err}
	}
	return mp, nil
}

// detachImage lazily unmounts the host's copy of a directory root under session dir dir, if
// there is one.
func detachImage(dir string) error {
	err := unix.Unmount(filepath.Join(dir, imageMount), unix.MNT_DETACH)
	if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
		return nil // detached already, never attached, or no such dir
	}
	return fmt.Errorf("unmount %s: %w", filepath.Join(dir, imageMount), err)
}

// hostCopy is the host's copy of a root's clone (attachImage), detached off the create's path:
// an unmount waits for an RCU grace period, milliseconds on a busy machine, and init needs
// nothing from it once cloned.
type hostCopy struct {
	dir  string
	once sync.Once
	done chan error
}

func newHostCopy(dir string) *hostCopy { return &hostCopy{dir: dir, done: make(chan error, 1)} }

// detach starts the unmount; the first call only.
func (h *hostCopy) detach() {
	h.once.Do(func() { go func() { h.done <- detachImage(h.dir) }() })
}

// wait detaches (if not started yet) and returns the unmount's error.
func (h *hostCopy) wait() error {
	h.detach()
	err := <-h.done
	h.done <- err // later waits get it too
	return err
}
