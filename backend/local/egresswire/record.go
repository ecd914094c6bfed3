// Package egresswire holds what wires a local sandbox to the egress gateway besides the gateway itself: the session's egress record, its resolv.conf, and the check of a policy against the host.
package egresswire

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/backend/local/sessions"
	"github.com/airlock-sandbox/airlock/spec"
)

// The gateway's resolver and proxy live in the process that attached the sandbox: there is no
// daemon. egress.json in the session dir records the policy in force and that process (its
// pid and start time), so that when it dies the next process that adopts the sandbox takes
// its egress over, and while it lives no other does.

// File is the session dir's egress record (Record).
const File = "egress.json"

// Record is egress.json: the policy in force and the process whose proxy enforces it.
type Record struct {
	Egress spec.Egress `json:"egress"`
	Owner  Owner       `json:"owner"`
}

// Owner is a process as egress.json names it: its pid and start time.
type Owner struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"`
}

// Self is this process as an owner.
var Self = sync.OnceValue(func() Owner {
	st, _ := sessions.StartTime(os.Getpid())
	return Owner{PID: os.Getpid(), Start: st}
})

// LiveElsewhere reports whether the owner is a running process other than this one.
func (o Owner) LiveElsewhere() bool {
	return o != Self() && sessions.Alive(o.PID, o.Start)
}

// ReadRecord reads session dir's egress.json.
func ReadRecord(dir string) (*Record, error) {
	data, err := os.ReadFile(filepath.Join(dir, File))
	if err != nil {
		return nil, err
	}
	var rec Record
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, File), err)
	}
	return &rec, nil
}

// UpdateRecord runs fn on session dir's egress.json under an exclusive lock on it, so that two
// processes never both take a sandbox's egress over; fn gets nil when there is no record and
// create is false, an empty one when create is true. It writes the record back when fn says so.
func UpdateRecord(dir string, create bool, fn func(*Record) (bool, error)) error {
	flags := os.O_RDWR
	if create {
		flags |= os.O_CREATE
	}
	f, err := os.OpenFile(filepath.Join(dir, File), flags, 0o600)
	if errors.Is(err, fs.ErrNotExist) && !create {
		_, err = fn(nil)
		return err
	}
	if err != nil {
		return err
	}
	defer f.Close()
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return err
	}
	rec := &Record{}
	if len(data) > 0 {
		if err := json.Unmarshal(data, rec); err != nil {
			return fmt.Errorf("%s: %w", f.Name(), err)
		}
	} else if !create {
		rec = nil
	}
	write, err := fn(rec)
	if err != nil || !write {
		return err
	}
	out, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err = f.WriteAt(out, 0)
	return err
}
