package local

import (
	"os"
	"path/filepath"
)

// StaleSessions lists the sessions in stateDir whose sandbox is gone (no readable record, or
// its init is not the process that started): sessions New's reconcile reaps. It changes
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
		if rec, err := readRecord(filepath.Join(stateDir, e.Name())); err != nil || !alive(rec.InitPID, rec.InitStart) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}
