// Package sessions is a local session's core without the runtime: record, liveness, freezer, tokens, and the parked pool's index and claim.
package sessions

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/statedir"
)

// A parked sandbox is in one of three states, each visible on disk to every process (docs/pool.md#parked-sandboxes-airlock-run):
//   - being made: labelled with its key and filler (backend/local), nothing else;
//   - parked: an index file <state>/spares/<key>/<session> holds its Entry;
//   - claimed: that file was renamed (atomically: one claimer wins) into the session's own
//     dir as ClaimPrefix+<owner>.
//
// This package is what a claimer needs without the runtime (airlock run's lean front links
// it, not backend/local, whose package inits cost a one-shot run ~2 ms); backend/local builds
// its parked sandboxes on it.
const (
	// DirName is the state dir's subdirectory that holds the index (and a filler's log).
	DirName = "spares"
	// ClaimPrefix names a claimed parked sandbox's claim file in its session dir; the claimer follows.
	ClaimPrefix = "spare-claimed."
)

// Entry is a parked sandbox's index file.
type Entry struct {
	Session string    `json:"session"`
	Parked  time.Time `json:"parked"`
	// Prestart is what the filler's prestart returned, for the claimer.
	Prestart json.RawMessage `json:"prestart,omitempty"`
	// Token is an execute token for the claimer, minted by the filler with the session's key
	// and valid until the sandbox's own end (ExpiresAt): a claimer that has it derives no key
	// and signs nothing (Ed25519's signing table alone is ~0.75 ms of CPU in a fresh process).
	// It grants less than the master key kept beside it in the same state dir.
	Token string `json:"token,omitempty"`
}

// ParkedDir is where a state dir keeps its parked sandboxes' index (and a filler's log).
func ParkedDir(stateDir string) string { return filepath.Join(stateDir, DirName) }

// IndexDir is the index of key's parked sandboxes.
func IndexDir(stateDir, key string) string { return filepath.Join(stateDir, DirName, key) }

// Parked reads key's index, newest first (ParkedIDs' order); entries it cannot read are
// skipped.
func Parked(stateDir, key string) ([]Entry, error) {
	ids, err := ParkedIDs(stateDir, key)
	if err != nil {
		return nil, err
	}
	out := make([]Entry, 0, len(ids))
	for _, id := range ids {
		data, err := os.ReadFile(filepath.Join(IndexDir(stateDir, key), id))
		if err != nil {
			continue // claimed meanwhile
		}
		if e, err := decodeEntry(data, id); err == nil {
			out = append(out, e)
		}
	}
	return out, nil
}

// ParkedIDs lists key's parked sandboxes, newest first by their index file's modification time
// (written once, when parked), reading no entry: a claim reads only the one it takes
// (ReadTaken), where reading every entry (Parked) cost a run ~20 µs per sandbox parked.
func ParkedIDs(stateDir, key string) ([]string, error) {
	idx := IndexDir(stateDir, key)
	ents, err := os.ReadDir(idx)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	type parked struct {
		id string
		at time.Time
	}
	out := make([]parked, 0, len(ents))
	for _, de := range ents {
		if statedir.CheckSessionID(de.Name()) != nil {
			continue
		}
		fi, err := de.Info()
		if err != nil {
			continue // claimed meanwhile
		}
		out = append(out, parked{de.Name(), fi.ModTime()})
	}
	slices.SortFunc(out, func(x, y parked) int { return y.at.Compare(x.at) })
	ids := make([]string, len(out))
	for i, p := range out {
		ids[i] = p.id
	}
	return ids, nil
}

// ReadTaken reads the entry of a parked sandbox this process took (Take): its claim file.
func ReadTaken(stateDir, id, owner string) (Entry, error) {
	data, err := os.ReadFile(filepath.Join(stateDir, id, ClaimPrefix+owner))
	if err != nil {
		return Entry{}, err
	}
	return decodeEntry(data, id)
}

// decodeEntry decodes parked sandbox id's index entry.
func decodeEntry(data []byte, id string) (Entry, error) {
	var e Entry
	if err := json.Unmarshal(data, &e); err != nil {
		return e, fmt.Errorf("parked sandbox %s: its index entry: %w", id, err)
	}
	if e.Session != id {
		return e, fmt.Errorf("parked sandbox %s: its index entry names session %q", id, e.Session)
	}
	return e, nil
}

// Take claims a parked sandbox's index entry for owner (SelfProc): true when this process won
// it. rename(2) is atomic: of any number of racing claimers exactly one wins.
func Take(stateDir, key, id, owner string) bool {
	err := os.Rename(filepath.Join(IndexDir(stateDir, key), id), filepath.Join(stateDir, id, ClaimPrefix+owner))
	return err == nil
}

// Claimer returns the owner recorded by a claim in a session dir.
func Claimer(dir string) (string, bool) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", false
	}
	for _, e := range ents {
		if owner, ok := strings.CutPrefix(e.Name(), ClaimPrefix); ok {
			return owner, true
		}
	}
	return "", false
}

// SelfProc is this process as "<pid>-<start time>" (ProcAlive's format), read once.
var SelfProc = sync.OnceValues(func() (string, error) {
	start, err := StartTime(os.Getpid())
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%d-%d", os.Getpid(), start), nil
})
