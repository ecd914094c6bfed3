// Package statedir holds what every backend's state directory shares: session ids, the master secret, the lock and finding the agent.
package statedir

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

const (
	// DefaultDir is root's state dir.
	DefaultDir = "/run/airlock"
	// MasterFile holds the 32-byte secret per-session signing keys are derived from.
	MasterFile = "master.key"
	// LockFile is flocked: exclusive while reconciling, shared while creating.
	LockFile = ".lock"
)

// isSessionID reports whether id is "s-" and 16 lower-case hex digits (what NewSessionID makes).
func isSessionID(id string) bool {
	if len(id) != 18 || id[:2] != "s-" {
		return false
	}
	for i := 2; i < len(id); i++ {
		if c := id[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// NewSessionID returns "s-" and 16 random hex digits.
func NewSessionID() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return "s-" + hex.EncodeToString(b[:]), nil
}

// CheckSessionID refuses anything NewSessionID could not have made; ids become paths.
func CheckSessionID(id string) error {
	if !isSessionID(id) {
		return fmt.Errorf("%w: session id %q is not of the form s-<16 hex digits>", sbtypes.ErrInvalid, id)
	}
	return nil
}

// LoadMaster reads the state dir's master secret, creating it (0600) on first use.
func LoadMaster(stateDir string) ([]byte, error) {
	p := filepath.Join(stateDir, MasterFile)
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err == nil {
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			f.Close()
			return nil, err
		}
		if _, err := f.Write(key); err != nil {
			f.Close()
			return nil, err
		}
		if err := f.Close(); err != nil {
			return nil, err
		}
		return key, nil
	}
	if !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("master secret %s: %w", p, err)
	}
	return ReadMaster(stateDir)
}

// ReadMaster reads the state dir's master secret; fs.ErrNotExist when it has none yet.
func ReadMaster(stateDir string) ([]byte, error) {
	p := filepath.Join(stateDir, MasterFile)
	fi, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%w: master secret %s has mode %v: it must not be readable by group or others", sbtypes.ErrRefused, p, fi.Mode().Perm())
	}
	key, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	if len(key) < 32 {
		return nil, fmt.Errorf("%w: master secret %s is %d bytes, want 32", sbtypes.ErrInvalid, p, len(key))
	}
	return key, nil
}

// ResolveAgent finds the agent binary: opt, $AIRLOCK_AGENT, "airlock-agent" next to this
// executable, on PATH, else this executable run as "__agent" (args then start with it).
// accept is the backend's own demand on a regular file (executable by others, static...).
func ResolveAgent(opt string, args []string, accept func(abs string, fi fs.FileInfo) error) (string, []string, error) {
	check := func(p string) (string, error) {
		abs, err := filepath.Abs(p)
		if err != nil {
			return "", err
		}
		fi, err := os.Stat(abs)
		if err != nil {
			return "", err
		}
		if !fi.Mode().IsRegular() {
			return "", fmt.Errorf("%w: agent binary %s is not a regular file", sbtypes.ErrInvalid, abs)
		}
		if err := accept(abs, fi); err != nil {
			return "", err
		}
		return abs, nil
	}
	if opt != "" {
		p, err := check(opt)
		return p, args, err
	}
	if env := os.Getenv("AIRLOCK_AGENT"); env != "" {
		p, err := check(env)
		if err != nil {
			return "", nil, fmt.Errorf("$AIRLOCK_AGENT: %w", err)
		}
		return p, args, nil
	}
	self, err := os.Executable()
	if err != nil {
		return "", nil, err
	}
	if p, err := check(filepath.Join(filepath.Dir(self), "airlock-agent")); err == nil {
		return p, args, nil
	}
	if lp, err := exec.LookPath("airlock-agent"); err == nil {
		if p, err := check(lp); err == nil {
			return p, args, nil
		}
	}
	p, err := check(self)
	if err != nil {
		err = fmt.Errorf("no usable agent binary (looked at the agent option, $AIRLOCK_AGENT, airlock-agent next to %s and on PATH, and %s itself): %w", self, self, err)
		if runtime.GOOS != "linux" {
			// This executable is not a Linux one, and a sandbox runs Linux whatever the host.
			err = fmt.Errorf("%w; this host runs %s: give the agent built for Linux (CGO_ENABLED=0 GOOS=linux go build ./cmd/airlock-agent) as $AIRLOCK_AGENT or airlock-agent next to %s", err, runtime.GOOS, self)
		}
		return "", nil, err
	}
	return p, append([]string{"__agent"}, args...), nil
}

// DefaultDirForUser is the state dir a process of this user uses by default: DefaultDir for
// root, $XDG_RUNTIME_DIR/airlock for anyone else ("" when that is unset).
func DefaultDirForUser() string {
	if os.Geteuid() == 0 {
		return DefaultDir
	}
	if run := os.Getenv("XDG_RUNTIME_DIR"); run != "" {
		return filepath.Join(run, "airlock")
	}
	return ""
}
