//go:build unix

package statedir

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// How Lock takes the lock.
const (
	LockExclusive = unix.LOCK_EX
	LockShared    = unix.LOCK_SH
)

// Lock takes the state dir's lock (LockExclusive or LockShared), so that a reconcile never
// reaps a sandbox that is still being created.
func Lock(stateDir string, how int) (release func(), err error) {
	f, err := os.OpenFile(filepath.Join(stateDir, LockFile), os.O_RDONLY|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err = unix.Flock(int(f.Fd()), how)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	return func() {
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
	}, nil
}
