package agent_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

func readAll(ctx context.Context, cl *client.Client, p string, off, n int64) (string, error) {
	rc, err := cl.ReadFile(ctx, p, off, n)
	if err != nil {
		return "", err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	return string(b), err
}

func TestFilesRoundTrip(t *testing.T) {
	h := newHarness(t).start()
	ctx := context.Background()
	cl := h.cl
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(cl.WriteFile(ctx, "/a.txt", strings.NewReader("hello"), 0o640))
	fi, err := cl.Stat(ctx, "/a.txt")
	must(err)
	if fi.Size != 5 || fi.Mode != 0o640 || fi.Type != "file" || fi.Name != "a.txt" || fi.Path != "/a.txt" {
		t.Errorf("stat %+v", fi)
	}
	for _, r := range []struct {
		off, n int64
		want   string
	}{{0, 0, "hello"}, {1, 3, "ell"}, {3, 100, "lo"}, {5, 0, ""}} {
		got, err := readAll(ctx, cl, "/a.txt", r.off, r.n)
		if err != nil || got != r.want {
			t.Errorf("read %d+%d = %q %v, want %q", r.off, r.n, got, err, r.want)
		}
	}
	if _, err := readAll(ctx, cl, "/a.txt", 6, 0); !errors.Is(err, sbtypes.ErrInvalid) {
		t.Errorf("read past the end: %v, want ErrInvalid", err)
	}
	// Replace: atomic, new mode applies, no temporary file left behind.
	must(cl.WriteFile(ctx, "/a.txt", strings.NewReader("replaced"), 0))
	if got, _ := readAll(ctx, cl, "/a.txt", 0, 0); got != "replaced" {
		t.Errorf("after replace: %q", got)
	}
	if fi, _ := cl.Stat(ctx, "/a.txt"); fi.Mode != 0o644 {
		t.Errorf("default mode %o", fi.Mode)
	}
	big := bytes.Repeat([]byte("x"), 8<<20+3)
	must(cl.WriteFile(ctx, "/big", bytes.NewReader(big), 0))
	if got, err := readAll(ctx, cl, "/big", 0, 0); err != nil || got != string(big) {
		t.Errorf("8 MiB round trip: %d bytes, %v", len(got), err)
	}
	must(cl.Mkdir(ctx, "/d1/d2/d3", 0o700))
	must(cl.Mkdir(ctx, "/d1/d2", 0)) // mkdir -p: existing is fine
	if fi, err := cl.Stat(ctx, "/d1/d2/d3"); err != nil || fi.Type != "dir" || fi.Mode != 0o700 {
		t.Errorf("mkdir: %+v %v", fi, err)
	}
	must(os.Symlink("a.txt", filepath.Join(h.root, "link")))
	list, err := cl.List(ctx, "/")
	must(err)
	var names []string
	for _, e := range list {
		names = append(names, e.Name+":"+e.Type+":"+e.Target)
	}
	if strings.Join(names, ",") != "a.txt:file:,big:file:,d1:dir:,link:symlink:a.txt" {
		t.Errorf("list / = %v", names)
	}
	if got, _ := readAll(ctx, cl, "/link", 0, 0); got != "replaced" {
		t.Errorf("read through an inside symlink: %q", got)
	}
	must(cl.Rename(ctx, "/a.txt", "/d1/b.txt"))
	if _, err := cl.Stat(ctx, "/a.txt"); !errors.Is(err, sbtypes.ErrNotFound) {
		t.Errorf("renamed-away file: %v", err)
	}
	if got, _ := readAll(ctx, cl, "/d1/b.txt", 0, 0); got != "replaced" {
		t.Errorf("renamed file: %q", got)
	}
	if err := cl.Remove(ctx, "/d1", false); !errors.Is(err, sbtypes.ErrConflict) {
		t.Errorf("non-recursive remove of a non-empty dir: %v, want ErrConflict", err)
	}
	must(cl.Remove(ctx, "/d1", true))
	must(cl.Remove(ctx, "/big", false))
	if err := cl.Remove(ctx, "/big", false); !errors.Is(err, sbtypes.ErrNotFound) {
		t.Errorf("remove missing: %v, want ErrNotFound", err)
	}
	list, _ = cl.List(ctx, "/")
	if len(list) != 1 || list[0].Name != "link" {
		t.Errorf("after removals: %+v", list)
	}
}

func TestFilesErrors(t *testing.T) {
	h := newHarness(t).start()
	ctx := context.Background()
	cl := h.cl
	if err := cl.Mkdir(ctx, "/dir", 0); err != nil {
		t.Fatal(err)
	}
	if err := cl.WriteFile(ctx, "/file", strings.NewReader("x"), 0); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		call  func() error
		class error
	}{
		{"read a directory", func() error { _, err := readAll(ctx, cl, "/dir", 0, 0); return err }, sbtypes.ErrInvalid},
		{"read missing", func() error { _, err := readAll(ctx, cl, "/nope", 0, 0); return err }, sbtypes.ErrNotFound},
		{"write over a directory", func() error { return cl.WriteFile(ctx, "/dir", strings.NewReader("x"), 0) }, sbtypes.ErrInvalid},
		{"write into missing dir", func() error { return cl.WriteFile(ctx, "/nope/f", strings.NewReader("x"), 0) }, sbtypes.ErrNotFound},
		{"write below a file", func() error { return cl.WriteFile(ctx, "/file/f", strings.NewReader("x"), 0) }, sbtypes.ErrInvalid},
		{"write mode too wide", func() error { return cl.WriteFile(ctx, "/m", strings.NewReader("x"), 0o4755) }, sbtypes.ErrInvalid},
		{"mkdir below a file", func() error { return cl.Mkdir(ctx, "/file/d", 0) }, sbtypes.ErrInvalid},
		{"list a file", func() error { _, err := cl.List(ctx, "/file"); return err }, sbtypes.ErrInvalid},
		{"remove /", func() error { return cl.Remove(ctx, "/", true) }, sbtypes.ErrInvalid},
		{"rename /", func() error { return cl.Rename(ctx, "/", "/x") }, sbtypes.ErrInvalid},
		{"relative path", func() error { _, err := cl.Stat(ctx, "file"); return err }, sbtypes.ErrInvalid},
		{"empty path", func() error { _, err := cl.Stat(ctx, ""); return err }, sbtypes.ErrInvalid},
		{"dot-dot", func() error { _, err := cl.Stat(ctx, "/dir/../file"); return err }, sbtypes.ErrInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); !errors.Is(err, tc.class) {
				t.Errorf("got %v, want %v", err, tc.class)
			}
		})
	}
	status, body := h.raw("GET", "/v1/files?path=/file&bogus=1", h.token("execute", nil), nil)
	if status != 400 || !strings.Contains(string(body), "bogus") {
		t.Errorf("unknown query parameter: %d %s", status, body)
	}
	status, body = h.raw("POST", "/v1/files/mkdir", h.token("execute", nil), strings.NewReader(`{"path":"/x","recursive":true}`))
	if status != 400 || !strings.Contains(string(body), "recursive") {
		t.Errorf("unknown field: %d %s", status, body)
	}
}

// escapeFixture builds, next to the files root, an outside directory with a secret, and in the
// root every kind of way out: relative and absolute symlinks, .., /proc/self/root, and a
// relative symlink into a denied path.
func escapeFixture(t *testing.T, h *harness) (outside string) {
	t.Helper()
	outside = filepath.Join(h.dir, "outside")
	if err := os.MkdirAll(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("SECRET"), 0o644); err != nil {
		t.Fatal(err)
	}
	denied := filepath.Join(h.root, ".airlock")
	if err := os.Mkdir(denied, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(denied, "secret"), []byte("SECRET"), 0o644); err != nil {
		t.Fatal(err)
	}
	links := map[string]string{
		"esc-rel":     "../outside",
		"esc-abs":     outside,
		"esc-parent":  "..",
		"esc-deep":    "a/../../outside",
		"proc-abs":    "/proc/self/root" + outside,
		"proc-rel":    "../../../../../../../../proc/self/root" + outside,
		"to-denied":   ".airlock",
		"to-denied-2": "./sub/../.airlock",
	}
	if err := os.Mkdir(filepath.Join(h.root, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(h.root, "a"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(h.root, name)); err != nil {
			t.Fatal(err)
		}
	}
	return outside
}

func TestFilesConfinement(t *testing.T) {
	h := newHarness(t).start()
	outside := escapeFixture(t, h)
	ctx := context.Background()
	cl := h.cl
	ops := []struct {
		name string
		do   func(base string) error
	}{
		{"read", func(b string) error { _, err := readAll(ctx, cl, b+"/secret", 0, 0); return err }},
		{"write", func(b string) error { return cl.WriteFile(ctx, b+"/planted", strings.NewReader("x"), 0) }},
		{"overwrite", func(b string) error { return cl.WriteFile(ctx, b+"/secret", strings.NewReader("x"), 0) }},
		{"stat", func(b string) error { _, err := cl.Stat(ctx, b+"/secret"); return err }},
		{"list", func(b string) error { _, err := cl.List(ctx, b); return err }},
		{"mkdir", func(b string) error { return cl.Mkdir(ctx, b+"/planted-dir", 0) }},
		{"remove", func(b string) error { return cl.Remove(ctx, b+"/secret", false) }},
		{"rename out", func(b string) error { return cl.Rename(ctx, b+"/secret", "/stolen") }},
		{"rename in", func(b string) error {
			if err := cl.WriteFile(ctx, "/plant", strings.NewReader("x"), 0); err != nil {
				return nil // not refused: fail below
			}
			defer cl.Remove(ctx, "/plant", false)
			return cl.Rename(ctx, "/plant", b+"/planted")
		}},
	}
	bases := []struct {
		path  string
		class error
	}{
		{"/esc-rel", sbtypes.ErrForbidden},
		{"/esc-abs", sbtypes.ErrForbidden},
		{"/esc-parent/outside", sbtypes.ErrForbidden},
		{"/esc-deep", sbtypes.ErrForbidden},
		{"/proc-abs", sbtypes.ErrForbidden},
		{"/proc-rel", sbtypes.ErrForbidden},
		{"/proc/self/root" + outside, sbtypes.ErrForbidden}, // denied lexically
		{"/.airlock", sbtypes.ErrForbidden},                 // denied lexically
		{"/to-denied", sbtypes.ErrForbidden},                // denied where it resolves
		{"/to-denied-2", sbtypes.ErrForbidden},
		{"/sub/../../outside", sbtypes.ErrInvalid}, // '..' refused outright
		{"/../outside", sbtypes.ErrInvalid},
	}
	for _, b := range bases {
		for _, op := range ops {
			t.Run(op.name+" "+b.path, func(t *testing.T) {
				err := op.do(b.path)
				if !errors.Is(err, b.class) {
					t.Errorf("got %v, want %v", err, b.class)
				}
			})
		}
	}
	// Nothing escaped in either direction.
	entries, _ := os.ReadDir(outside)
	if len(entries) != 1 || entries[0].Name() != "secret" {
		t.Errorf("outside dir changed: %v", entries)
	}
	for _, dir := range []string{outside, filepath.Join(h.root, ".airlock")} {
		if b, err := os.ReadFile(filepath.Join(dir, "secret")); err != nil || string(b) != "SECRET" {
			t.Errorf("%s/secret changed: %q %v", dir, b, err)
		}
	}
	// Removing or renaming a directory that holds a denied path is refused too.
	if err := cl.Remove(ctx, "/", true); !errors.Is(err, sbtypes.ErrInvalid) {
		t.Errorf("remove /: %v", err)
	}
	// The symlinks themselves are ordinary entries: stat shows them without following.
	fi, err := cl.Stat(ctx, "/esc-abs")
	if err != nil || fi.Type != "symlink" || fi.Target != outside {
		t.Errorf("stat of an escaping symlink: %+v %v", fi, err)
	}
}

func TestFilesDeniedSubtreeNotRemovable(t *testing.T) {
	h := newHarness(t)
	h.cfg.DenyPaths = []string{"/keep/secret"}
	h.start()
	ctx := context.Background()
	if err := h.cl.Mkdir(ctx, "/keep/other", 0); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(h.root, "keep/secret"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := h.cl.Remove(ctx, "/keep", true); !errors.Is(err, sbtypes.ErrForbidden) {
		t.Errorf("recursive remove over a denied path: %v, want ErrForbidden", err)
	}
	if err := h.cl.Rename(ctx, "/keep", "/moved"); !errors.Is(err, sbtypes.ErrForbidden) {
		t.Errorf("rename of a dir holding a denied path: %v, want ErrForbidden", err)
	}
	if _, err := os.Stat(filepath.Join(h.root, "keep/secret")); err != nil {
		t.Errorf("denied subtree touched: %v", err)
	}
}

// TestFilesSpecialFiles: FIFOs and sockets are refused without hanging the agent.
func TestFilesSpecialFiles(t *testing.T) { specialFiles(t, false) }

// TestFilesDeviceRefused: so are device files (making one needs root).
func TestFilesDeviceRefused(t *testing.T) {
	testutil.RequireRoot(t)
	specialFiles(t, true)
}

func specialFiles(t *testing.T, device bool) {
	h := newHarness(t).start()
	if err := unix.Mkfifo(filepath.Join(h.root, "fifo"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("fifo", filepath.Join(h.root, "fifo-link")); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(h.root, "sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	names := []string{"/fifo", "/fifo-link", "/sock"}
	if device {
		if err := unix.Mknod(filepath.Join(h.root, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatal(err)
		}
		names = append(names, "/null")
	}
	// The deadline guards against a hang; the assertion is on the error class.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, n := range names {
		if _, err := readAll(ctx, h.cl, n, 0, 0); !errors.Is(err, sbtypes.ErrInvalid) || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("read %s: %v, want ErrInvalid naming the file type", n, err)
		}
		if n != "/fifo-link" {
			if err := h.cl.WriteFile(ctx, n, strings.NewReader("x"), 0); !errors.Is(err, sbtypes.ErrInvalid) {
				t.Errorf("write %s: %v, want ErrInvalid", n, err)
			}
		}
	}
}

// TestFilesSwapRace swaps a directory for an escaping symlink (and for a symlink into a denied
// path) as fast as it can while reading and writing through it: no access may ever land
// outside the root or inside the denied path.
func TestFilesSwapRace(t *testing.T) {
	if testing.Short() {
		t.Skip("race loop: not a unit test")
	}
	h := newHarness(t).start()
	outside := escapeFixture(t, h)
	for _, target := range []string{"../outside", ".airlock"} {
		t.Run(target, func(t *testing.T) {
			real := filepath.Join(h.root, "swap")
			other := filepath.Join(h.root, "swap-other")
			os.RemoveAll(real)
			os.RemoveAll(other)
			if err := os.Mkdir(real, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(real, "secret"), []byte("inside"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, other); err != nil {
				t.Fatal(err)
			}
			var stop atomic.Bool
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !stop.Load() {
					_ = unix.Renameat2(unix.AT_FDCWD, real, unix.AT_FDCWD, other, unix.RENAME_EXCHANGE)
				}
			}()
			ctx := context.Background()
			var inside, refused int
			for i := 0; i < 200; i++ {
				got, err := readAll(ctx, h.cl, "/swap/secret", 0, 0)
				switch {
				case err == nil && got == "inside":
					inside++
				case err == nil:
					t.Errorf("read through a swapped symlink returned %q", got)
				default:
					refused++
				}
				_ = h.cl.WriteFile(ctx, "/swap/planted", strings.NewReader("x"), 0)
				_ = h.cl.Mkdir(ctx, "/swap/planted-dir", 0)
			}
			stop.Store(true)
			wg.Wait()
			t.Logf("%d reads inside, %d refused", inside, refused)
			for _, dir := range []string{outside, filepath.Join(h.root, ".airlock")} {
				entries, _ := os.ReadDir(dir)
				if len(entries) != 1 {
					t.Errorf("%s gained entries: %v", dir, entries)
				}
			}
		})
	}
}

// TestUploadIntoMemoryWithoutCgroup: where the agent cannot read its cgroup's usage (cgroup v2,
// whose fd is rooted below the limit; here no cgroup at all), an upload into a tmpfs is held to
// Config.MemoryBytes and refused naming limits.memory, not written until the OOM killer takes
// the agent, its writer (the cgroup v2 VM: "connection reset by peer").
func TestUploadIntoMemoryWithoutCgroup(t *testing.T) {
	testutil.RequireRoot(t)
	h := newHarness(t)
	if err := unix.Mount("tmpfs", h.root, "tmpfs", 0, "size=64m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(h.root, unix.MNT_DETACH) })
	h.cfg.MemoryBytes = 32 << 20
	h.start()
	ctx := context.Background()
	err := h.cl.WriteFile(ctx, "/upload", io.LimitReader(zeroReader{}, 48<<20), 0o644)
	if !errors.Is(err, sbtypes.ErrTooLarge) || !strings.Contains(err.Error(), "limits.memory") || !strings.Contains(err.Error(), "33554432") {
		t.Fatalf("upload past the memory: %v, want too large naming limits.memory and its 33554432 bytes", err)
	}
	// Within the limit an upload is written whole.
	if err := h.cl.WriteFile(ctx, "/small", io.LimitReader(zeroReader{}, 4<<20), 0o644); err != nil {
		t.Fatalf("upload within the memory: %v", err)
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
