package local

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/backend/local/sessions"
	"github.com/airlock-sandbox/airlock/spec"
)

// testEtcCache is a cache over a fake host /etc in a temp dir.
func testEtcCache(t *testing.T, stateDir string, names ...string) (*etcCache, string) {
	t.Helper()
	src := t.TempDir()
	c := newEtcCache(stateDir)
	c.src = src
	c.names = func() []string { return names }
	return c, src
}

func mustWrite(t *testing.T, p, content string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

func mustRead(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mustGet(t *testing.T, c *etcCache, workdir string) string {
	t.Helper()
	d, err := c.get(workdir)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestEtcCopy: the copy shows what read-only binds showed: contents, symlinks as symlinks,
// permission bits never widened (no set-id bits), no special files; plus the generated files.
func TestEtcCopy(t *testing.T) {
	state := t.TempDir()
	c, src := testEtcCache(t, state, "plain", "secret", "setuid", "dir", "link", "fifo", "absent", "sub/nested")
	mustWrite(t, filepath.Join(src, "plain"), "plain\n", 0o644)
	mustWrite(t, filepath.Join(src, "secret"), "secret\n", 0o600)
	mustWrite(t, filepath.Join(src, "setuid"), "x", 0o4755)
	if err := os.MkdirAll(filepath.Join(src, "dir", "deeper"), 0o750); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(src, "dir", "deeper", "f"), "f\n", 0o640)
	if err := os.Symlink("/usr/share/x", filepath.Join(src, "dir", "abs")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("plain", filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(src, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(src, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(src, "sub", "nested"), "nested\n", 0o644)
	// Modification times in the past, as a host's /etc has them.
	old := time.Date(2025, 4, 28, 14, 11, 48, 123456789, time.UTC)
	for _, name := range []string{"plain", "secret", "dir/deeper/f", "sub/nested"} {
		if err := os.Chtimes(filepath.Join(src, name), time.Time{}, old); err != nil {
			t.Fatal(err)
		}
	}

	d := mustGet(t, c, "/work")
	if !strings.HasPrefix(d, filepath.Join(state, etcCacheDir)+"/") {
		t.Fatalf("copy %s is not under the state dir", d)
	}
	for name, want := range map[string]string{"plain": "plain\n", "secret": "secret\n", "dir/deeper/f": "f\n", "sub/nested": "nested\n"} {
		if got := mustRead(t, filepath.Join(d, name)); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	for name, want := range map[string]os.FileMode{"secret": 0o600, "setuid": 0o755, "dir": 0o750 | os.ModeDir, "dir/deeper/f": 0o640} {
		fi, err := os.Lstat(filepath.Join(d, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s has mode %v, want %v", name, fi.Mode(), want)
		}
	}
	// python compares a module's mtime with its cached bytecode's record (sitecustomize.py
	// lives in /etc on Debian): a copy newer than its source recompiles it on every start.
	for _, name := range []string{"plain", "secret", "dir/deeper/f", "sub/nested"} {
		if fi, err := os.Lstat(filepath.Join(d, name)); err != nil || !fi.ModTime().Equal(old) {
			t.Errorf("%s: modified %v (%v), want the source's %v", name, fi.ModTime(), err, old)
		}
	}
	for name, want := range map[string]string{"link": "plain", "dir/abs": "/usr/share/x"} {
		if got, err := os.Readlink(filepath.Join(d, name)); err != nil || got != want {
			t.Errorf("%s links to %q (%v), want %q", name, got, err, want)
		}
	}
	for _, name := range []string{"fifo", "absent"} {
		if _, err := os.Lstat(filepath.Join(d, name)); err == nil {
			t.Errorf("%s was copied", name)
		}
	}
	if got := mustRead(t, filepath.Join(d, "passwd")); !strings.Contains(got, "sandbox:x:1000:1000:sandbox:/work:") {
		t.Errorf("generated passwd: %q", got)
	}
	if fi, err := os.Stat(d); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("copy directory mode %v (%v), want 0755: the sandbox's root must read it", fi.Mode(), err)
	}
}

// TestEtcCacheFresh: a copy is reused while its sources are unchanged, by this process and
// another on the same state dir, and rebuilt as soon as any source changes.
func TestEtcCacheFresh(t *testing.T) {
	state := t.TempDir()
	c, src := testEtcCache(t, state, "a", "later", "dir")
	mustWrite(t, filepath.Join(src, "a"), "one\n", 0o644)
	if err := os.Mkdir(filepath.Join(src, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(src, "dir", "f"), "f\n", 0o644)
	if err := os.Symlink("f", filepath.Join(src, "dir", "l")); err != nil {
		t.Fatal(err)
	}
	d1 := mustGet(t, c, "/w")
	if d := mustGet(t, c, "/w"); d != d1 {
		t.Errorf("unchanged sources: rebuilt %s, want %s", d, d1)
	}
	other := newEtcCache(state)
	other.src, other.names = c.src, c.names
	if d := mustGet(t, other, "/w"); d != d1 {
		t.Errorf("another process: got %s, want the existing %s", d, d1)
	}
	if d := mustGet(t, c, "/elsewhere"); d == d1 || !strings.Contains(mustRead(t, filepath.Join(d, "passwd")), ":/elsewhere:") {
		t.Errorf("another workdir shares the copy %s", d)
	}

	prev := d1
	for _, change := range []struct {
		name string
		do   func() error
		file string // read back from the new copy
		want string
	}{
		{"a file rewritten in place", func() error {
			time.Sleep(10 * time.Millisecond) // a distinct mtime even on coarse clocks
			f, err := os.OpenFile(filepath.Join(src, "a"), os.O_WRONLY|os.O_TRUNC, 0)
			if err != nil {
				return err
			}
			_, err = f.WriteString("two\n")
			return errorsJoin(err, f.Close())
		}, "a", "two\n"},
		{"a file in a directory rewritten", func() error {
			time.Sleep(10 * time.Millisecond)
			return os.WriteFile(filepath.Join(src, "dir", "f"), []byte("g\n"), 0o644)
		}, "dir/f", "g\n"},
		{"a symlink in a directory replaced", func() error {
			time.Sleep(10 * time.Millisecond)
			mustWrite(t, filepath.Join(src, "dir", "h"), "h\n", 0o644)
			if err := os.Remove(filepath.Join(src, "dir", "l")); err != nil {
				return err
			}
			return os.Symlink("h", filepath.Join(src, "dir", "l"))
		}, "dir/l", "h\n"},
		{"a missing entry created", func() error {
			return os.WriteFile(filepath.Join(src, "later"), []byte("now\n"), 0o644)
		}, "later", "now\n"},
		{"a mode changed", func() error {
			time.Sleep(10 * time.Millisecond)
			return os.Chmod(filepath.Join(src, "a"), 0o600)
		}, "a", "two\n"},
	} {
		if err := change.do(); err != nil {
			t.Fatal(change.name, err)
		}
		d := mustGet(t, c, "/w")
		if d == prev {
			t.Errorf("%s: the copy %s was reused", change.name, d)
		}
		if got := mustRead(t, filepath.Join(d, change.file)); got != change.want {
			t.Errorf("%s: %s = %q, want %q", change.name, change.file, got, change.want)
		}
		prev = d
	}
	if fi, err := os.Stat(filepath.Join(prev, "a")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("after chmod the copy has mode %v (%v)", fi.Mode(), err)
	}

	// Only the copies the manifests name, or live sandboxes use, survive gc.
	if err := c.gc(map[string]bool{filepath.Base(d1): true}); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(filepath.Join(state, etcCacheDir))
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, e.Name())
		}
	}
	if len(dirs) != 3 { // /w's current, /elsewhere's, and d1 in use
		t.Errorf("after gc: %v, want the two current copies and the one in use", dirs)
	}
	if d := mustGet(t, c, "/w"); d != prev {
		t.Errorf("gc removed the current copy: got %s, want %s", d, prev)
	}
}

func errorsJoin(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// TestEtcNamesFollowSource: the entries to copy are listed from the source directory (as
// sessions.HostEtc globs /etc/python3.*) again whenever that directory changes: a new entry is in
// the next copy, a removed one gone from it, though the list is not re-read on every create.
func TestEtcNamesFollowSource(t *testing.T) {
	state := t.TempDir()
	c, src := testEtcCache(t, state)
	listed := 0
	c.names = func() []string {
		listed++
		m, _ := filepath.Glob(filepath.Join(src, "py*"))
		for i := range m {
			m[i] = filepath.Base(m[i])
		}
		return m
	}
	mustWrite(t, filepath.Join(src, "pyA"), "a\n", 0o644)
	d := mustGet(t, c, "/w")
	mustGet(t, c, "/w")
	if listed != 1 {
		t.Errorf("the source was listed %d times for two creates with nothing changed, want 1", listed)
	}
	for _, step := range []struct {
		name       string
		do         func() error
		have, gone string
	}{
		{"an entry added", func() error { return os.WriteFile(filepath.Join(src, "pyB"), []byte("b\n"), 0o644) }, "pyB", ""},
		{"an entry removed", func() error { return os.Remove(filepath.Join(src, "pyA")) }, "pyB", "pyA"},
		{"an entry renamed", func() error { return os.Rename(filepath.Join(src, "pyB"), filepath.Join(src, "pyC")) }, "pyC", "pyB"},
	} {
		time.Sleep(10 * time.Millisecond) // a distinct directory mtime even on coarse clocks
		if err := step.do(); err != nil {
			t.Fatal(step.name, err)
		}
		d = mustGet(t, c, "/w")
		if _, err := os.Lstat(filepath.Join(d, step.have)); err != nil {
			t.Errorf("%s: %s missing from the copy: %v", step.name, step.have, err)
		}
		if step.gone != "" {
			if _, err := os.Lstat(filepath.Join(d, step.gone)); err == nil {
				t.Errorf("%s: %s still in the copy", step.name, step.gone)
			}
		}
	}
}

// TestParkedDefaultWorkdir: a claimer defaults a record's workdir as the runtime does (it
// checks the same /etc manifest without the spec package).
func TestParkedDefaultWorkdir(t *testing.T) {
	if sessions.DefaultWorkdir != spec.DefaultWorkdir {
		t.Fatalf("sessions.DefaultWorkdir %q, spec.DefaultWorkdir %q", sessions.DefaultWorkdir, spec.DefaultWorkdir)
	}
}
