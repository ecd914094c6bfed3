// Package image loads OCI images without a daemon and unpacks them into a content-addressed rootfs cache.
package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path"
	"runtime"
	"strings"
	"syscall"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// ImageConfig is the part of an image's config a runtime applies to the processes it starts.
type ImageConfig struct {
	Env          []string `json:"env,omitempty"`
	WorkingDir   string   `json:"workingDir,omitempty"`
	Entrypoint   []string `json:"entrypoint,omitempty"`
	Cmd          []string `json:"cmd,omitempty"`
	User         string   `json:"user,omitempty"`
	OS           string   `json:"os,omitempty"`
	Architecture string   `json:"architecture,omitempty"`
}

// Config returns the runtime-relevant part of img's config.
func Config(img v1.Image) (ImageConfig, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return ImageConfig{}, fmt.Errorf("%w: image config: %v", sandbox.ErrInvalid, err)
	}
	return ImageConfig{
		Env:          cf.Config.Env,
		WorkingDir:   cf.Config.WorkingDir,
		Entrypoint:   cf.Config.Entrypoint,
		Cmd:          cf.Config.Cmd,
		User:         cf.Config.User,
		OS:           cf.OS,
		Architecture: cf.Architecture,
	}, nil
}

// platform is what this process can run.
func platform() v1.Platform { return v1.Platform{OS: "linux", Architecture: runtime.GOARCH} }

// source is a loaded image plus what the cache needs to know about where it came from.
type source struct {
	img  v1.Image
	desc string // for humans and metadata: "ociLayout:/p", "tarball:/p", "ref:r@sha256:..."
	// stored, for docker-archive tarballs only, is each layer's size and compression as stored in
	// the archive (go-containerregistry would compress an uncompressed layer to report its size).
	stored []storedLayer
	// classify maps errors met while reading the image (lazily, during unpack) to an error
	// class, or returns nil when the error says the image itself is bad.
	classify func(error) error
}

// fail reports an error met reading the image: classed if the source can tell (registry
// down, blob gone), otherwise the image is invalid.
func (s *source) fail(err error, format string, args ...any) error {
	what := fmt.Sprintf(format, args...)
	if c := s.classify(err); c != nil {
		return fmt.Errorf("%s: %s: %w", s.desc, what, c)
	}
	return fmt.Errorf("%w: %s: %s: %v", sandbox.ErrInvalid, s.desc, what, err)
}

type storedLayer struct {
	size       int64
	compressed bool
}

// Load returns the image named by src (exactly one of OCILayout, Tarball or Ref set). A missing
// path, tag or manifest wraps sandbox.ErrNotFound, a malformed image sandbox.ErrInvalid and a
// registry that cannot be reached sandbox.ErrUnreachable.
func Load(ctx context.Context, src spec.Image) (v1.Image, error) {
	s, err := load(ctx, src)
	if err != nil {
		return nil, err
	}
	if err := checkPlatform(s); err != nil {
		return nil, err
	}
	return s.img, nil
}

func load(ctx context.Context, src spec.Image) (*source, error) {
	var set []string
	for _, f := range []struct {
		name string
		on   bool
	}{
		{"host", src.Host}, {"ref", src.Ref != ""}, {"ociLayout", src.OCILayout != ""},
		{"tarball", src.Tarball != ""}, {"dir", src.Dir != ""}, {"snapshot", src.Snapshot != ""},
	} {
		if f.on {
			set = append(set, f.name)
		}
	}
	if len(set) != 1 {
		return nil, fmt.Errorf("%w: image: exactly one source must be set, got %d (%s)", sandbox.ErrInvalid, len(set), strings.Join(set, ", "))
	}
	var (
		s   *source
		err error
	)
	switch {
	case src.OCILayout != "":
		s, err = loadLayout(src.OCILayout)
	case src.Tarball != "":
		s, err = loadTarball(src.Tarball)
	case src.Ref != "":
		s, err = loadRef(ctx, src.Ref)
	default:
		return nil, fmt.Errorf("%w: image: %s is not an OCI image source (allowed: ociLayout, tarball, ref); use it as a root directory directly", sandbox.ErrInvalid, set[0])
	}
	if err != nil {
		return nil, err
	}
	return s, nil
}

// unclassified is the classifier of local sources: every read failure means a bad image.
func unclassified(error) error { return nil }

// checkPlatform refuses an image this host cannot run. Resolve checks it only on a cache miss:
// an entry exists only for images that passed, and for a registry it saves a round trip.
func checkPlatform(s *source) error {
	cf, err := s.img.ConfigFile()
	if err != nil {
		return s.fail(err, "image config")
	}
	want := platform()
	if (cf.OS != "" && cf.OS != want.OS) || (cf.Architecture != "" && cf.Architecture != want.Architecture) {
		return fmt.Errorf("%w: %s: image is for %s/%s; this host runs %s/%s", sandbox.ErrInvalid, s.desc, cf.OS, cf.Architecture, want.OS, want.Architecture)
	}
	return nil
}

func statSource(field, p string) error {
	if _, err := os.Stat(p); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: image.%s %q: no such file or directory", sandbox.ErrNotFound, field, p)
		}
		return fmt.Errorf("image.%s %q: %w", field, p, err)
	}
	return nil
}

func loadLayout(p string) (*source, error) {
	if err := statSource("ociLayout", p); err != nil {
		return nil, err
	}
	idx, err := layout.ImageIndexFromPath(p)
	if err != nil {
		return nil, fmt.Errorf("%w: image.ociLayout %q is not an OCI image layout: %v", sandbox.ErrInvalid, p, err)
	}
	img, err := selectImage(idx, p)
	if err != nil {
		return nil, err
	}
	return &source{img: img, desc: "ociLayout:" + p, classify: unclassified}, nil
}

// selectImage picks the one image for this platform in an index (descending into nested
// indexes). A descriptor without a platform matches, since single-image layouts rarely carry one.
func selectImage(idx v1.ImageIndex, where string) (v1.Image, error) {
	want := platform()
	type cand struct {
		img  v1.Image
		name string
	}
	var cands []cand
	var walk func(idx v1.ImageIndex, depth int) error
	walk = func(idx v1.ImageIndex, depth int) error {
		if depth > 4 {
			return fmt.Errorf("%w: %s: image indexes nested too deeply", sandbox.ErrInvalid, where)
		}
		im, err := idx.IndexManifest()
		if err != nil {
			return fmt.Errorf("%w: %s: index: %v", sandbox.ErrInvalid, where, err)
		}
		for _, d := range im.Manifests {
			switch {
			case d.MediaType.IsImage():
				if d.Platform != nil && !d.Platform.Satisfies(want) {
					continue
				}
				img, err := idx.Image(d.Digest)
				if err != nil {
					return fmt.Errorf("%w: %s: image %s: %v", sandbox.ErrInvalid, where, d.Digest, err)
				}
				n := d.Digest.String()
				if r := d.Annotations["org.opencontainers.image.ref.name"]; r != "" {
					n = r + " (" + n + ")"
				}
				cands = append(cands, cand{img, n})
			case d.MediaType.IsIndex():
				child, err := idx.ImageIndex(d.Digest)
				if err != nil {
					return fmt.Errorf("%w: %s: index %s: %v", sandbox.ErrInvalid, where, d.Digest, err)
				}
				if err := walk(child, depth+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(idx, 0); err != nil {
		return nil, err
	}
	switch len(cands) {
	case 0:
		return nil, fmt.Errorf("%w: %s: no image for %s/%s", sandbox.ErrNotFound, where, want.OS, want.Architecture)
	case 1:
		return cands[0].img, nil
	}
	names := make([]string, len(cands))
	for i, c := range cands {
		names[i] = c.name
	}
	return nil, fmt.Errorf("%w: %s holds %d images for %s/%s (%s); keep one per layout", sandbox.ErrInvalid, where, len(cands), want.OS, want.Architecture, strings.Join(names, ", "))
}

func loadTarball(p string) (*source, error) {
	if err := statSource("tarball", p); err != nil {
		return nil, err
	}
	opener := func() (io.ReadCloser, error) { return os.Open(p) }
	m, err := tarball.LoadManifest(opener)
	if err != nil {
		if isOCIArchive(p) {
			return nil, fmt.Errorf("%w: image.tarball %q is an OCI archive, not a docker-archive; unpack it and use ociLayout", sandbox.ErrInvalid, p)
		}
		return nil, fmt.Errorf("%w: image.tarball %q is not a docker-archive (no readable manifest.json): %v", sandbox.ErrInvalid, p, err)
	}
	if len(m) != 1 {
		return nil, fmt.Errorf("%w: image.tarball %q holds %d images; keep exactly one per archive", sandbox.ErrInvalid, p, len(m))
	}
	img, err := tarball.Image(opener, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: image.tarball %q: %v", sandbox.ErrInvalid, p, err)
	}
	stored, err := scanArchive(p, m[0].Layers)
	if err != nil {
		return nil, err
	}
	return &source{img: img, desc: "tarball:" + p, stored: stored, classify: unclassified}, nil
}

func isOCIArchive(p string) bool {
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err != nil {
			return false
		}
		if path.Clean(hdr.Name) == "oci-layout" {
			return true
		}
	}
}

// scanArchive reads the archive's headers (file data is skipped by seeking) to learn each
// layer's stored size and whether it is compressed, following symlinked entries as docker's
// own OCI-in-docker-archive format uses them.
func scanArchive(p string, layers []string) ([]storedLayer, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	type entry struct {
		size       int64
		link       string
		compressed bool
	}
	ents := map[string]entry{}
	tr := tar.NewReader(f)
	var magic [4]byte
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: image.tarball %q: %v", sandbox.ErrInvalid, p, err)
		}
		n := path.Clean(hdr.Name)
		switch hdr.Typeflag {
		case tar.TypeSymlink:
			ents[n] = entry{link: path.Join(path.Dir(n), hdr.Linkname)}
		case tar.TypeLink:
			ents[n] = entry{link: path.Clean(hdr.Linkname)}
		case tar.TypeReg, tar.TypeRegA:
			k, _ := io.ReadFull(tr, magic[:])
			ents[n] = entry{size: hdr.Size, compressed: isCompressed(magic[:k])}
		}
	}
	out := make([]storedLayer, len(layers))
	for i, l := range layers {
		n := path.Clean(l)
		e, ok := ents[n]
		for hops := 0; ok && e.link != "" && hops < 16; hops++ {
			e, ok = ents[e.link]
		}
		if !ok || e.link != "" {
			return nil, fmt.Errorf("%w: image.tarball %q: layer %q is not in the archive", sandbox.ErrInvalid, p, l)
		}
		out[i] = storedLayer{size: e.size, compressed: e.compressed}
	}
	return out, nil
}

// isCompressed recognises the gzip and zstd magic numbers, the two layer compressions.
func isCompressed(b []byte) bool {
	return (len(b) >= 2 && b[0] == 0x1f && b[1] == 0x8b) ||
		(len(b) >= 4 && b[0] == 0x28 && b[1] == 0xb5 && b[2] == 0x2f && b[3] == 0xfd)
}

func loadRef(ctx context.Context, ref string) (*source, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("%w: image.ref %q: %v", sandbox.ErrInvalid, ref, err)
	}
	classify := func(err error) error { return classifyRemote(ref, err) }
	s := &source{desc: "ref:" + r.Name(), classify: classify}
	img, err := remote.Image(r,
		remote.WithContext(ctx),
		remote.WithPlatform(platform()),
		remote.WithAuthFromKeychain(authn.DefaultKeychain),
	)
	if err != nil {
		return nil, s.fail(err, "fetching the manifest")
	}
	s.img = img
	if d, err := img.Digest(); err == nil {
		s.desc = "ref:" + r.Context().Name() + "@" + d.String()
	}
	return s, nil
}

// classifyRemote maps registry and network failures to error classes; nil means none applies
// (the registry answered with something malformed).
func classifyRemote(ref string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var te *transport.Error
	if errors.As(err, &te) {
		for _, d := range te.Errors {
			switch d.Code {
			case transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode, transport.BlobUnknownErrorCode:
				return fmt.Errorf("%w: image.ref %q: %v", sandbox.ErrNotFound, ref, err)
			case transport.UnauthorizedErrorCode:
				return fmt.Errorf("%w: image.ref %q: %v", sandbox.ErrUnauthenticated, ref, err)
			case transport.DeniedErrorCode:
				return fmt.Errorf("%w: image.ref %q: %v", sandbox.ErrForbidden, ref, err)
			}
		}
		switch {
		case te.StatusCode == 404:
			return fmt.Errorf("%w: image.ref %q: %v", sandbox.ErrNotFound, ref, err)
		case te.StatusCode == 401:
			return fmt.Errorf("%w: image.ref %q: %v", sandbox.ErrUnauthenticated, ref, err)
		case te.StatusCode == 403:
			return fmt.Errorf("%w: image.ref %q: %v", sandbox.ErrForbidden, ref, err)
		case te.StatusCode == 429 || te.StatusCode >= 500:
			return fmt.Errorf("%w: image.ref %q: registry answered %d: %v", sandbox.ErrUnreachable, ref, te.StatusCode, err)
		}
		return nil
	}
	var ne net.Error
	var oe *net.OpError
	var dnse *net.DNSError
	if errors.As(err, &oe) || errors.As(err, &dnse) || errors.As(err, &ne) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) ||
		errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: image.ref %q: registry: %v", sandbox.ErrUnreachable, ref, err)
	}
	return nil
}
