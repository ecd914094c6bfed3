//go:build !linux

package docker

import (
	"context"
	"fmt"
	"runtime"

	"github.com/airlock-sandbox/airlock/sandbox"
)

// mountTmpfs refuses: a scratch tmpfs sized to the disk limit is mounted on the host, which
// only Linux does here; a user other than root has the engine mount one in the container.
func mountTmpfs(rw, _ string) error {
	return fmt.Errorf("%w: the docker backend run as root mounts each sandbox's scratch tmpfs on the host, which needs Linux (this host runs %s): run airlock as a user other than root, and the engine mounts it", sandbox.ErrUnsupported, runtime.GOOS)
}

// unmountScratch has nothing to unmount: mountTmpfs mounts nothing off Linux.
func unmountScratch(string) error { return nil }

// freezerV1 reports no cgroup v1 freezer: cgroups are Linux's.
func freezerV1() bool { return false }

// removeCgroupTree has nothing to remove: no session has a cgroup of ours off Linux.
func removeCgroupTree(context.Context, string) error { return nil }
