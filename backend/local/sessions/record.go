package sessions

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/token"
)

// RecordFile is a session dir's record (session.json).
const RecordFile = "session.json"

// RecordCore is session.json without the sandbox's declaration: what a later process needs to
// find, reach and reap a sandbox. backend/local's record embeds it with the full spec.Sandbox;
// Record with only what a claimer reads of it.
type RecordCore struct {
	ID        string `json:"id"`
	SandboxID string `json:"sandboxId"`
	// InitPID is the sandbox's PID 1 as the host sees it; InitStart its start time (clock
	// ticks since boot, /proc/<pid>/stat field 22), so a reused pid is never mistaken for it.
	InitPID       int       `json:"initPid"`
	InitStart     uint64    `json:"initStart"`
	Cgroup        string    `json:"cgroup"`
	CgroupVersion int       `json:"cgroupVersion"`
	Generation    uint64    `json:"generation"`
	CreatedAt     time.Time `json:"createdAt"`
	ExpiresAt     time.Time `json:"expiresAt"`
	LandlockABI   int       `json:"landlockAbi"`
	// EtcDir names the /etc copy a host-image sandbox has bound (etc.go), kept while it lives.
	EtcDir string `json:"etcDir,omitempty"`
	// Runtime is "gvisor" for a runsc sandbox, empty for the native runtime.
	Runtime string `json:"runtime,omitempty"`
	// IDRange is the host id range a native sandbox maps (idrange) and IDBase the host
	// id its id 0 maps to; IDBase 0: none (gVisor, or a record from before per-sandbox ranges,
	// which mapped Options.UIDBase).
	IDRange int `json:"idRange,omitempty"`
	IDBase  int `json:"idBase,omitempty"`
	// Creator is the process that created a sandbox nobody may reattach to (session.reconnect
	// false: a one-shot run's, an MCP server's), as "<pid>-<start>" (ProcAlive's format):
	// once it is gone nobody can use the sandbox, and the next reconcile (the next run, or
	// `airlock gc`) reaps it. Empty: reattachable, or a pool's or a parked sandbox's (their own rules).
	Creator string `json:"creator,omitempty"`
}

// Record is session.json as a claimer reads it: the core and the fields of the spec it needs,
// without decoding (or linking) the rest.
type Record struct {
	RecordCore
	Spec struct {
		Workdir string            `json:"workdir,omitempty"`
		Labels  map[string]string `json:"labels,omitempty"`
		Limits  struct {
			// Memory is the sandbox's limit as declared ("512Mi"), which a run reports.
			Memory string `json:"memory,omitempty"`
		} `json:"limits"`
	} `json:"spec"`
}

// DecodeRecord reads dir's session.json into v (a Record, or backend/local's record).
func DecodeRecord(dir string, v any) error {
	b, err := os.ReadFile(filepath.Join(dir, RecordFile))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(dir, RecordFile), err)
	}
	return nil
}

// ReadRecord reads dir's session.json.
func ReadRecord(dir string) (*Record, error) {
	var r Record
	if err := DecodeRecord(dir, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// TokenLifetime bounds each minted execute token; a fresh one is minted per request.
const TokenLifetime = 60 * time.Second

// MintExecute mints an execute token for rec's session, issued at and valid until the times
// given.
func MintExecute(key ed25519.PrivateKey, rec RecordCore, issued, expiry time.Time) (string, error) {
	return token.Mint(key, token.Claims{
		Sandbox: rec.SandboxID, Session: rec.ID, Generation: rec.Generation, Class: token.Execute,
		IssuedAt: issued.Unix(), Expiry: expiry.Unix(),
	})
}

// Tokens mints an execute token per request for rec's sandbox. Claims hold whole seconds and
// Ed25519 signs deterministically, so every token minted within one second is the same bytes:
// the second's token is kept and handed out again, a memo, not a longer-lived token (a run's
// health check, file write and exec mostly fall in one second; a signature is 50-100 us).
func Tokens(key ed25519.PrivateKey, rec RecordCore, now func() time.Time) func() string {
	var (
		mu  sync.Mutex
		sec int64
		tok string
	)
	return func() string {
		t := now()
		mu.Lock()
		defer mu.Unlock()
		if tok != "" && t.Unix() == sec {
			return tok
		}
		minted, err := MintExecute(key, rec, t, t.Add(TokenLifetime))
		if err != nil {
			return "" // the agent refuses an empty token; Mint fails only on a bad key
		}
		sec, tok = t.Unix(), minted
		return tok
	}
}
