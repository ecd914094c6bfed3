//go:build windows

package statedir

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/windows"
)

// How Lock takes the lock (LockFileEx's flags; shared is none).
const (
	LockExclusive = windows.LOCKFILE_EXCLUSIVE_LOCK
	LockShared    = 0
)

// Lock takes the state dir's lock (LockExclusive or LockShared), so that a reconcile never
// reaps a sandbox that is still being created. LockFileEx holds a byte range: the first byte
// stands for the whole state dir, as flock's whole-file lock does on unix.
func Lock(stateDir string, how int) (release func(), err error) {
	f, err := os.OpenFile(filepath.Join(stateDir, LockFile), os.O_RDONLY|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	h := windows.Handle(f.Fd())
	var ol windows.Overlapped
	if err := windows.LockFileEx(h, uint32(how), 0, 1, 0, &ol); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	return func() {
		_ = windows.UnlockFileEx(h, 0, 1, 0, &ol)
		f.Close()
	}, nil
}
