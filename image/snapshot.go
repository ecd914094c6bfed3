//go:build linux

package image

// Snapshot layers and the snapshot store.
//
// A snapshot is a sandbox's writable layer captured as one OCI layer on top of the sandbox's
// base image. WriteLayer captures directories into a layer tar without following any symlink
// or crossing a mount; RemapLayer turns a stored layer into the tar a new sandbox's writable
// tmpfs is filled from; SnapshotStore keeps snapshots as images in one OCI image layout (blobs
// shared between snapshots and their bases) with a JSON record per snapshot.

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/match"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// maxLayerDepth bounds directory nesting in a captured layer (one open descriptor per level).
const maxLayerDepth = 256

// LayerSource is one directory captured into a snapshot layer.
type LayerSource struct {
	// Path is the directory, relative to the root WriteLayer is given. It is opened without
	// following any symlink and without leaving the root's mount.
	Path string
	// Name is where the directory's content goes in the image ("workspace", "tmp").
	Name string
}

// LayerOptions map host ownership back to the sandbox's ids.
type LayerOptions struct {
	// IDBase is subtracted from every uid and gid; IDCount (when > 0) bounds the result: a file
	// owned by an id the sandbox does not map is refused.
	IDBase, IDCount int
}

// LayerStats count what a layer holds.
type LayerStats struct {
	Dirs     int   `json:"dirs"`
	Files    int   `json:"files"`
	Symlinks int   `json:"symlinks"`
	Links    int   `json:"hardLinks"`
	Bytes    int64 `json:"bytes"`
	// Skipped counts sockets, fifos and device nodes: they are not captured.
	Skipped int `json:"skipped,omitempty"`
}

type fileID struct{ dev, ino uint64 }

type layerWriter struct {
	ctx   context.Context
	tw    *tar.Writer
	opts  LayerOptions
	dev   uint64
	links map[fileID]string
	stats LayerStats
}

// WriteLayer writes an uncompressed layer tar of the given directories to w. Nothing is ever
// followed: symlinks are recorded as symlinks, every directory and file is opened relative to
// its parent with O_NOFOLLOW and checked to be the inode that was listed, and a directory on
// another filesystem than its source (a mount) is refused. Modes keep permission and sticky
// bits (setuid and setgid are dropped, as on unpack); ownership is mapped back by opts; mtimes
// are kept to the second; hard links within the layer stay hard links. Sockets, fifos and
// device nodes are skipped and counted. A file that changes size while it is read fails the
// capture: the caller makes the tree still (freezes its writers) first.
func WriteLayer(ctx context.Context, w io.Writer, root *os.File, sources []LayerSource, opts LayerOptions) (LayerStats, error) {
	lw := &layerWriter{ctx: ctx, tw: tar.NewWriter(w), opts: opts, links: map[fileID]string{}}
	seen := map[string]bool{}
	for _, src := range sources {
		name, err := cleanName(src.Name)
		if err != nil || name == "." {
			return lw.stats, fmt.Errorf("%w: layer source name %q: must be a relative path below the image root", sandbox.ErrInvalid, src.Name)
		}
		if seen[name] {
			return lw.stats, fmt.Errorf("%w: layer source name %q is given twice", sandbox.ErrInvalid, src.Name)
		}
		seen[name] = true
		fd, err := unix.Openat2(int(root.Fd()), src.Path, &unix.OpenHow{
			// RESOLVE_NO_SYMLINKS covers the last component too (ELOOP, where O_NOFOLLOW
			// with O_DIRECTORY would say ENOTDIR).
			Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
		})
		if err != nil {
			switch {
			case errors.Is(err, unix.ELOOP):
				return lw.stats, fmt.Errorf("%w: capture %s: it is reached through a symlink, which capture never follows", sandbox.ErrRefused, src.Path)
			case errors.Is(err, unix.EXDEV):
				return lw.stats, fmt.Errorf("%w: capture %s: it is reached across a mount or outside the root", sandbox.ErrRefused, src.Path)
			}
			return lw.stats, fmt.Errorf("capture %s: %w", src.Path, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return lw.stats, fmt.Errorf("capture %s: %w", src.Path, err)
		}
		lw.dev = st.Dev
		if err := lw.header(name, &st, tar.TypeDir, "", 0); err != nil {
			unix.Close(fd)
			return lw.stats, err
		}
		if err := lw.dir(fd, name, 1); err != nil {
			return lw.stats, err
		}
	}
	if err := lw.tw.Close(); err != nil {
		return lw.stats, err
	}
	return lw.stats, nil
}

// header writes one entry for a file whose lstat is st.
func (lw *layerWriter) header(name string, st *unix.Stat_t, typ byte, link string, size int64) error {
	uid, gid := int(st.Uid), int(st.Gid)
	if lw.opts.IDBase != 0 || lw.opts.IDCount != 0 {
		uid -= lw.opts.IDBase
		gid -= lw.opts.IDBase
		if uid < 0 || gid < 0 || (lw.opts.IDCount > 0 && (uid >= lw.opts.IDCount || gid >= lw.opts.IDCount)) {
			return fmt.Errorf("%w: capture %s: owner %d:%d is outside the sandbox's ids (%d..%d)", sandbox.ErrRefused, name, st.Uid, st.Gid, lw.opts.IDBase, lw.opts.IDBase+lw.opts.IDCount-1)
		}
	}
	mode := int64(st.Mode & 0o777)
	if st.Mode&unix.S_ISVTX != 0 {
		mode |= 0o1000
	}
	hdr := &tar.Header{
		Typeflag: typ, Name: name, Linkname: link, Size: size, Mode: mode,
		Uid: uid, Gid: gid, ModTime: time.Unix(st.Mtim.Sec, 0),
	}
	if typ == tar.TypeDir {
		hdr.Name += "/"
	}
	if err := lw.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("capture %s: %w", name, err)
	}
	return nil
}

// dir captures the children of the open directory fd (which it closes), in name order.
func (lw *layerWriter) dir(fd int, name string, depth int) error {
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	if depth > maxLayerDepth {
		return fmt.Errorf("%w: capture %s: directories nested deeper than %d", sandbox.ErrRefused, name, maxLayerDepth)
	}
	names, err := f.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("capture %s: %w", name, err)
	}
	sort.Strings(names)
	for _, n := range names {
		if err := lw.ctx.Err(); err != nil {
			return err
		}
		p := name + "/" + n
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("capture %s: %w", p, err)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if st.Dev != lw.dev {
				return fmt.Errorf("%w: capture %s: a different filesystem is mounted there", sandbox.ErrRefused, p)
			}
			cfd, err := lw.open(fd, n, p, &st, unix.O_DIRECTORY)
			if err != nil {
				return err
			}
			if err := lw.header(p, &st, tar.TypeDir, "", 0); err != nil {
				unix.Close(cfd)
				return err
			}
			lw.stats.Dirs++
			if err := lw.dir(cfd, p, depth+1); err != nil {
				return err
			}
		case unix.S_IFREG:
			if err := lw.file(fd, n, p, &st); err != nil {
				return err
			}
		case unix.S_IFLNK:
			target, err := readlinkat(fd, n)
			if err != nil {
				return fmt.Errorf("capture %s: %w", p, err)
			}
			if err := lw.header(p, &st, tar.TypeSymlink, target, 0); err != nil {
				return err
			}
			lw.stats.Symlinks++
		default:
			lw.stats.Skipped++
		}
	}
	return nil
}

// open opens name in dirfd without following a symlink, and checks it is still the inode st.
func (lw *layerWriter) open(dirfd int, name, p string, st *unix.Stat_t, flags int) (int, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NOCTTY|flags, 0)
	if err != nil {
		return -1, fmt.Errorf("capture %s: %w", p, err)
	}
	var got unix.Stat_t
	if err := unix.Fstat(fd, &got); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("capture %s: %w", p, err)
	}
	if got.Dev != st.Dev || got.Ino != st.Ino {
		unix.Close(fd)
		return -1, fmt.Errorf("%w: capture %s: it was replaced while being captured", sandbox.ErrConflict, p)
	}
	*st = got
	return fd, nil
}

func (lw *layerWriter) file(dirfd int, name, p string, st *unix.Stat_t) error {
	id := fileID{st.Dev, st.Ino}
	if st.Nlink > 1 {
		if first, ok := lw.links[id]; ok {
			lw.stats.Links++
			return lw.header(p, st, tar.TypeLink, first, 0)
		}
	}
	fd, err := lw.open(dirfd, name, p, st, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	if err := lw.header(p, st, tar.TypeReg, "", st.Size); err != nil {
		return err
	}
	n, err := io.CopyN(lw.tw, f, st.Size)
	if err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%w: capture %s: it shrank from %d to %d bytes while being read", sandbox.ErrConflict, p, st.Size, n)
		}
		return fmt.Errorf("capture %s: %w", p, err)
	}
	if st.Nlink > 1 {
		lw.links[id] = p
	}
	lw.stats.Files++
	lw.stats.Bytes += n
	return nil
}

func readlinkat(dirfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
		if size >= 1<<16 {
			return "", unix.ENAMETOOLONG
		}
	}
}

// LayerMapping moves the entries at and below From (an image path) to To.
type LayerMapping struct{ From, To string }

// RemapLayer copies the uncompressed layer tar r to w with every entry moved by the first
// mapping whose From is the entry or one of its parents. Entries that are parents of a From
// are dropped (the target already has them); any other entry is refused, as are absolute
// names, ".." components, whiteouts and entry types other than directories, regular files,
// symlinks and hard links (hard link targets are moved too and must land inside a mapping).
// Modes keep permission and sticky bits; ownership must be within 0..idCount-1 when idCount >
// 0; extended attributes and owner names are dropped. Symlink targets are kept verbatim: they
// are resolved only inside the sandbox that reads them.
func RemapLayer(ctx context.Context, w io.Writer, r io.Reader, mappings []LayerMapping, idCount int) (LayerStats, error) {
	var stats LayerStats
	maps := make([]LayerMapping, len(mappings))
	for i, m := range mappings {
		from, err1 := cleanName(m.From)
		to, err2 := cleanName(m.To)
		if err1 != nil || err2 != nil || from == "." || to == "." {
			return stats, fmt.Errorf("%w: layer mapping %q -> %q: both must be relative paths below the root", sandbox.ErrInvalid, m.From, m.To)
		}
		maps[i] = LayerMapping{from, to}
	}
	move := func(name string) (string, bool, bool) {
		for _, m := range maps {
			if name == m.From {
				return m.To, true, false
			}
			if rest, ok := strings.CutPrefix(name, m.From+"/"); ok {
				return m.To + "/" + rest, true, false
			}
		}
		for _, m := range maps {
			if strings.HasPrefix(m.From, name+"/") {
				return "", false, true
			}
		}
		return "", false, false
	}
	tr := tar.NewReader(r)
	tw := tar.NewWriter(w)
	for {
		if err := ctx.Err(); err != nil {
			return stats, err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return stats, fmt.Errorf("%w: snapshot layer is not a valid tar: %v", sandbox.ErrInvalid, err)
		}
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		name, err := cleanName(hdr.Name)
		if err != nil {
			return stats, invalid(hdr, "%v", err)
		}
		if strings.HasPrefix(path.Base(name), whiteoutPrefix) {
			return stats, invalid(hdr, "a snapshot layer has no whiteouts")
		}
		to, ok, parent := move(name)
		if parent {
			continue
		}
		if !ok {
			return stats, invalid(hdr, "outside the snapshot's writable paths")
		}
		if hdr.Uid < 0 || hdr.Gid < 0 || (idCount > 0 && (hdr.Uid >= idCount || hdr.Gid >= idCount)) {
			return stats, invalid(hdr, "owner %d:%d is outside the sandbox's ids 0..%d", hdr.Uid, hdr.Gid, idCount-1)
		}
		out := &tar.Header{
			Typeflag: hdr.Typeflag, Name: to, Mode: hdr.Mode & 0o1777, Uid: hdr.Uid, Gid: hdr.Gid,
			ModTime: hdr.ModTime.Truncate(time.Second), Format: tar.FormatPAX,
		}
		switch hdr.Typeflag {
		case tar.TypeReg, tar.TypeRegA:
			out.Typeflag, out.Size = tar.TypeReg, hdr.Size
			stats.Files++
			stats.Bytes += hdr.Size
		case tar.TypeDir:
			out.Name += "/"
			stats.Dirs++
		case tar.TypeSymlink:
			if hdr.Linkname == "" || strings.ContainsRune(hdr.Linkname, 0) {
				return stats, invalid(hdr, "symlink with an empty or NUL-bearing target")
			}
			out.Linkname = hdr.Linkname
			stats.Symlinks++
		case tar.TypeLink:
			target, err := cleanName(hdr.Linkname)
			if err != nil {
				return stats, invalid(hdr, "hard link target %q: %v", hdr.Linkname, err)
			}
			lt, ok, _ := move(target)
			if !ok {
				return stats, invalid(hdr, "hard link target %q is outside the snapshot's writable paths", hdr.Linkname)
			}
			out.Linkname = lt
			stats.Links++
		default:
			return stats, invalid(hdr, "entry type %q is not restored (directories, files, symlinks and hard links only)", string(hdr.Typeflag))
		}
		if err := tw.WriteHeader(out); err != nil {
			return stats, err
		}
		if out.Typeflag == tar.TypeReg {
			if _, err := io.Copy(tw, tr); err != nil {
				return stats, fmt.Errorf("%w: snapshot layer entry %q: %v", sandbox.ErrInvalid, hdr.Name, err)
			}
		}
	}
	return stats, tw.Close()
}

// Snapshot bases.
const (
	BaseHost  = "host"  // the host's /usr and chosen /etc files
	BaseDir   = "dir"   // a root directory, referenced by path (not copied)
	BaseImage = "image" // an OCI image, stored in the snapshot store
)

// SnapshotBase is what a snapshot's layer sits on.
type SnapshotBase struct {
	Kind string `json:"kind"`
	// Dir is the root directory of a dir base.
	Dir string `json:"dir,omitempty"`
	// Source is where an image base was first loaded from (informational, and a fallback when
	// the store no longer holds it).
	Source *spec.Image `json:"source,omitempty"`
	// Config is an image base's config digest; Manifest its manifest digest in the store.
	Config   string `json:"config,omitempty"`
	Manifest string `json:"manifest,omitempty"`
}

// Snapshot is one stored snapshot.
type Snapshot struct {
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"createdAt"`
	// SessionID and SandboxID name the sandbox it was taken from.
	SessionID string `json:"sessionId,omitempty"`
	SandboxID string `json:"sandboxId,omitempty"`
	// Workdir is the sandbox's workdir when captured: the layer holds it and /tmp.
	Workdir string       `json:"workdir"`
	Base    SnapshotBase `json:"base"`
	// Digest is the snapshot image's manifest digest; Layer and DiffID the snapshot layer's
	// compressed and uncompressed digests; Size its compressed size.
	Digest string     `json:"digest"`
	Layer  string     `json:"layer"`
	DiffID string     `json:"diffId"`
	Size   int64      `json:"size"`
	Stats  LayerStats `json:"stats"`
}

// Annotations on the store's index entries.
const (
	annotationRefName = "org.opencontainers.image.ref.name"
	annotationBaseOf  = "dev.airlock.snapshot.base"
)

// CheckSnapshotName refuses a name that is not 1 to 64 letters, digits, '_' and '-'.
func CheckSnapshotName(name string) error {
	if !spec.IsValidID(name) {
		return fmt.Errorf("%w: snapshot name %q: 1 to 64 characters of letters, digits, '_' and '-'", sandbox.ErrInvalid, name)
	}
	return nil
}

// SnapshotStore keeps snapshots in dir: dir/oci is an OCI image layout holding every snapshot
// image (annotated with its name) and the base images they sit on; dir/meta/<name>.json is
// each snapshot's record, written last, so a snapshot exists exactly when its record does.
// A flock on dir/.lock serialises writers across processes.
type SnapshotStore struct {
	dir string
	oci layout.Path
}

// OpenSnapshotStore opens (creating, mode 0700) the store in dir.
func OpenSnapshotStore(dir string) (*SnapshotStore, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	for _, d := range []string{dir, filepath.Join(dir, "meta")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("snapshot store: %w", err)
		}
	}
	s := &SnapshotStore{dir: dir, oci: layout.Path(filepath.Join(dir, "oci"))}
	unlock, err := s.lock(statedir.LockExclusive)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if _, err := os.Stat(filepath.Join(dir, "oci", "index.json")); errors.Is(err, fs.ErrNotExist) {
		if _, err := layout.Write(filepath.Join(dir, "oci"), empty.Index); err != nil {
			return nil, fmt.Errorf("snapshot store: %w", err)
		}
	}
	return s, nil
}

// Dir is the store's directory.
func (s *SnapshotStore) Dir() string { return s.dir }

// lock takes the store's lock (statedir.LockExclusive or LockShared): the store is a
// directory with a .lock file, as a state dir is.
func (s *SnapshotStore) lock(how int) (func(), error) {
	release, err := statedir.Lock(s.dir, how)
	if err != nil {
		return nil, fmt.Errorf("snapshot store: %w", err)
	}
	return release, nil
}

func (s *SnapshotStore) metaPath(name string) string {
	return filepath.Join(s.dir, "meta", name+".json")
}

// Put stores a snapshot: the gzip or plain layer tar at layerPath appended to base (nil: no
// base image, for host and dir bases). snap.Name must be new (sandbox.ErrConflict otherwise);
// the digests, size and creation time are filled in and the stored record returned.
func (s *SnapshotStore) Put(ctx context.Context, snap Snapshot, base v1.Image, layerPath string) (Snapshot, error) {
	if err := CheckSnapshotName(snap.Name); err != nil {
		return Snapshot{}, err
	}
	unlock, err := s.lock(statedir.LockExclusive)
	if err != nil {
		return Snapshot{}, err
	}
	defer unlock()
	if _, err := os.Stat(s.metaPath(snap.Name)); err == nil {
		return Snapshot{}, fmt.Errorf("%w: snapshot %q already exists", sandbox.ErrConflict, snap.Name)
	}
	// A crash between the image and the record leaves an index entry without a record.
	if err := s.oci.RemoveDescriptors(match.Annotation(annotationRefName, snap.Name)); err != nil {
		return Snapshot{}, fmt.Errorf("snapshot store: %w", err)
	}
	img := base
	if base == nil {
		img = mutate.MediaType(empty.Image, types.OCIManifestSchema1)
		img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
		cf, err := img.ConfigFile()
		if err != nil {
			return Snapshot{}, err
		}
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture = "linux", runtime.GOARCH
		if img, err = mutate.ConfigFile(img, cf); err != nil {
			return Snapshot{}, err
		}
	} else {
		cfgName, err := base.ConfigName()
		if err != nil {
			return Snapshot{}, fmt.Errorf("%w: base image config: %v", sandbox.ErrInvalid, err)
		}
		d, err := base.Digest()
		if err != nil {
			return Snapshot{}, fmt.Errorf("%w: base image digest: %v", sandbox.ErrInvalid, err)
		}
		if have, err := s.findBase(d); err != nil {
			return Snapshot{}, err
		} else if !have {
			if err := s.oci.AppendImage(base, layout.WithAnnotations(map[string]string{annotationBaseOf: cfgName.String()})); err != nil {
				return Snapshot{}, fmt.Errorf("snapshot store: storing base image %s: %w", cfgName, err)
			}
		}
		snap.Base.Kind, snap.Base.Config, snap.Base.Manifest = BaseImage, cfgName.String(), d.String()
	}
	mt := types.OCILayer
	if m, err := img.MediaType(); err == nil && m == types.DockerManifestSchema2 {
		mt = types.DockerLayer
	}
	layer, err := tarball.LayerFromFile(layerPath, tarball.WithMediaType(mt))
	if err != nil {
		return Snapshot{}, fmt.Errorf("snapshot layer: %w", err)
	}
	now := time.Now().UTC().Truncate(time.Second)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: now}, CreatedBy: "airlock snapshot " + snap.Name, Comment: "writable layer of session " + snap.SessionID},
	})
	if err != nil {
		return Snapshot{}, err
	}
	if err := ctx.Err(); err != nil {
		return Snapshot{}, err
	}
	if err := s.oci.AppendImage(img, layout.WithAnnotations(map[string]string{annotationRefName: snap.Name})); err != nil {
		return Snapshot{}, fmt.Errorf("snapshot store: %w", err)
	}
	dg, err := img.Digest()
	if err != nil {
		return Snapshot{}, err
	}
	ld, err := layer.Digest()
	if err != nil {
		return Snapshot{}, err
	}
	diff, err := layer.DiffID()
	if err != nil {
		return Snapshot{}, err
	}
	size, err := layer.Size()
	if err != nil {
		return Snapshot{}, err
	}
	snap.CreatedAt, snap.Digest, snap.Layer, snap.DiffID, snap.Size = now, dg.String(), ld.String(), diff.String(), size
	b, err := json.MarshalIndent(snap, "", "  ")
	if err != nil {
		return Snapshot{}, err
	}
	tmp := s.metaPath("." + snap.Name + ".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return Snapshot{}, fmt.Errorf("snapshot store: %w", err)
	}
	if err := os.Rename(tmp, s.metaPath(snap.Name)); err != nil {
		return Snapshot{}, fmt.Errorf("snapshot store: %w", err)
	}
	return snap, nil
}

// findBase reports whether the index holds a base image with manifest digest d.
func (s *SnapshotStore) findBase(d v1.Hash) (bool, error) {
	idx, err := s.oci.ImageIndex()
	if err != nil {
		return false, fmt.Errorf("snapshot store: %w", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return false, fmt.Errorf("snapshot store: %w", err)
	}
	for _, m := range im.Manifests {
		if m.Digest == d && m.Annotations[annotationBaseOf] != "" {
			return true, nil
		}
	}
	return false, nil
}

// Get returns the named snapshot's record, sandbox.ErrNotFound if there is none.
func (s *SnapshotStore) Get(name string) (Snapshot, error) {
	if err := CheckSnapshotName(name); err != nil {
		return Snapshot{}, err
	}
	b, err := os.ReadFile(s.metaPath(name))
	if errors.Is(err, fs.ErrNotExist) {
		return Snapshot{}, fmt.Errorf("%w: snapshot %q", sandbox.ErrNotFound, name)
	}
	if err != nil {
		return Snapshot{}, err
	}
	var snap Snapshot
	if err := json.Unmarshal(b, &snap); err != nil {
		return Snapshot{}, fmt.Errorf("%w: snapshot record %s: %v", sandbox.ErrInvalid, s.metaPath(name), err)
	}
	return snap, nil
}

// List returns every snapshot, oldest first (then by name).
func (s *SnapshotStore) List() ([]Snapshot, error) {
	ents, err := os.ReadDir(filepath.Join(s.dir, "meta"))
	if err != nil {
		return nil, err
	}
	var out []Snapshot
	for _, e := range ents {
		n, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || strings.HasPrefix(n, ".") {
			continue
		}
		snap, err := s.Get(n)
		if err != nil {
			if errors.Is(err, sandbox.ErrNotFound) {
				continue // deleted meanwhile
			}
			return nil, err
		}
		out = append(out, snap)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}

// Delete removes a snapshot, the base images no other snapshot uses, and every blob left
// unreferenced. Sandboxes made from it are unaffected: they hold their own copy.
func (s *SnapshotStore) Delete(name string) error {
	if err := CheckSnapshotName(name); err != nil {
		return err
	}
	unlock, err := s.lock(statedir.LockExclusive)
	if err != nil {
		return err
	}
	defer unlock()
	if err := os.Remove(s.metaPath(name)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: snapshot %q", sandbox.ErrNotFound, name)
		}
		return err
	}
	if err := s.oci.RemoveDescriptors(match.Annotation(annotationRefName, name)); err != nil {
		return fmt.Errorf("snapshot store: %w", err)
	}
	rest, err := s.List()
	if err != nil {
		return err
	}
	used := map[string]bool{}
	for _, r := range rest {
		used[r.Base.Manifest] = true
	}
	if err := s.oci.RemoveDescriptors(func(d v1.Descriptor) bool {
		return d.Annotations[annotationBaseOf] != "" && !used[d.Digest.String()]
	}); err != nil {
		return fmt.Errorf("snapshot store: %w", err)
	}
	//nolint:staticcheck // the layout's own reachability walk; we hold the store's lock.
	garbage, err := s.oci.GarbageCollect()
	if err != nil {
		return fmt.Errorf("snapshot store: %w", err)
	}
	var errs []error
	for _, h := range garbage {
		if err := s.oci.RemoveBlob(h); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Image returns the snapshot image (base layers and the snapshot layer).
func (s *SnapshotStore) Image(snap Snapshot) (v1.Image, error) {
	h, err := v1.NewHash(snap.Digest)
	if err != nil {
		return nil, fmt.Errorf("%w: snapshot %q digest: %v", sandbox.ErrInvalid, snap.Name, err)
	}
	img, err := s.oci.Image(h)
	if err != nil {
		return nil, fmt.Errorf("%w: snapshot %q image: %v", sandbox.ErrNotFound, snap.Name, err)
	}
	return img, nil
}

// BaseImage returns the stored base image of an image-based snapshot.
func (s *SnapshotStore) BaseImage(snap Snapshot) (v1.Image, error) {
	if snap.Base.Kind != BaseImage {
		return nil, fmt.Errorf("%w: snapshot %q has a %s base, not an image", sandbox.ErrInvalid, snap.Name, snap.Base.Kind)
	}
	h, err := v1.NewHash(snap.Base.Manifest)
	if err != nil {
		return nil, fmt.Errorf("%w: snapshot %q base digest: %v", sandbox.ErrInvalid, snap.Name, err)
	}
	img, err := s.oci.Image(h)
	if err != nil {
		return nil, fmt.Errorf("%w: snapshot %q base image %s: %v", sandbox.ErrNotFound, snap.Name, snap.Base.Manifest, err)
	}
	return img, nil
}

// StoredBase returns a base image the store holds by manifest digest (kept while a snapshot
// uses it), sandbox.ErrNotFound otherwise.
func (s *SnapshotStore) StoredBase(manifest string) (v1.Image, error) {
	h, err := v1.NewHash(manifest)
	if err != nil {
		return nil, fmt.Errorf("%w: base digest %q: %v", sandbox.ErrInvalid, manifest, err)
	}
	unlock, err := s.lock(statedir.LockShared)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if ok, err := s.findBase(h); err != nil {
		return nil, err
	} else if !ok {
		return nil, fmt.Errorf("%w: base image %s is not in the snapshot store", sandbox.ErrNotFound, manifest)
	}
	return s.oci.Image(h)
}

// OpenLayer opens the snapshot layer, uncompressed. The open blob stays readable if the
// snapshot is deleted meanwhile.
func (s *SnapshotStore) OpenLayer(snap Snapshot) (io.ReadCloser, error) {
	unlock, err := s.lock(statedir.LockShared)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if _, err := os.Stat(s.metaPath(snap.Name)); err != nil {
		return nil, fmt.Errorf("%w: snapshot %q", sandbox.ErrNotFound, snap.Name)
	}
	img, err := s.Image(snap)
	if err != nil {
		return nil, err
	}
	h, err := v1.NewHash(snap.Layer)
	if err != nil {
		return nil, fmt.Errorf("%w: snapshot %q layer digest: %v", sandbox.ErrInvalid, snap.Name, err)
	}
	l, err := img.LayerByDigest(h)
	if err != nil {
		return nil, fmt.Errorf("%w: snapshot %q layer: %v", sandbox.ErrNotFound, snap.Name, err)
	}
	rc, err := l.Uncompressed()
	if err != nil {
		return nil, fmt.Errorf("snapshot %q layer: %w", snap.Name, err)
	}
	return rc, nil
}

// ResolveImage is ResolveWith for an image already loaded (desc names it for humans): the same
// content-addressed cache entry, unpacked on a miss.
func ResolveImage(ctx context.Context, img v1.Image, desc, cacheDir string, opts ResolveOptions) (string, error) {
	base, err := rootfsBase(cacheDir, opts)
	if err != nil {
		return "", err
	}
	return resolve(ctx, &source{img: img, desc: desc, classify: unclassified}, base, opts)
}
