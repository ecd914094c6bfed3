package image

import (
	"archive/tar"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// TestLayerSemantics checks the unpacked tree after applying layers in order.
func TestLayerSemantics(t *testing.T) {
	testutil.RequireRoot(t)
	cases := []struct {
		name   string
		layers [][]ent
		want   map[string]string // the whole tree
	}{
		{
			name:   "whiteout removes a lower file",
			layers: [][]ent{{d("etc"), f("etc/a", "1"), f("etc/b", "2")}, {wh("etc/.wh.a")}},
			want:   map[string]string{"etc": "d", "etc/b": "f:2"},
		},
		{
			name:   "whiteout removes a lower directory with its contents",
			layers: [][]ent{{d("x"), d("x/y"), f("x/y/z", "1"), f("keep", "k")}, {wh(".wh.x")}},
			want:   map[string]string{"keep": "f:k"},
		},
		{
			name:   "whiteout of something never there is a no-op",
			layers: [][]ent{{f("a", "1")}, {wh(".wh.nothing")}},
			want:   map[string]string{"a": "f:1"},
		},
		{
			name: "opaque directory hides lower contents, marker first",
			layers: [][]ent{
				{d("d"), f("d/a", "1"), d("d/sub"), f("d/sub/x", "2"), f("other", "o")},
				{d("d"), wh("d/.wh..wh..opq"), f("d/c", "3")},
			},
			want: map[string]string{"d": "d", "d/c": "f:3", "other": "f:o"},
		},
		{
			name: "opaque marker after the layer's own entries keeps them",
			layers: [][]ent{
				{d("d"), f("d/a", "1"), f("d/c", "old")},
				{d("d"), f("d/c", "3"), wh("d/.wh..wh..opq")},
			},
			want: map[string]string{"d": "d", "d/c": "f:3"},
		},
		{
			name: "opaque keeps a subdirectory this layer wrote into, drops its lower contents",
			layers: [][]ent{
				{d("d"), d("d/sub"), f("d/sub/x", "lower")},
				{f("d/sub/y", "upper"), wh("d/.wh..wh..opq")},
			},
			want: map[string]string{"d": "d", "d/sub": "d", "d/sub/y": "f:upper"},
		},
		{
			name: "opaque hides only lower layers; a later layer adds again",
			layers: [][]ent{
				{d("d"), f("d/a", "1")},
				{wh("d/.wh..wh..opq")},
				{f("d/b", "2")},
			},
			want: map[string]string{"d": "d", "d/b": "f:2"},
		},
		{
			name:   "file replaces directory",
			layers: [][]ent{{d("x"), f("x/in", "1")}, {f("x", "file")}},
			want:   map[string]string{"x": "f:file"},
		},
		{
			name:   "directory replaces file",
			layers: [][]ent{{f("x", "file")}, {d("x"), f("x/in", "1")}},
			want:   map[string]string{"x": "d", "x/in": "f:1"},
		},
		{
			name:   "directory replaces symlink rather than writing through it",
			layers: [][]ent{{d("real"), sym("x", "real")}, {d("x"), f("x/in", "1")}},
			want:   map[string]string{"real": "d", "x": "d", "x/in": "f:1"},
		},
		{
			name:   "directories merge across layers",
			layers: [][]ent{{d("x"), f("x/a", "1")}, {d("x"), f("x/b", "2")}},
			want:   map[string]string{"x": "d", "x/a": "f:1", "x/b": "f:2"},
		},
		{
			name:   "symlinks kept verbatim, relative and absolute",
			layers: [][]ent{{d("usr"), d("usr/bin"), f("usr/bin/python3.11", "py"), sym("usr/bin/python3", "python3.11"), sym("bin", "usr/bin"), sym("abs", "/usr/bin/python3")}},
			want: map[string]string{"usr": "d", "usr/bin": "d", "usr/bin/python3.11": "f:py",
				"usr/bin/python3": "l:python3.11", "bin": "l:usr/bin", "abs": "l:/usr/bin/python3"},
		},
		{
			name:   "missing parents are created",
			layers: [][]ent{{f("a/b/c/file", "x")}},
			want:   map[string]string{"a": "d", "a/b": "d", "a/b/c": "d", "a/b/c/file": "f:x"},
		},
		{
			name:   "./ prefixes and a root entry",
			layers: [][]ent{{d("./"), d("./etc/"), f("./etc/hosts", "h")}},
			want:   map[string]string{"etc": "d", "etc/hosts": "f:h"},
		},
		{
			name:   "entry through an in-root symlink lands at its target (merged /usr)",
			layers: [][]ent{{d("usr"), d("usr/lib"), sym("lib", "usr/lib")}, {f("lib/libx.so", "so")}},
			want:   map[string]string{"usr": "d", "usr/lib": "d", "usr/lib/libx.so": "f:so", "lib": "l:usr/lib"},
		},
		{
			name:   "device nodes and fifos are skipped",
			layers: [][]ent{{d("dev"), {name: "dev/null", typ: tar.TypeChar}, {name: "dev/sda", typ: tar.TypeBlock}, {name: "fifo", typ: tar.TypeFifo}, f("a", "1")}},
			want:   map[string]string{"dev": "d", "a": "f:1"},
		},
		{
			name:   "hard link to a lower layer's file",
			layers: [][]ent{{f("a", "same")}, {hard("b", "a")}},
			want:   map[string]string{"a": "f:same", "b": "f:same"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := resolveOK(t, writeLayout(t, imageOfEnts(t, tc.layers...)), t.TempDir(), ResolveOptions{})
			got := tree(t, dir)
			if len(got) != len(tc.want) {
				t.Errorf("tree = %v\nwant   %v", got, tc.want)
			}
			for p, w := range tc.want {
				if got[p] != w {
					t.Errorf("%s = %q, want %q (tree %v)", p, got[p], w, got)
				}
			}
		})
	}
}

// TestMetadataPreserved checks modes, ownership, times and hard links.
func TestMetadataPreserved(t *testing.T) {
	testutil.RequireRoot(t)
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	layers := [][]ent{
		{
			{name: "ro", typ: tar.TypeDir, mode: 0o555, mtime: old},
			{name: "ro/file", body: "x", mode: 0o640, uid: 1000, gid: 1001, mtime: old},
			{name: "tmp", typ: tar.TypeDir, mode: 0o1777},
			{name: "suid", body: "x", mode: 0o4755},
			{name: "sgid", typ: tar.TypeDir, mode: 0o2775},
			{name: "link", typ: tar.TypeSymlink, link: "ro/file", uid: 7, gid: 8, mtime: old},
			{name: "hl", typ: tar.TypeLink, link: "ro/file"},
			{name: "high", body: "x", uid: 65534, gid: 65534},
		},
	}
	src := writeLayout(t, imageOfEnts(t, layers...))
	cases := []struct {
		name string
		base int
	}{{"ids kept", 0}, {"ids shifted", 100000}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := resolveOK(t, src, t.TempDir(), ResolveOptions{UIDBase: tc.base})
			st := func(p string) (os.FileInfo, *syscall.Stat_t) {
				fi, err := os.Lstat(filepath.Join(dir, p))
				if err != nil {
					t.Fatal(err)
				}
				return fi, fi.Sys().(*syscall.Stat_t)
			}
			checks := []struct {
				path     string
				mode     os.FileMode
				uid, gid int
				mtime    time.Time
			}{
				{"ro", os.ModeDir | 0o555, 0, 0, old},
				{"ro/file", 0o640, 1000, 1001, old},
				{"tmp", os.ModeDir | os.ModeSticky | 0o777, 0, 0, testMtime},
				{"suid", 0o755, 0, 0, testMtime},
				{"sgid", os.ModeDir | 0o775, 0, 0, testMtime},
				{"link", os.ModeSymlink | 0o777, 7, 8, old},
				{"high", 0o644, 65534, 65534, testMtime},
			}
			for _, c := range checks {
				fi, s := st(c.path)
				if fi.Mode() != c.mode {
					t.Errorf("%s mode = %v, want %v", c.path, fi.Mode(), c.mode)
				}
				if int(s.Uid) != c.uid+tc.base || int(s.Gid) != c.gid+tc.base {
					t.Errorf("%s owner = %d:%d, want %d:%d", c.path, s.Uid, s.Gid, c.uid+tc.base, c.gid+tc.base)
				}
				if !fi.ModTime().Equal(c.mtime) {
					t.Errorf("%s mtime = %v, want %v", c.path, fi.ModTime(), c.mtime)
				}
			}
			_, root := st(".")
			if int(root.Uid) != tc.base {
				t.Errorf("root owner = %d, want %d", root.Uid, tc.base)
			}
			_, a := st("ro/file")
			_, b := st("hl")
			if a.Ino != b.Ino {
				t.Errorf("hard link hl has inode %d, ro/file %d: not linked", b.Ino, a.Ino)
			}
		})
	}
}

// TestRefusesEscapes feeds every path-escape shape we know; each must be refused as invalid,
// name the entry, write nothing outside, and leave no cache entry.
func TestRefusesEscapes(t *testing.T) {
	testutil.RequireRoot(t)
	outside := t.TempDir() // a stand-in for the host: escapes would land here
	victim := filepath.Join(outside, "passwd")
	if err := os.WriteFile(victim, []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		layers [][]ent
		entry  string // named in the error
	}{
		{"dotdot", [][]ent{{f("../x", "evil")}}, "../x"},
		{"dotdot inside", [][]ent{{f("a/../../x", "evil")}}, "a/../../x"},
		{"dotdot that cleans to inside", [][]ent{{f("a/../b", "evil")}}, "a/../b"},
		{"absolute", [][]ent{{f("/abs", "evil")}}, "/abs"},
		{"absolute to outside", [][]ent{{f(victim, "evil")}}, victim},
		{"file through absolute symlink", [][]ent{{sym("a", outside)}, {f("a/passwd", "evil")}}, "a/passwd"},
		{"file through symlink, same layer", [][]ent{{sym("a", outside), f("a/passwd", "evil")}}, "a/passwd"},
		{"file through relative escaping symlink", [][]ent{{sym("a", "../../../../../../.."+outside), f("a/passwd", "evil")}}, "a/passwd"},
		{"dir through symlink", [][]ent{{sym("a", outside), d("a/newdir")}}, "a/newdir"},
		{"symlink through symlink", [][]ent{{sym("a", outside), sym("a/l", "x")}}, "a/l"},
		{"whiteout through symlink", [][]ent{{sym("a", outside)}, {wh("a/.wh.passwd")}}, "a/.wh.passwd"},
		{"opaque through symlink", [][]ent{{sym("a", outside)}, {wh("a/.wh..wh..opq")}}, "a/.wh..wh..opq"},
		{"hardlink to absolute", [][]ent{{hard("hl", victim)}}, "hl"},
		{"hardlink with dotdot", [][]ent{{hard("hl", "../"+filepath.Base(outside)+"/passwd")}}, "hl"},
		{"hardlink with a dotdot that cleans to inside", [][]ent{{f("b", "1"), hard("hl", "a/../b")}}, "hl"},
		{"hardlink through symlink", [][]ent{{sym("a", outside), hard("hl", "a/passwd")}}, "hl"},
		{"whiteout of the parent", [][]ent{{f("a/x", "1")}, {wh("a/.wh..")}}, "a/.wh.."},
		{"whiteout marker as directory", [][]ent{{f(".wh.x/y", "1")}}, ".wh.x/y"},
		{"empty symlink target", [][]ent{{sym("a", "")}}, "a"},
		{"root as a file", [][]ent{{f(".", "x")}}, `"."`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cache := t.TempDir()
			var n int
			_, err := ResolveWith(context.Background(), writeLayout(t, imageOfEnts(t, tc.layers...)), cache, counting(&n))
			if !errors.Is(err, sandbox.ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tc.entry) {
				t.Errorf("error %q does not name entry %q", err, tc.entry)
			}
			if b, _ := os.ReadFile(victim); string(b) != "host" {
				t.Fatalf("victim changed to %q", b)
			}
			ents, _ := os.ReadDir(outside)
			if len(ents) != 1 {
				t.Fatalf("outside dir gained entries: %v", ents)
			}
			assertNoEntries(t, cache)
		})
	}
}

// TestIDRange refuses an owner the sandbox does not map rather than leaving it unowned.
func TestIDRange(t *testing.T) {
	testutil.RequireRoot(t)
	src := writeLayout(t, imageOfEnts(t, []ent{{name: "f", body: "x", uid: 70000}}))
	_, err := ResolveWith(context.Background(), src, t.TempDir(), ResolveOptions{UIDBase: 100000})
	if !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), "70000") {
		t.Fatalf("err = %v, want ErrInvalid naming uid 70000", err)
	}
	// Without a mapping there is no range to respect.
	resolveOK(t, src, t.TempDir(), ResolveOptions{})
}

// TestNoChown leaves files owned by the caller, for rootless runtimes.
func TestNoChown(t *testing.T) {
	src := writeLayout(t, imageOfEnts(t, []ent{{name: "f", body: "x", uid: 1000, gid: 1000}, {name: "d", typ: tar.TypeDir, uid: 5}}))
	dir := resolveOK(t, src, t.TempDir(), ResolveOptions{NoChown: true})
	for _, p := range []string{".", "f", "d"} {
		fi, err := os.Lstat(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		if s := fi.Sys().(*syscall.Stat_t); int(s.Uid) != os.Getuid() || int(s.Gid) != os.Getgid() {
			t.Errorf("%s owned by %d:%d, want the caller %d:%d", p, s.Uid, s.Gid, os.Getuid(), os.Getgid())
		}
	}
	if !strings.HasSuffix(dir, "-nochown") {
		t.Errorf("NoChown entry %s shares a key with the chowned variant", dir)
	}
}

func TestCleanName(t *testing.T) {
	cases := []struct {
		in, want string
		bad      bool
	}{
		{"a/b", "a/b", false},
		{"./a/b/", "a/b", false},
		{"./", ".", false},
		{"a//b", "a/b", false},
		{"", "", true},
		{"/a", "", true},
		{"..", "", true},
		{"a/..", "", true},
		{"a/../b", "", true},
		{"a\x00b", "", true},
	}
	for _, c := range cases {
		got, err := cleanName(c.in)
		if (err != nil) != c.bad || got != c.want {
			t.Errorf("cleanName(%q) = %q, %v; want %q, bad=%v", c.in, got, err, c.want, c.bad)
		}
	}
}

func assertNoEntries(t *testing.T, cache string) {
	t.Helper()
	l, err := List(cache)
	if err != nil {
		t.Fatal(err)
	}
	if len(l) != 0 {
		t.Errorf("cache has entries after a failure: %v", l)
	}
	ents, _ := os.ReadDir(filepath.Join(cache, "rootfs"))
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".lock") {
			t.Errorf("cache holds %q after a failed unpack", e.Name())
		}
	}
}
