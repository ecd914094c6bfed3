package server

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// DefaultSigningKeyFile holds the daemon's token signing key; it outlives restarts so that
// delegated tokens stay valid while the sessions they name are adopted again.
const DefaultSigningKeyFile = "/var/lib/airlock/daemon-token.key"

// checkSecretFile refuses a secret others may read or change.
func checkSecretFile(path string, fi fs.FileInfo) error {
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%w: %s is not a regular file", sandbox.ErrInvalid, path)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("%w: %s has mode %v: a secret must not be readable or writable by group or others (chmod 600)", sandbox.ErrInvalid, path, perm)
	}
	return nil
}

// LoadOrCreateSigningKey reads the daemon's Ed25519 key (a base64url seed) from path, creating
// it (mode 0600) when absent.
func LoadOrCreateSigningKey(path string) (ed25519.PrivateKey, error) {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, fmt.Errorf("signing key dir: %w", err)
		}
		seed := make([]byte, ed25519.SeedSize)
		_, _ = rand.Read(seed)
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, fmt.Errorf("signing key: %w", err)
		}
		_, werr := f.WriteString(base64.RawURLEncoding.EncodeToString(seed) + "\n")
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			os.Remove(path)
			return nil, fmt.Errorf("signing key: %w", werr)
		}
		return ed25519.NewKeyFromSeed(seed), nil
	}
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	if err := checkSecretFile(path, fi); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	seed, err := base64.RawURLEncoding.Strict().DecodeString(string(bytes.TrimSpace(b)))
	if err != nil || len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("%w: signing key %s: want the base64url (unpadded) encoding of a %d-byte Ed25519 seed", sandbox.ErrInvalid, path, ed25519.SeedSize)
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

// LoadAPIKeys reads API keys, one a line; blank lines and lines starting with # are skipped.
// The file must be private to its owner.
func LoadAPIKeys(path string) ([]string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("API key file: %w", err)
	}
	if err := checkSecretFile(path, fi); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("API key file: %w", err)
	}
	var keys []string
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if len(line) < MinAPIKeyLen || strings.ContainsAny(line, " \t") {
			return nil, fmt.Errorf("%w: API key file %s line %d: a key is at least %d characters without spaces", sandbox.ErrInvalid, path, i+1, MinAPIKeyLen)
		}
		keys = append(keys, line)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: API key file %s holds no key", sandbox.ErrInvalid, path)
	}
	return keys, nil
}

// LoadTemplates reads named templates from a Stack file: each sandbox is a template named by
// its id.
func LoadTemplates(path string) (map[string]spec.Sandbox, error) {
	st, err := spec.LoadStack(path)
	if err != nil {
		return nil, fmt.Errorf("templates: %w", err)
	}
	if fes := st.Validate(); len(fes) > 0 {
		return nil, fmt.Errorf("templates %s: %w", path, errors.Join(asErrors(fes)...))
	}
	out := make(map[string]spec.Sandbox, len(st.Sandboxes))
	for _, sb := range st.Sandboxes {
		out[sb.ID] = sb
	}
	return out, nil
}

func asErrors(fes []*spec.FieldError) []error {
	out := make([]error, len(fes))
	for i, fe := range fes {
		out[i] = fe
	}
	return out
}
