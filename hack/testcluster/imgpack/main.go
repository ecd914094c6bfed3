// Command imgpack writes a one-layer docker-archive image from named host files, with an entrypoint.
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var (
		out        = flag.String("out", "", "docker-archive tarball to write (required)")
		tag        = flag.String("tag", "", "image name, e.g. airlock.local/airlock:dev (required)")
		entrypoint = flag.String("entrypoint", "", "entrypoint path inside the image")
		user       = flag.String("user", "", "image user (uid[:gid])")
		files      listFlag
	)
	flag.Var(&files, "file", "IMAGEPATH=HOSTFILE, repeatable; the file is stored 0755 owned by 0:0")
	flag.Parse()
	if err := run(*out, *tag, *entrypoint, *user, files); err != nil {
		fmt.Fprintln(os.Stderr, "imgpack:", err)
		os.Exit(1)
	}
}

func run(out, tag, entrypoint, user string, files []string) error {
	if out == "" || tag == "" || len(files) == 0 {
		return fmt.Errorf("-out, -tag and at least one -file are required")
	}
	ref, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("-tag %q: %w", tag, err)
	}
	layerTar, err := buildTar(files)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	// ctr import keeps only images for this platform: an image without os/architecture is dropped.
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	if entrypoint != "" {
		cf.Config.Entrypoint = []string{entrypoint}
	}
	cf.Config.User = user
	cf.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return err
	}
	img, err = mutate.CreatedAt(img, v1.Time{Time: time.Unix(0, 0)})
	if err != nil {
		return err
	}
	tmp := out + ".tmp"
	if err := tarball.WriteToFile(tmp, ref, img); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}

// buildTar lays the files out with their parent directories, sorted, so the digest is stable.
func buildTar(files []string) ([]byte, error) {
	type entry struct{ dst, src string }
	var entries []entry
	dirs := map[string]bool{}
	for _, f := range files {
		dst, src, ok := strings.Cut(f, "=")
		if !ok || !path.IsAbs(dst) || src == "" {
			return nil, fmt.Errorf("-file %q: want /image/path=hostfile", f)
		}
		dst = path.Clean(dst)
		entries = append(entries, entry{dst, src})
		for d := path.Dir(dst); d != "/"; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	var dl []string
	for d := range dirs {
		dl = append(dl, d)
	}
	sort.Strings(dl)
	for _, d := range dl {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: 0o755, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].dst < entries[j].dst })
	for _, e := range entries {
		b, err := os.ReadFile(e.src)
		if err != nil {
			return nil, err
		}
		h := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(e.dst, "/"), Mode: 0o755, Size: int64(len(b)), Format: tar.FormatPAX}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(b); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
