//go:build linux

package docker

import (
	"errors"
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/kernfile"
)

// removeCgroupTree removes a session's freezer cgroup and what the agent made below it.
var removeCgroupTree = kernfile.RemoveCgroupTree

// mountTmpfs mounts a session's scratch tmpfs on rw with the given mount options.
func mountTmpfs(rw, data string) error {
	if err := unix.Mount("tmpfs", rw, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		return fmt.Errorf("mount the scratch tmpfs on %s: %w", rw, err)
	}
	return nil
}

// unmountScratch unmounts the scratch tmpfs on rw, confirming it is no mount point after.
func unmountScratch(rw string) error {
	for range 8 { // a tmpfs mounted twice (should never happen) needs two unmounts
		// Only a mount point is unmounted: a user other than root has no scratch of its
		// own, and may not even try (EPERM).
		if mounted, err := isMountPoint(rw); err != nil || !mounted {
			break
		}
		err := unix.Unmount(rw, unix.UMOUNT_NOFOLLOW)
		if err == unix.EINVAL || err == unix.ENOENT {
			break // not a mount point (any more), or no such directory
		}
		if err != nil {
			return fmt.Errorf("unmount %s: %w", rw, err)
		}
	}
	if mounted, err := isMountPoint(rw); err != nil {
		return err
	} else if mounted {
		return fmt.Errorf("%s is still a mount point", rw)
	}
	return nil
}

// isMountPoint reports whether p is a mount point (false when p does not exist).
func isMountPoint(p string) (bool, error) {
	var st, parent unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, err
	}
	if err := unix.Lstat(filepath.Dir(p), &parent); err != nil {
		return false, err
	}
	return st.Dev != parent.Dev, nil
}

// freezerV1 reports whether the host has a cgroup v1 freezer hierarchy the agent can be given
// a part of.
func freezerV1() bool {
	var st unix.Statfs_t
	return unix.Statfs(filepath.Join(kernfile.CgroupRoot, "freezer"), &st) == nil && st.Type == unix.CGROUP_SUPER_MAGIC
}
