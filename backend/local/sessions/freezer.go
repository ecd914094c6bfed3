//go:build linux

package sessions

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/kernfile"
)

// Freezer is one sandbox's freezer control, whichever the cgroup version. The kernel's freezer
// state is the only record of a native sandbox's pause: every process sharing the state dir
// sees it. A gVisor sandbox is paused by runsc instead (the freezer breaks its Sentry), and a
// file in its session dir records that pause.
type Freezer struct {
	Version int
	Dir     string // the sandbox's cgroup directory in the freezer (v1) or unified (v2) hierarchy
	// Mark, when set, is the file whose presence records a pause runsc made (gVisor).
	Mark string
}

// PauseMark is the name of a gVisor session's pause record in its directory.
const PauseMark = "paused"

// FreezerOf is the freezer of rec's sandbox.
func FreezerOf(rec *RecordCore) Freezer {
	if rec.CgroupVersion == 2 {
		return Freezer{Version: 2, Dir: filepath.Join(kernfile.CgroupRoot, rec.Cgroup)}
	}
	return Freezer{Version: 1, Dir: filepath.Join(kernfile.CgroupRoot, "freezer", rec.Cgroup)}
}

// StateFile is the file that says whether a freeze was asked for.
func (f Freezer) StateFile() string {
	if f.Version == 2 {
		return filepath.Join(f.Dir, "cgroup.freeze")
	}
	return filepath.Join(f.Dir, "freezer.state")
}

// Paused reports whether a freeze was asked for (FREEZING counts: the sandbox is being paused),
// or for a gVisor sandbox whether its pause mark is there.
func (f Freezer) Paused() (bool, error) {
	if f.Mark != "" {
		_, err := os.Lstat(f.Mark)
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		return err == nil, err
	}
	return ReadFreezeRequest(f.Version, f.StateFile())
}

// ReadFreezeRequest reads and parses a freezer state file (see StateFile), through kernfile:
// every agent call reads it, and os.ReadFile would wake the caller's poller each time.
func ReadFreezeRequest(version int, name string) (bool, error) {
	b, err := kernfile.Read(name)
	if err != nil {
		return false, err
	}
	return ParseFreezeRequest(version, string(b))
}

// ParseFreezeRequest reads freezer.state (v1: THAWED, FREEZING, FROZEN) or cgroup.freeze
// (v2: 0 or 1).
func ParseFreezeRequest(version int, s string) (bool, error) {
	s = strings.TrimSpace(s)
	if version == 2 {
		switch s {
		case "0":
			return false, nil
		case "1":
			return true, nil
		}
		return false, fmt.Errorf("cgroup.freeze: unexpected %q", s)
	}
	switch s {
	case "THAWED":
		return false, nil
	case "FREEZING", "FROZEN":
		return true, nil
	}
	return false, fmt.Errorf("freezer.state: unexpected %q", s)
}

// Thaw thaws the sandbox's freezer subtree without waiting for it to settle: what a kill
// needs, for a frozen task to take its SIGKILL. On v1 every cgroup below the sandbox's is
// thawed too: a child frozen on its own (the agent freezes an exec's cgroup while it kills it,
// and may itself be killed before it thaws it) stays frozen when only its parent is thawed.
// On v2 it is the sandbox's own cgroup.freeze, which Pause sets (the agent kills an exec's
// cgroup there with cgroup.kill, without freezing it).
func (f Freezer) Thaw() error {
	if f.Version == 2 {
		return os.WriteFile(filepath.Join(f.Dir, "cgroup.freeze"), []byte("0"), 0)
	}
	var errs []error
	err := filepath.WalkDir(f.Dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if kernfile.CgroupGone(err) {
				return nil
			}
			return err
		}
		if d.IsDir() {
			// ENODEV: the cgroup was removed between the walk and the write (an exec's cgroup
			// the agent removes, or another process's terminate of the same sandbox).
			if err := kernfile.Write(filepath.Join(p, "freezer.state"), "THAWED"); err != nil && !kernfile.CgroupGone(err) {
				errs = append(errs, err)
			}
		}
		return nil
	})
	return errors.Join(append(errs, err)...)
}
