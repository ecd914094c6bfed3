package local

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/airlock-sandbox/airlock/backend/local/sessions"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// A pool's sandbox (a process pool's ready one, a parked sandbox being made or parked) belongs to the process
// that made it until a claim hands it out: only then is it anyone's session. Before that it
// is a session of the state dir like any other on disk, so without a rule another process on
// the same state dir (a daemon listing its sessions, a client that learnt the id) could exec
// in it, and the claimer would then get a sandbox someone had already used. So lookups from
// any other process do not find it: List leaves it out, Get, Connect and the rest answer
// not found. Terminate still ends it (gc, a reconcile), which hands it to no one.

// heldElsewhere reports whether the sandbox in session dir dir, labelled labels, is a pool's sandbox
// one another process holds: a pool's (LabelPool) not yet claimed (claimedFile) whose pool is
// not this process's, or a parked sandbox (LabelParked) not yet claimed (sessions.ClaimPrefix) that another
// process is making or parked.
func heldElsewhere(dir string, labels map[string]string) bool {
	var maker string
	switch {
	case labels[LabelPool] != "":
		if _, err := os.Stat(filepath.Join(dir, claimedFile)); err == nil {
			return false
		}
		maker = labels[labelPoolFiller]
	case labels[LabelParked] != "":
		if _, claimed := sessions.Claimer(dir); claimed {
			return false
		}
		maker = labels[labelParkedFiller]
	default:
		return false
	}
	self, err := sessions.SelfProc()
	return err != nil || maker != self
}

// errHeldElsewhere is lookup's answer for a pool's sandbox another process holds.
func errHeldElsewhere(id string) error {
	return fmt.Errorf("%w: session %s is a pool's sandbox sandbox another process holds until it is claimed", sandbox.ErrNotFound, id)
}
