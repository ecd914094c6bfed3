// Command mkimage packs a root filesystem directory as a reproducible one-layer OCI layout or docker-archive.
package main

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// The output is reproducible: entries are sorted, owned by 0:0, times are the files' mtimes in
// whole seconds and the image's creation time is the epoch, so the same directory always gives
// the same digests (and hits the same rootfs cache entry). It prints the config digest, which is
// the image cache key.
func main() {
	var (
		rootfs  = flag.String("rootfs", "", "root filesystem directory to pack (required)")
		ociOut  = flag.String("oci-layout", "", "write an OCI image layout directory here")
		tarOut  = flag.String("docker-archive", "", "write a docker-archive tarball here")
		tag     = flag.String("tag", "airlock.local/rootfs:latest", "image name recorded in the outputs")
		workdir = flag.String("workdir", "/", "image working directory")
		gz      = flag.Bool("gzip", false, "gzip the layer (smaller; slower to build and unpack)")
		env     listFlag
	)
	flag.Var(&env, "env", "K=V for the image config (repeatable; default PATH and LANG)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: mkimage -rootfs DIR [-oci-layout OUT] [-docker-archive OUT.tar] [-tag NAME] [-env K=V]... [-workdir DIR] [-gzip]")
		flag.PrintDefaults()
	}
	flag.Parse()
	if err := run(*rootfs, *ociOut, *tarOut, *tag, *workdir, env, *gz); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(rootfs, ociOut, tarOut, tag, workdir string, env []string, gz bool) error {
	if rootfs == "" || (ociOut == "" && tarOut == "") {
		return errors.New("need -rootfs and at least one of -oci-layout, -docker-archive")
	}
	if fi, err := os.Stat(rootfs); err != nil || !fi.IsDir() {
		return fmt.Errorf("-rootfs %q is not a directory", rootfs)
	}
	ref, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("-tag %q: %w", tag, err)
	}
	if len(env) == 0 {
		env = []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "LANG=C.UTF-8"}
	}

	scratchDir := filepath.Dir(firstNonEmpty(ociOut, tarOut))
	layerFile, err := os.CreateTemp(scratchDir, ".mkimage-layer-*.tar")
	if err != nil {
		return err
	}
	defer os.Remove(layerFile.Name())
	if err := writeTar(layerFile, rootfs); err != nil {
		layerFile.Close()
		return err
	}
	if err := layerFile.Close(); err != nil {
		return err
	}
	layer, err := fileLayer(layerFile.Name(), gz)
	if err != nil {
		return err
	}

	epoch := v1.Time{Time: time.Unix(0, 0).UTC()}
	base, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{
		Created: epoch, OS: "linux", Architecture: runtime.GOARCH,
		RootFS: v1.RootFS{Type: "layers"},
		Config: v1.Config{Env: env, WorkingDir: workdir},
	})
	if err != nil {
		return err
	}
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: epoch, CreatedBy: "airlock mkimage", Comment: "root filesystem from " + filepath.Base(rootfs)},
	})
	if err != nil {
		return err
	}
	img = mutate.ConfigMediaType(mutate.MediaType(img, types.OCIManifestSchema1), types.OCIConfigJSON)

	if ociOut != "" {
		if err := writeLayout(ociOut, tag, img); err != nil {
			return err
		}
	}
	if tarOut != "" {
		tmp := tarOut + ".tmp"
		if err := tarball.WriteToFile(tmp, ref, img); err != nil {
			os.Remove(tmp)
			return err
		}
		if err := os.Rename(tmp, tarOut); err != nil {
			return err
		}
	}
	cfg, err := img.ConfigName()
	if err != nil {
		return err
	}
	fmt.Println(cfg)
	return nil
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// writeLayout writes a fresh layout beside out and swaps it in, so a reader never sees a
// half-written one and stale blobs do not pile up.
func writeLayout(out, tag string, img v1.Image) error {
	tmp := out + ".tmp"
	os.RemoveAll(tmp)
	p, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return err
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": tag})); err != nil {
		return err
	}
	old := out + ".old"
	os.RemoveAll(old)
	if _, err := os.Stat(out); err == nil {
		if err := os.Rename(out, old); err != nil {
			return err
		}
	}
	if err := os.Rename(tmp, out); err != nil {
		return err
	}
	return os.RemoveAll(old)
}

// fileLayer is a layer backed by a tar file on disk: stored as is (uncompressed, like `docker
// save`), or gzipped through go-containerregistry.
func fileLayer(p string, gz bool) (v1.Layer, error) {
	if gz {
		return tarball.LayerFromFile(p, tarball.WithMediaType(types.OCILayer))
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return nil, err
	}
	return partial.CompressedToLayer(&rawLayer{path: p, size: n, digest: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}})
}

type rawLayer struct {
	path   string
	size   int64
	digest v1.Hash
}

func (l *rawLayer) Digest() (v1.Hash, error)           { return l.digest, nil }
func (l *rawLayer) DiffID() (v1.Hash, error)           { return l.digest, nil }
func (l *rawLayer) Compressed() (io.ReadCloser, error) { return os.Open(l.path) }
func (l *rawLayer) Size() (int64, error)               { return l.size, nil }
func (l *rawLayer) MediaType() (types.MediaType, error) {
	return types.OCIUncompressedLayer, nil
}

// writeTar writes dir as a reproducible tar: sorted, owned by 0:0, whole-second mtimes, hard
// links kept, sockets and devices refused (a rootfs built from host binaries has none).
func writeTar(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	type inode struct{ dev, ino uint64 }
	seen := map[inode]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		h := &tar.Header{
			Name:    filepath.ToSlash(rel),
			Mode:    int64(fi.Mode().Perm()),
			ModTime: fi.ModTime().Truncate(time.Second),
		}
		if fi.Mode()&fs.ModeSticky != 0 {
			h.Mode |= 0o1000
		}
		switch {
		case fi.Mode().IsRegular():
			st := fi.Sys().(*syscall.Stat_t)
			key := inode{uint64(st.Dev), st.Ino}
			if first, ok := seen[key]; ok && st.Nlink > 1 {
				h.Typeflag, h.Linkname = tar.TypeLink, first
			} else {
				seen[key] = h.Name
				h.Typeflag, h.Size = tar.TypeReg, fi.Size()
			}
		case fi.IsDir():
			h.Typeflag = tar.TypeDir
			h.Name += "/"
		case fi.Mode()&fs.ModeSymlink != 0:
			h.Typeflag = tar.TypeSymlink
			if h.Linkname, err = os.Readlink(p); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: unsupported file type %v", p, fi.Mode().Type())
		}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if h.Typeflag == tar.TypeReg {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.CopyN(tw, f, h.Size)
			f.Close()
			if err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}
