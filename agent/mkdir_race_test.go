package agent_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/airlock-sandbox/airlock/agent"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// TestMkdirSwapRace: code racing a files-API mkdir swaps the new directory for something else
// between its creation and the agent's chmod/chown. Whatever it swaps in (a symlink to a
// root-owned directory, or that directory itself), the agent never hands it to the code's uid
// nor changes its mode.
func TestMkdirSwapRace(t *testing.T) {
	testutil.RequireRoot(t)
	swaps := []struct {
		name   string
		mode   os.FileMode
		attack func(t *testing.T, parent *os.Root, name, victim string)
	}{
		{"symlink", 0o755, func(t *testing.T, parent *os.Root, name, victim string) {
			if err := parent.Symlink("victim", name); err != nil {
				t.Error(err)
			}
		}},
		{"directory", 0o755, func(t *testing.T, parent *os.Root, name, victim string) {
			if err := os.Rename(victim, filepath.Join(filepath.Dir(victim), name)); err != nil {
				t.Error(err)
			}
		}},
		{"private directory", 0o700, func(t *testing.T, parent *os.Root, name, victim string) {
			if err := os.Rename(victim, filepath.Join(filepath.Dir(victim), name)); err != nil {
				t.Error(err)
			}
		}},
	}
	for _, sw := range swaps {
		t.Run(sw.name, func(t *testing.T) {
			h := newHarness(t)
			h.cfg.CodeUID, h.cfg.CodeGID, h.cfg.AllowRootCode = 65534, 65534, false
			// In the same directory: each step of mkdir -p is confined to its parent, so that
			// is where a swap can reach.
			victim := filepath.Join(h.root, "work", "victim")
			if err := os.Mkdir(filepath.Join(h.root, "work"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(victim, sw.mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(victim, sw.mode); err != nil {
				t.Fatal(err)
			}
			// Held open: the victim is followed wherever the swap moves it.
			vf, err := os.Open(victim)
			if err != nil {
				t.Fatal(err)
			}
			defer vf.Close()
			var once sync.Once
			restore := agent.SetMkdirHook(func(parent *os.Root, name string) {
				once.Do(func() {
					if err := parent.Rename(name, name+"-moved-away"); err != nil {
						t.Error(err)
					}
					sw.attack(t, parent, name, victim)
				})
			})
			defer restore()
			cl, _ := serveInProcess(t, h, agent.Hooks{})
			err = cl.Mkdir(context.Background(), "/work/new", 0o777)
			t.Logf("mkdir: %v", err)
			var fi syscall.Stat_t
			if err := syscall.Fstat(int(vf.Fd()), &fi); err != nil {
				t.Fatal(err)
			}
			if fi.Uid != 0 || fi.Gid != 0 || os.FileMode(fi.Mode)&os.ModePerm != sw.mode {
				t.Errorf("the swapped-in directory became %d:%d mode %#o (mkdir: %v)", fi.Uid, fi.Gid, fi.Mode&0o777, err)
			}
			if err == nil {
				// Success is allowed only if what is now at the path is a fresh directory of the code's.
				var st syscall.Stat_t
				if err := syscall.Stat(filepath.Join(h.root, "work", "new"), &st); err != nil {
					t.Fatal(err)
				}
				if st.Ino == fi.Ino || st.Uid != 65534 {
					t.Errorf("mkdir succeeded with ino %d uid %d at the path (victim ino %d)", st.Ino, st.Uid, fi.Ino)
				}
			} else if errors.Is(err, context.Canceled) {
				t.Fatal(err)
			}
		})
	}
}

// TestMkdirLeavesNoStaging: mkdir -p makes each directory in a staging directory next to it;
// none is left behind, and modes are applied exactly (also one without owner write, which an
// unprivileged agent could not move out of the staging directory any more).
func TestMkdirLeavesNoStaging(t *testing.T) {
	h := newHarness(t).start()
	ctx := context.Background()
	t.Cleanup(func() { _ = os.Chmod(filepath.Join(h.root, "ro"), 0o755) })
	if err := h.cl.Mkdir(ctx, "/a/b/c", 0o751); err != nil {
		t.Fatal(err)
	}
	if err := h.cl.Mkdir(ctx, "/a/b/c", 0o700); err != nil {
		t.Fatalf("mkdir of an existing path: %v", err)
	}
	if err := h.cl.Mkdir(ctx, "/ro", 0o555); err != nil {
		t.Fatal(err)
	}
	for p, mode := range map[string]os.FileMode{"a": 0o751, "a/b": 0o751, "a/b/c": 0o751, "ro": 0o555} {
		fi, err := os.Stat(filepath.Join(h.root, p))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != mode {
			t.Errorf("%s mode %v, want %v", p, fi.Mode().Perm(), mode)
		}
	}
	for _, dir := range []string{"", "a", "a/b"} {
		left, err := filepath.Glob(filepath.Join(h.root, dir, ".airlock-mkdir-*"))
		if err != nil || len(left) > 0 {
			t.Errorf("staging left in /%s: %v %v", dir, left, err)
		}
	}
}
