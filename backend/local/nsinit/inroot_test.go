package nsinit

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestInRootConfines: paths resolved through inRoot follow a root's symlinks (absolute, or
// relative with too many "..") inside the root, the way the sandbox sees them after
// pivot_root, and never write outside it. Runs without root: no mounts.
func TestInRootConfines(t *testing.T) {
	// Every link targets the victim as the host would resolve it, so a regression that
	// resolves on the host lands in the victim (and fails below), never elsewhere on the host.
	host := t.TempDir()
	root := filepath.Join(host, "root")
	victim := filepath.Join(host, "victim")
	// Inside the root, the victim's host path is an ordinary directory of the image.
	inside := filepath.Join(root, victim)
	for _, d := range []string{root, victim, inside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(victim, "secret"), []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	links := map[string]string{
		"abs":     victim,                                                      // the victim's absolute path
		"rel":     "../victim",                                                 // one level up: beside the root
		"deep":    strings.Repeat("../", 32) + strings.TrimPrefix(victim, "/"), // up to / and down again
		"nowhere": "../victim/missing/..",
		"secret":  filepath.Join(victim, "secret"),
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	// Opened through a symlink to it, as a state dir below /var/run would be.
	alias := filepath.Join(host, "alias")
	if err := os.Symlink("root", alias); err != nil {
		t.Fatal(err)
	}
	r, err := openInRoot(alias)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()

	cases := []struct {
		name string
		op   func() error
		// resolves, when set, is where path must lead inside the root afterwards.
		path, resolves string
		wantErr        bool
	}{
		{name: "mkdirAll through an absolute link", op: func() error { return r.mkdirAll("/abs/a", 0o755) }, path: "/abs/a", resolves: victim + "/a"},
		{name: "mkdirAll through a deep relative escape", op: func() error { return r.mkdirAll("/deep/b", 0o755) }, path: "/deep/b", resolves: victim + "/b"},
		{name: "mkdirAll through a relative escape", op: func() error { return r.mkdirAll("/rel/c", 0o755) }, wantErr: true},
		{name: "mkdirAll through a link that leads nowhere", op: func() error { return r.mkdirAll("/nowhere/d", 0o755) }, wantErr: true},
		{name: "create through an absolute link", op: func() error { return r.create("/abs/f", []byte("x"), 0o644, false) }, path: "/abs/f", resolves: victim + "/f"},
		{name: "create through a relative escape", op: func() error { return r.create("/rel/f", []byte("x"), 0o644, false) }, wantErr: true},
		{name: "create never follows the last component", op: func() error { return r.create("/secret", []byte("x"), 0o644, true) }, wantErr: true},
		{name: "symlink through a relative escape", op: func() error { return r.symlink("x", "/rel/link") }, wantErr: true},
		{name: "mkdir through a deep escape", op: func() error { return r.mkdir("/deep/e", 0o755, false) }, path: "/deep/e", resolves: victim + "/e"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.op()
			if (err != nil) != c.wantErr {
				t.Fatalf("err = %v, want error %v", err, c.wantErr)
			}
			if c.path == "" {
				return
			}
			fd, err := r.open(c.path, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fd)
			if got, err := r.resolved(fd); err != nil || got != c.resolves {
				t.Errorf("%s resolves to %q (%v), want %q", c.path, got, err, c.resolves)
			}
		})
	}
	if got := r.readFile("/secret"); got != nil {
		t.Errorf("readFile through a link to a host file read %q", got)
	}
	entries, err := os.ReadDir(victim)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Errorf("the victim dir holds %d entries, want only its secret", len(entries))
	}
	if b, _ := os.ReadFile(filepath.Join(victim, "secret")); string(b) != "host" {
		t.Errorf("the victim's file was changed: %q", b)
	}
}
