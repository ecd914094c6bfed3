//go:build unix

package kernfile

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/backoff"
)

// RemoveCgroupTree removes the cgroup directory root and every cgroup below it, deepest first:
// cgroupfs directories go with rmdir, their files with them. A cgroup still holding a task that
// is leaving (EBUSY) is tried again until ctx ends (an ended ctx: tried once). An absent cgroup,
// or one that goes meanwhile (another process removing the same tree), is not an error.
func RemoveCgroupTree(ctx context.Context, root string) error {
	var dirs []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if CgroupGone(err) {
				return nil // its children went before it; the rest of the tree is still there
			}
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := rmdirBusy(ctx, dirs[i]); err != nil {
			return err
		}
	}
	return nil
}

// CgroupGone reports whether err means the cgroup (or the file) is not there: never made, or
// removed meanwhile. A cgroup removed after its file was opened answers ENODEV, not ENOENT
// (another process terminating the same sandbox, an exec cgroup the agent removed).
func CgroupGone(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENODEV)
}

func rmdirBusy(ctx context.Context, dir string) error {
	wait := backoff.New(time.Millisecond, 100*time.Millisecond)
	for {
		err := unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("remove cgroup %s: %w", dir, err)
		}
		if !wait.Wait(ctx) {
			return fmt.Errorf("remove cgroup %s: still busy: %w", dir, err)
		}
	}
}
