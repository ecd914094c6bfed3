package local

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/airlock-sandbox/airlock/backend/local/nsinit"
	"github.com/airlock-sandbox/airlock/backend/local/sessions"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/sandbox/conformance"
	"github.com/airlock-sandbox/airlock/spec"
)

// minimalRootfs assembles a tiny root filesystem from host binaries (sh, cat, sleep, ls, id
// and their libraries): what a directory image holds, and nothing of the host's /usr.
func minimalRootfs(t testing.TB) string {
	t.Helper()
	root := openTempDir(t, "al-rootfs-")
	bins := map[string]string{"sh": "/bin/sh", "cat": "/bin/cat", "sleep": "/bin/sleep", "ls": "/bin/ls", "id": "/usr/bin/id", "test": "/usr/bin/test", "echo": "/bin/echo"}
	libs := map[string]bool{}
	libRE := regexp.MustCompile(`(/[^ ]+) \(0x`)
	for name, src := range bins {
		real, err := filepath.EvalSymlinks(src)
		if err != nil {
			t.Fatal(err)
		}
		copyFile(t, real, filepath.Join(root, "bin", name), 0o755)
		out, err := exec.Command("ldd", real).Output()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range libRE.FindAllStringSubmatch(string(out), -1) {
			libs[m[1]] = true
		}
	}
	for lib := range libs {
		real, err := filepath.EvalSymlinks(lib)
		if err != nil {
			t.Fatal(err)
		}
		copyFile(t, real, filepath.Join(root, lib), 0o755)
	}
	if err := os.WriteFile(filepath.Join(root, "hello"), []byte("from the image\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

// openTempDir is a temporary dir (removed at the end of the test) that other users may
// search and read: what a sandbox's mapped ids or an unprivileged test user reach. Not
// t.TempDir, whose parent is the caller's alone.
func openTempDir(t testing.TB, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func copyFile(t testing.TB, src, dst string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		t.Fatal(err)
	}
}

func TestConformanceDirImage(t *testing.T) {
	root := minimalRootfs(t)
	conformance.Run(t, func(t *testing.T) sandbox.Backend { return newTestBackend(t) }, conformance.Options{
		Decl:  func(id string) spec.Sandbox { return spec.Sandbox{ID: id, Image: spec.Image{Dir: root}} },
		Basic: true, // the image has only sh and a few tools
	})
}

// TestDirImageIsTheRoot: a directory image is the whole root, read-only, without the host's /usr.
func TestDirImageIsTheRoot(t *testing.T) {
	root := minimalRootfs(t)
	x := newBox(t, func(d *spec.Sandbox) { d.Image = spec.Image{Dir: root} })
	out, errs, _ := x.run(t, `cat /hello; ls /; ls /usr 2>&1; echo x > /hello 2>&1 || echo ro; id`, 30*time.Second)
	if !strings.Contains(out, "from the image") || !strings.Contains(out, "ro\n") {
		t.Errorf("out %q err %q", out, errs)
	}
	if strings.Contains(out, "python3") {
		t.Errorf("the host's /usr is visible: %q", out)
	}
	if !strings.Contains(out, "uid=1000") {
		t.Errorf("id: %q", out)
	}
}

// TestDirImageWithItsOwnRoot: an image that has /root (every real one does) starts, and its
// /root is the image's, read-only, with the image's mode (the sandbox used to fail in init,
// chmod of the read-only /root).
func TestDirImageWithItsOwnRoot(t *testing.T) {
	root := minimalRootfs(t)
	if err := os.Mkdir(filepath.Join(root, "root"), 0o750); err != nil {
		t.Fatal(err)
	}
	x := newBox(t, func(d *spec.Sandbox) { d.Image = spec.Image{Dir: root} })
	out, errs, _ := x.run(t, `ls -ld /root; cat /hello`, 30*time.Second)
	if !strings.HasPrefix(out, "drwxr-x---") || !strings.Contains(out, "from the image") {
		t.Errorf("out %q err %q", out, errs)
	}
}

// writeOCILayout packs dir as a one-layer OCI image layout.
func writeOCILayout(t testing.TB, dir string) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		// The owners the files have on disk (a test chowns what it wants owned).
		st := fi.Sys().(*syscall.Stat_t)
		hdr.Name, hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = rel, int(st.Uid), int(st.Gid), "", ""
		if d.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.Config(img, v1Config("AIRLOCK_FROM_IMAGE=yes"))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(out, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestOCIImage(t *testing.T) {
	layoutDir := writeOCILayout(t, minimalRootfs(t))
	x := newBox(t, func(d *spec.Sandbox) { d.Image = spec.Image{OCILayout: layoutDir} })
	out, errs, res := x.run(t, `cat /hello; echo "env=$AIRLOCK_FROM_IMAGE"; ls -ln /hello; echo x > /hello 2>/dev/null || echo ro`, 30*time.Second)
	if res.ExitCode != 0 || !strings.Contains(out, "from the image") || !strings.Contains(out, "env=yes") || !strings.Contains(out, "ro\n") {
		t.Fatalf("out %q err %q res %+v", out, errs, res)
	}
	// Owned by the image's root, as the image says (idmap.go), not by the overflow id.
	if owner := lsOwners(out)["/hello"]; owner != "0:0" {
		t.Errorf("/hello is not owned by the image's root: %q", out)
	}
	// A second sandbox from the same image is a cache hit.
	s2, err := x.b.Create(context.Background(), spec.Sandbox{ID: "again", Image: spec.Image{OCILayout: layoutDir}})
	if err != nil {
		t.Fatal(err)
	}
	if err := x.b.Terminate(context.Background(), s2.ID); err != nil {
		t.Fatal(err)
	}
}

func v1Config(env ...string) v1.Config { return v1.Config{Env: env} }

// TestOCIImageOwnership: an image's files show the owners the image gave them (its user's
// 0700 home is open to the code running as that uid, root's 0600 file is not), and on the
// host the cache's files keep UIDBase+id, an id no sandbox maps (idmap.go).
func TestOCIImageOwnership(t *testing.T) {
	root := minimalRootfs(t)
	home := filepath.Join(root, "home", "app")
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(home), 0o755); err != nil {
		t.Fatal(err)
	}
	for p, c := range map[string]string{filepath.Join(home, "secret"): "the app's own\n", filepath.Join(root, "rootonly"): "root's\n"} {
		if err := os.WriteFile(p, []byte(c), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{home, filepath.Join(home, "secret")} {
		if err := os.Chown(p, nsinit.CodeUID, nsinit.CodeGID); err != nil {
			t.Fatal(err)
		}
	}
	x := newBox(t, func(d *spec.Sandbox) { d.Image = spec.Image{OCILayout: writeOCILayout(t, root)} })
	out, errs, _ := x.run(t, `ls -lnd /home/app /home/app/secret /rootonly; cat /home/app/secret; cat /rootonly 2>/dev/null || echo denied; (echo x > /home/app/secret) 2>/dev/null || echo ro`, 30*time.Second)
	owners := lsOwners(out)
	for p, want := range map[string]string{"/home/app": "1000:1000", "/home/app/secret": "1000:1000", "/rootonly": "0:0"} {
		if owners[p] != want {
			t.Errorf("%s is owned by %q inside, want %s: %q (stderr %q)", p, owners[p], want, out, errs)
		}
	}
	for _, want := range []string{"the app's own\n", "denied\n", "ro\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in %q (stderr %q)", want, out, errs)
		}
	}
	if strings.Contains(out, "root's") {
		t.Errorf("the code read root's 0600 file: %q", out)
	}
	secrets := cacheFiles(t, x.b.opts.ImageCacheDir, "home/app/secret")
	for _, p := range secrets {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		if want := uint32(x.b.opts.UIDBase + nsinit.CodeUID); st.Uid != want || st.Gid != want {
			t.Errorf("%s is owned by %d:%d on the host, want %d", p, st.Uid, st.Gid, want)
		}
	}
}

// TestDirRootReadOnlyToSandboxRoot: a directory root (an unpacked image, a directory image)
// stays read-only even to the sandbox's root — as if the code had become it: nsenter gives
// full capabilities in the sandbox's user namespace and no seccomp. The host locks the
// mount's flags (idmap.go); unlocked, the sandbox's root remounted it read-write and wrote
// the image's world-writable file on the host, and through an image's idmapping any file of
// the shared cache.
func TestDirRootReadOnlyToSandboxRoot(t *testing.T) {
	root := minimalRootfs(t)
	build := exec.Command("go", "build", "-o", filepath.Join(root, "bin", "rootremount"), "./testdata/rootremount")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build rootremount: %v\n%s", err, out)
	}
	shared := filepath.Join(root, "shared")
	if err := os.Mkdir(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	const content = "the image's\n"
	for _, f := range []string{filepath.Join(shared, "open"), filepath.Join(root, "hello")} {
		if err := os.WriteFile(f, []byte(content), 0o666); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(f, 0o666); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	layoutDir := writeOCILayout(t, root)
	for _, tc := range []struct {
		name  string
		image spec.Image
	}{
		{"oci", spec.Image{OCILayout: layoutDir}},
		{"dir", spec.Image{Dir: root}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := newBox(t, func(d *spec.Sandbox) { d.Image = tc.image })
			pid := x.b.sessionInitPID(x.sess.ID)
			got, err := exec.Command("nsenter", "-t", strconv.Itoa(pid), "-U", "-m", "--", "/bin/rootremount",
				"/shared", "/shared/open", "/hello", "/hello").CombinedOutput()
			if err != nil {
				t.Fatalf("nsenter: %v\n%s", err, got)
			}
			if lines := strings.Split(strings.TrimSpace(string(got)), "\n"); len(lines) != 6 {
				t.Fatalf("rootremount: %q", got)
			}
			for _, l := range strings.Split(strings.TrimSpace(string(got)), "\n") {
				if strings.HasSuffix(l, ": ok") {
					t.Errorf("the sandbox's root could: %s", l)
				}
			}
			files := []string{filepath.Join(shared, "open"), filepath.Join(root, "hello")}
			if tc.image.OCILayout != "" {
				files = append(cacheFiles(t, x.b.opts.ImageCacheDir, "shared/open"), cacheFiles(t, x.b.opts.ImageCacheDir, "hello")...)
			}
			for _, f := range files {
				if b, err := os.ReadFile(f); err != nil || string(b) != content {
					t.Errorf("%s on the host: %q %v", f, b, err)
				}
			}
		})
	}
}

// cacheFiles returns the unpacked copies of rel (a path inside an image) in the image cache.
func cacheFiles(t *testing.T, cache, rel string) []string {
	t.Helper()
	var found []string
	err := filepath.WalkDir(cache, func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, "/"+rel) && d.Type().IsRegular() {
			found = append(found, p)
		}
		return err
	})
	if err != nil || len(found) == 0 {
		t.Fatalf("%s in the cache %s: %v, %v", rel, cache, found, err)
	}
	return found
}

// lsOwners maps each path `ls -ln` listed in out to its "uid:gid".
func lsOwners(out string) map[string]string {
	owners := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 8 && strings.HasPrefix(f[len(f)-1], "/") {
			owners[f[len(f)-1]] = f[2] + ":" + f[3]
		}
	}
	return owners
}

// TestReconcileDetachesRootClone: a create that died while the host held its copy of the
// root's clone (idmap.go: attached before init's clone, detached right after) leaves a mount
// in the host's namespace under the session dir; the next backend's reconcile removes it with
// the session, and the unmount comes first (removing the dir through the mount would reach
// into the image, read-only as it is).
func TestReconcileDetachesRootClone(t *testing.T) {
	b := newTestBackend(t)
	root := minimalRootfs(t)
	const id = "s-00000000000000bb"
	dir := filepath.Join(b.opts.StateDir, id)
	if err := os.Mkdir(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	tree, err := b.rootTree(root, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer tree.Close()
	mp, err := attachImage(dir, tree)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(mp, unix.MNT_DETACH) })
	// The record of a native sandbox whose init is gone (its pid never ran).
	if err := writeRecord(dir, &record{RecordCore: sessions.RecordCore{ID: id, SandboxID: "crashed", InitPID: 1 << 30}}); err != nil {
		t.Fatal(err)
	}
	if !mounted(t, mp) {
		t.Fatalf("%s is not a mount point", mp)
	}
	b2 := newTestBackendAt(t, b.opts.StateDir)
	if got := b2.Reaped(); !slices.Contains(got, id) {
		t.Errorf("reaped %v, want %s", got, id)
	}
	if mounted(t, mp) {
		t.Errorf("%s is still mounted", mp)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("session dir left: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "hello")); err != nil || string(b) != "from the image\n" {
		t.Errorf("the image: %q %v", b, err)
	}
}

// mounted reports whether p is a mount point in this process's namespace.
func mounted(t *testing.T, p string) bool {
	t.Helper()
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == p {
			return true
		}
	}
	return false
}
