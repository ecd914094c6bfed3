package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/sandbox"
)

const testIDBase = 100000

// entry is what a test reads back from a layer tar.
type entry struct {
	typ      byte
	mode     int64
	uid, gid int
	body     string
	link     string
	mtime    time.Time
}

func readTar(t testing.TB, b []byte) (map[string]entry, []string) {
	t.Helper()
	out := map[string]entry{}
	var order []string
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, order
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		out[hdr.Name] = entry{typ: hdr.Typeflag, mode: hdr.Mode, uid: hdr.Uid, gid: hdr.Gid, body: string(body), link: hdr.Linkname, mtime: hdr.ModTime}
		order = append(order, hdr.Name)
	}
}

// sandboxTree builds, under a fresh directory, what a sandbox's writable tmpfs holds: "ws" (the
// workdir) and "tmp", owned by mapped ids.
func sandboxTree(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	u := testIDBase + 1000
	mk := func(p string, mode os.FileMode) {
		if err := os.Mkdir(filepath.Join(root, p), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(root, p), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(filepath.Join(root, p), u, u); err != nil {
			t.Fatal(err)
		}
	}
	wr := func(p, body string, mode os.FileMode) {
		if err := os.WriteFile(filepath.Join(root, p), []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(root, p), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(filepath.Join(root, p), u, u); err != nil {
			t.Fatal(err)
		}
	}
	ln := func(target, p string) {
		if err := os.Symlink(target, filepath.Join(root, p)); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(filepath.Join(root, p), u, u); err != nil {
			t.Fatal(err)
		}
	}
	mk("ws", 0o755)
	mk("ws/sub", 0o750)
	mk("ws/empty", 0o700)
	mk("ws/sticky", 0o777|os.ModeSticky)
	wr("ws/a.txt", "alpha\n", 0o644)
	wr("ws/run.sh", "#!/bin/sh\necho hi\n", 0o755)
	wr("ws/sub/secret", "s3cret", 0o600)
	wr("ws/setuid", "x", 0o755)
	if err := unix.Chmod(filepath.Join(root, "ws/setuid"), 0o4755); err != nil {
		t.Fatal(err)
	}
	ln("a.txt", "ws/rel")
	ln("/etc", "ws/escape-dir")             // a directory outside the sandbox
	ln("/etc/hostname", "ws/escape-file")   // a file outside it
	ln("../../../../../../etc", "ws/climb") // climbing out
	if err := os.Link(filepath.Join(root, "ws/a.txt"), filepath.Join(root, "ws/sub/hard")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(root, "ws/fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	mk("tmp", 0o777|os.ModeSticky)
	if err := os.Chown(filepath.Join(root, "tmp"), testIDBase, testIDBase); err != nil {
		t.Fatal(err)
	}
	wr("tmp/t", "temp", 0o644)
	old := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := os.Chtimes(filepath.Join(root, "ws/a.txt"), old, old); err != nil {
		t.Fatal(err)
	}
	return root
}

func writeLayerOf(t *testing.T, root string, sources []LayerSource, opts LayerOptions) ([]byte, LayerStats, error) {
	t.Helper()
	f, err := os.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var buf bytes.Buffer
	st, err := WriteLayer(context.Background(), &buf, f, sources, opts)
	return buf.Bytes(), st, err
}

var sandboxSources = []LayerSource{{Path: "ws", Name: "home/user"}, {Path: "tmp", Name: "tmp"}}

func TestWriteLayer(t *testing.T) {
	testutil.RequireRoot(t)
	root := sandboxTree(t)
	b, stats, err := writeLayerOf(t, root, sandboxSources, LayerOptions{IDBase: testIDBase, IDCount: DefaultIDCount})
	if err != nil {
		t.Fatal(err)
	}
	got, order := readTar(t, b)
	want := map[string]entry{
		"home/user/":            {typ: tar.TypeDir, mode: 0o755, uid: 1000, gid: 1000},
		"home/user/a.txt":       {typ: tar.TypeReg, mode: 0o644, uid: 1000, gid: 1000, body: "alpha\n"},
		"home/user/run.sh":      {typ: tar.TypeReg, mode: 0o755, uid: 1000, gid: 1000, body: "#!/bin/sh\necho hi\n"},
		"home/user/sub/":        {typ: tar.TypeDir, mode: 0o750, uid: 1000, gid: 1000},
		"home/user/sub/secret":  {typ: tar.TypeReg, mode: 0o600, uid: 1000, gid: 1000, body: "s3cret"},
		"home/user/sub/hard":    {typ: tar.TypeLink, mode: 0o644, uid: 1000, gid: 1000, link: "home/user/a.txt"},
		"home/user/empty/":      {typ: tar.TypeDir, mode: 0o700, uid: 1000, gid: 1000},
		"home/user/sticky/":     {typ: tar.TypeDir, mode: 0o1777, uid: 1000, gid: 1000},
		"home/user/setuid":      {typ: tar.TypeReg, mode: 0o755, uid: 1000, gid: 1000, body: "x"},
		"home/user/rel":         {typ: tar.TypeSymlink, mode: 0o777, uid: 1000, gid: 1000, link: "a.txt"},
		"home/user/escape-dir":  {typ: tar.TypeSymlink, mode: 0o777, uid: 1000, gid: 1000, link: "/etc"},
		"home/user/escape-file": {typ: tar.TypeSymlink, mode: 0o777, uid: 1000, gid: 1000, link: "/etc/hostname"},
		"home/user/climb":       {typ: tar.TypeSymlink, mode: 0o777, uid: 1000, gid: 1000, link: "../../../../../../etc"},
		"tmp/":                  {typ: tar.TypeDir, mode: 0o1777, uid: 0, gid: 0},
		"tmp/t":                 {typ: tar.TypeReg, mode: 0o644, uid: 1000, gid: 1000, body: "temp"},
	}
	for name, w := range want {
		g, ok := got[name]
		if !ok {
			t.Errorf("missing %s", name)
			continue
		}
		g.mtime = time.Time{}
		if g != w {
			t.Errorf("%s: got %+v, want %+v", name, g, w)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("unexpected entry %s (a followed symlink or a captured fifo?)", name)
		}
	}
	if !got["home/user/a.txt"].mtime.Equal(time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)) {
		t.Errorf("a.txt mtime %v", got["home/user/a.txt"].mtime)
	}
	// Parents come before their children, and the link after its target.
	pos := map[string]int{}
	for i, n := range order {
		pos[n] = i
	}
	if pos["home/user/"] > pos["home/user/sub/"] || pos["home/user/sub/"] > pos["home/user/sub/secret"] || pos["home/user/a.txt"] > pos["home/user/sub/hard"] {
		t.Errorf("order %v", order)
	}
	if stats.Skipped != 1 || stats.Files != 5 || stats.Links != 1 || stats.Symlinks != 4 {
		t.Errorf("stats %+v", stats)
	}
	// Nothing from the host's /etc made it in.
	host, _ := os.ReadFile("/etc/hostname")
	if len(host) > 0 && bytes.Contains(b, host) {
		t.Error("the layer holds the host's /etc/hostname: a symlink was followed")
	}
}

func TestWriteLayerRefuses(t *testing.T) {
	testutil.RequireRoot(t)
	root := sandboxTree(t)
	outside := t.TempDir()
	if err := os.Symlink(filepath.Join(root, "ws"), filepath.Join(root, "linkws")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "out")); err != nil {
		t.Fatal(err)
	}
	foreign := filepath.Join(root, "foreign")
	if err := os.Mkdir(foreign, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(foreign, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(foreign, "f"), 5, 5); err != nil { // a host id the sandbox does not map
		t.Fatal(err)
	}
	mnt := filepath.Join(root, "mounted")
	if err := os.MkdirAll(filepath.Join(mnt, "inner"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", filepath.Join(mnt, "inner"), "tmpfs", 0, "size=64k"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(filepath.Join(mnt, "inner"), unix.MNT_DETACH) })
	opts := LayerOptions{IDBase: testIDBase, IDCount: DefaultIDCount}
	for _, tc := range []struct {
		name string
		src  LayerSource
		opts LayerOptions
		want error
	}{
		{"source is a symlink", LayerSource{Path: "linkws", Name: "w"}, opts, sandbox.ErrRefused},
		{"source behind a symlink out", LayerSource{Path: "out", Name: "w"}, opts, sandbox.ErrRefused},
		{"source climbs out", LayerSource{Path: "../", Name: "w"}, opts, sandbox.ErrRefused},
		{"source is absolute", LayerSource{Path: "/etc", Name: "w"}, opts, sandbox.ErrRefused},
		{"a mount inside", LayerSource{Path: "mounted", Name: "w"}, LayerOptions{}, sandbox.ErrRefused},
		{"unmapped owner", LayerSource{Path: "foreign", Name: "w"}, opts, sandbox.ErrRefused},
		{"absolute name", LayerSource{Path: "ws", Name: "/w"}, opts, sandbox.ErrInvalid},
		{"name climbs", LayerSource{Path: "ws", Name: "a/../../w"}, opts, sandbox.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := writeLayerOf(t, root, []LayerSource{tc.src}, tc.opts)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

func TestRemapLayer(t *testing.T) {
	in := tarOf(t, []ent{
		d("home/"), d("home/user/"), f("home/user/a", "A"), d("home/user/d/"), sym("home/user/l", "/etc/passwd"),
		hard("home/user/d/h", "home/user/a"), d("tmp/"), f("tmp/x", "X"),
	})
	var out bytes.Buffer
	st, err := RemapLayer(context.Background(), &out, bytes.NewReader(in), []LayerMapping{{From: "home/user", To: "workspace"}, {From: "tmp", To: "tmp"}}, DefaultIDCount)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := readTar(t, out.Bytes())
	names := map[string]bool{}
	for n := range got {
		names[n] = true
	}
	for _, n := range []string{"workspace/", "workspace/a", "workspace/d/", "workspace/l", "workspace/d/h", "tmp/", "tmp/x"} {
		if !names[n] {
			t.Errorf("missing %s in %v", n, names)
		}
	}
	if len(names) != 7 {
		t.Errorf("entries %v (the parent home/ should be dropped)", names)
	}
	if got["workspace/d/h"].link != "workspace/a" || got["workspace/l"].link != "/etc/passwd" || got["workspace/a"].body != "A" {
		t.Errorf("links or bodies: %+v", got)
	}
	if st.Files != 2 || st.Links != 1 || st.Symlinks != 1 {
		t.Errorf("stats %+v", st)
	}

	maps := []LayerMapping{{From: "workspace", To: "workspace"}}
	for _, tc := range []struct {
		name string
		ents []ent
	}{
		{"absolute", []ent{f("/workspace/a", "")}},
		{"dotdot", []ent{f("workspace/../etc/passwd", "")}},
		{"outside", []ent{f("etc/passwd", "")}},
		{"whiteout", []ent{wh("workspace/.wh.a")}},
		{"device", []ent{{name: "workspace/dev", typ: tar.TypeChar}}},
		{"fifo", []ent{{name: "workspace/fifo", typ: tar.TypeFifo}}},
		{"hard link out", []ent{hard("workspace/h", "etc/shadow")}},
		{"owner out of range", []ent{{name: "workspace/a", uid: 70000}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := RemapLayer(context.Background(), io.Discard, bytes.NewReader(tarOf(t, tc.ents)), maps, DefaultIDCount)
			if !errors.Is(err, sandbox.ErrInvalid) {
				t.Fatalf("got %v, want ErrInvalid", err)
			}
		})
	}
}

// gzTar writes a gzip layer file of ents.
func gzTar(t *testing.T, ents ...ent) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "layer.tar.gz")
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(tarOf(t, ents))
	zw.Close()
	if err := os.WriteFile(p, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func blobCount(t *testing.T, store string) int {
	t.Helper()
	n := 0
	filepath.WalkDir(filepath.Join(store, "oci", "blobs"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			n++
		}
		return nil
	})
	return n
}

func TestSnapshotStore(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := OpenSnapshotStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	base := imageOfEnts(t, []ent{d("etc/"), f("etc/os-release", "base")})
	layer := gzTar(t, d("workspace/"), f("workspace/a", "one"))

	hostSnap, err := s.Put(ctx, Snapshot{Name: "host-1", Workdir: "/workspace", Base: SnapshotBase{Kind: BaseHost}}, nil, layer)
	if err != nil {
		t.Fatal(err)
	}
	if hostSnap.Digest == "" || hostSnap.DiffID == "" || hostSnap.Size == 0 || hostSnap.CreatedAt.IsZero() {
		t.Fatalf("record %+v", hostSnap)
	}
	if _, err := s.Put(ctx, Snapshot{Name: "host-1"}, nil, layer); !errors.Is(err, sandbox.ErrConflict) {
		t.Fatalf("same name again: %v", err)
	}
	if _, err := s.Put(ctx, Snapshot{Name: "../x"}, nil, layer); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("bad name: %v", err)
	}
	img1, err := s.Put(ctx, Snapshot{Name: "img-1", Workdir: "/workspace"}, base, layer)
	if err != nil {
		t.Fatal(err)
	}
	img2, err := s.Put(ctx, Snapshot{Name: "img-2", Workdir: "/workspace"}, base, gzTar(t, f("workspace/b", "two")))
	if err != nil {
		t.Fatal(err)
	}
	if img1.Base.Kind != BaseImage || img1.Base.Manifest == "" || img1.Base.Manifest != img2.Base.Manifest {
		t.Fatalf("bases %+v %+v", img1.Base, img2.Base)
	}
	list, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, x := range list {
		names = append(names, x.Name)
	}
	if strings.Join(names, ",") != "host-1,img-1,img-2" {
		t.Fatalf("list %v", names)
	}

	// The snapshot image is the base's layers plus the snapshot layer; the layer reads back.
	full, err := s.Image(img1)
	if err != nil {
		t.Fatal(err)
	}
	if ls, _ := full.Layers(); len(ls) != 2 {
		t.Fatalf("snapshot image has %d layers, want 2", len(ls))
	}
	rc, err := s.OpenLayer(img1)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if got, _ := readTar(t, b); got["workspace/a"].body != "one" {
		t.Fatalf("layer %+v", got)
	}
	// The stored base unpacks to the same cache entry as the original.
	cache := t.TempDir()
	d1 := resolveOK(t, writeLayout(t, base), cache, ResolveOptions{})
	bimg, err := s.BaseImage(img2)
	if err != nil {
		t.Fatal(err)
	}
	unpacked := 0
	d2, err := ResolveImage(ctx, bimg, "snapshot base", cache, counting(&unpacked))
	if err != nil || d2 != d1 || unpacked != 0 {
		t.Fatalf("ResolveImage: %s (%v), unpacked %d; want cache hit %s", d2, err, unpacked, d1)
	}

	// Deleting keeps the shared base until its last snapshot goes, then leaves no blob.
	if err := s.Delete("img-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get("img-1"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("deleted snapshot: %v", err)
	}
	if _, err := s.StoredBase(img2.Base.Manifest); err != nil {
		t.Fatalf("base gone while img-2 uses it: %v", err)
	}
	if rc, err := s.OpenLayer(img2); err != nil {
		t.Fatalf("img-2 after deleting img-1: %v", err)
	} else {
		rc.Close()
	}
	if err := s.Delete("img-1"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	for _, n := range []string{"img-2", "host-1"} {
		if err := s.Delete(n); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.StoredBase(img2.Base.Manifest); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("base after its last snapshot: %v", err)
	}
	if n := blobCount(t, dir); n != 0 {
		t.Fatalf("%d blobs left in an empty store", n)
	}
	if list, _ := s.List(); len(list) != 0 {
		t.Fatalf("list after deleting all: %v", list)
	}
}
