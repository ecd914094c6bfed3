package local

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/sandbox/conformance"
	"github.com/airlock-sandbox/airlock/spec"
)

// minimalRootfs assembles a tiny root filesystem from host binaries (sh, cat, sleep, ls, id
// and their libraries): what a directory image holds, and nothing of the host's /usr.
func minimalRootfs(t *testing.T) string {
	t.Helper()
	root, err := os.MkdirTemp("", "al-rootfs-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
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

func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
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
		Decl: func(id string) spec.Sandbox { return spec.Sandbox{ID: id, Image: spec.Image{Dir: root}} },
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
func writeOCILayout(t *testing.T, dir string) string {
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
		hdr.Name, hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = rel, 0, 0, "", ""
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
	// Unpacked into UIDBase's own range, which no sandbox maps (uidrange.go): inside, the
	// image's files belong to the overflow id, never to an id a sandbox process can hold.
	if !strings.Contains(out, " 65534 65534 ") {
		t.Errorf("/hello is not owned by an unmapped id: %q", out)
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
