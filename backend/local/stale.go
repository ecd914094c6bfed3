package local

import (
	"os"
	"path/filepath"

	"github.com/airlock-sandbox/airlock/backend/local/sessions"
	"github.com/airlock-sandbox/airlock/spec"
)

// StaleSessions lists the sessions in stateDir whose sandbox is gone (no readable record, or
// its init is not the process that started) or can no longer be used (a one-shot sandbox
// whose creator is gone, creatorGone): sessions New's reconcile reaps. It changes
// nothing (`airlock gc --dry-run`); reconcile may reap more (an agent that does not answer).
func StaleSessions(stateDir string) ([]string, error) {
	entries, err := os.ReadDir(stateDir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() || checkSessionID(e.Name()) != nil {
			continue
		}
		if rec, err := readRecord(filepath.Join(stateDir, e.Name())); err != nil || !alive(rec.InitPID, rec.InitStart) || creatorGone(rec) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// creatorOf is the Creator a sandbox declared as decl records: this process when nobody may
// reattach to it and it is neither a pool's nor a parked sandbox's (those have owners of their own).
func creatorOf(decl spec.Sandbox) string {
	if decl.Session.CanReconnect() || decl.Labels[LabelPool] != "" || decl.Labels[LabelParked] != "" {
		return ""
	}
	self, err := sessions.SelfProc()
	if err != nil {
		return "" // unknown: reaped at its lifetime, as before
	}
	return self
}

// creatorGone reports whether rec is a sandbox nobody may reattach to whose creating process
// is gone (SIGKILLed mid-run, say): nobody can ever use it again, so it is reaped rather than
// adopted.
func creatorGone(rec *record) bool {
	return rec.Creator != "" && !procAlive(rec.Creator)
}
