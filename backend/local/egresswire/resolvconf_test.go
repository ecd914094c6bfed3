package egresswire

import (
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/airlock-sandbox/airlock/backend/local/nsinit"
)

// The session's run dir belongs to the sandbox's root, so whatever the host writes there must
// not follow what the sandbox put in its place: a symlink or a FIFO named resolv.conf.
func TestWriteResolvConfStaysInRunDir(t *testing.T) {
	resolver := netip.MustParseAddr("10.88.0.1")
	cases := []struct {
		name  string
		plant func(t *testing.T, runDir, victim string)
	}{
		{"symlink to a host file", func(t *testing.T, runDir, victim string) {
			if err := os.Symlink(victim, filepath.Join(runDir, nsinit.ResolvConfFile)); err != nil {
				t.Fatal(err)
			}
		}},
		{"relative symlink out of the session", func(t *testing.T, runDir, victim string) {
			rel, err := filepath.Rel(runDir, victim)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(rel, filepath.Join(runDir, nsinit.ResolvConfFile)); err != nil {
				t.Fatal(err)
			}
		}},
		{"fifo", func(t *testing.T, runDir, victim string) {
			if err := syscall.Mkfifo(filepath.Join(runDir, nsinit.ResolvConfFile), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			top := t.TempDir()
			victim := filepath.Join(top, "victim")
			if err := os.WriteFile(victim, []byte("host data\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(top, "session")
			if err := os.MkdirAll(filepath.Join(dir, "run"), 0o755); err != nil {
				t.Fatal(err)
			}
			tc.plant(t, filepath.Join(dir, "run"), victim)
			if err := WriteResolvConf(dir, resolver); err == nil {
				t.Error("WriteResolvConf wrote through what the sandbox planted; want an error")
			}
			if b, err := os.ReadFile(victim); err != nil || string(b) != "host data\n" {
				t.Errorf("host victim = %q, %v; want it untouched", b, err)
			}
		})
	}
	t.Run("regular file is rewritten", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.MkdirAll(filepath.Join(dir, "run"), 0o755); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, "run", nsinit.ResolvConfFile)
		if err := os.WriteFile(p, []byte("old old old old old old old old old old\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := WriteResolvConf(dir, resolver); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(p); string(b) != string(nsinit.ResolvConf(resolver)) {
			t.Errorf("resolv.conf = %q, want %q", b, nsinit.ResolvConf(resolver))
		}
	})
}
