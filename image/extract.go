//go:build linux

package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/sandbox"
)

// OCI whiteout markers (image-spec layer.md).
const (
	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
)

// extractOptions says how tar ownership lands on the host.
type extractOptions struct {
	// chown false leaves everything owned by the caller.
	chown bool
	// idBase is added to every uid and gid; idCount (when > 0) bounds the tar ids accepted.
	idBase, idCount int
	log             *slog.Logger
}

// dirMeta is applied after every layer, deepest first: creating children and whiteouts change
// a directory's mtime, and a read-only directory mode would block later writes by non-root.
type dirMeta struct {
	mode         fs.FileMode
	atime, mtime time.Time
}

// extractStats counts what an unpack produced, for the cache metadata.
type extractStats struct {
	Files   int   `json:"files"`
	Bytes   int64 `json:"bytes"`
	Skipped int   `json:"skippedDevices"`
}

// extractor applies layer tars, in order, onto one root directory. Every filesystem call goes
// through os.Root, so no entry (or symlink planted by an earlier entry) can reach outside it.
type extractor struct {
	root    *os.Root
	opts    extractOptions
	escape  error           // os.Root's "path escapes" sentinel, probed at open
	dirs    map[string]bool // directories known to exist (cleared on any removal)
	meta    map[string]dirMeta
	written map[string]bool // paths the current layer wrote, and their parents (opaque dirs keep them)
	stats   extractStats
}

func newExtractor(dir string, opts extractOptions) (*extractor, error) {
	if opts.log == nil {
		opts.log = slog.New(slog.DiscardHandler)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	x := &extractor{root: root, opts: opts, dirs: map[string]bool{".": true}, meta: map[string]dirMeta{}}
	// os.Root does not export its escape error; take it from a call that must escape, so
	// refusals can be classified as invalid input rather than operational failures.
	var pe *fs.PathError
	if _, err := root.Lstat(".."); errors.As(err, &pe) {
		x.escape = pe.Err
	} else {
		root.Close()
		return nil, fmt.Errorf("os.Root did not refuse \"..\" (got %v)", err)
	}
	if opts.chown {
		if err := root.Lchown(".", opts.idBase, opts.idBase); err != nil {
			root.Close()
			return nil, chownErr(err)
		}
	}
	x.meta["."] = dirMeta{mode: 0o755, mtime: time.Unix(0, 0)}
	return x, nil
}

func (x *extractor) close() error { return x.root.Close() }

// applyLayer applies one uncompressed layer tar.
func (x *extractor) applyLayer(ctx context.Context, r io.Reader) error {
	x.written = map[string]bool{}
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: layer is not a valid tar: %v", sandbox.ErrInvalid, err)
		}
		if err := x.apply(hdr, tr); err != nil {
			return err
		}
	}
}

// invalid names a refused entry and why.
func invalid(hdr *tar.Header, format string, args ...any) error {
	return fmt.Errorf("%w: layer entry %q: %s", sandbox.ErrInvalid, hdr.Name, fmt.Sprintf(format, args...))
}

// cleanName validates a name as written in the tar and returns it cleaned, relative to the
// root ("." is the root itself). Absolute names and any ".." component are refused outright
// rather than cleaned into something else: a layer that tries either is hostile or broken.
func cleanName(raw string) (string, error) {
	switch {
	case raw == "":
		return "", errors.New("empty path")
	case strings.ContainsRune(raw, 0):
		return "", errors.New("NUL byte in path")
	case strings.HasPrefix(raw, "/"):
		return "", errors.New("absolute path (layer paths must be relative to the image root)")
	}
	for _, c := range strings.Split(raw, "/") {
		if c == ".." {
			return "", errors.New("\"..\" component (a layer may not reach above the image root)")
		}
	}
	return path.Clean(raw), nil
}

func (x *extractor) apply(hdr *tar.Header, r io.Reader) error {
	name, err := cleanName(hdr.Name)
	if err != nil {
		return invalid(hdr, "%v", err)
	}
	dir, base := path.Dir(name), path.Base(name)
	if strings.Contains(dir+"/", "/"+whiteoutPrefix) || strings.HasPrefix(dir, whiteoutPrefix) {
		return invalid(hdr, "whiteout marker used as a directory")
	}
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	if base == opaqueMarker {
		return x.opaque(hdr, dir)
	}
	if strings.HasPrefix(base, whiteoutPrefix) {
		target := strings.TrimPrefix(base, whiteoutPrefix)
		if target == "" || target == "." || target == ".." {
			return invalid(hdr, "whiteout names no file")
		}
		return x.whiteout(hdr, path.Join(dir, target))
	}
	if name == "." {
		if hdr.Typeflag != tar.TypeDir {
			return invalid(hdr, "the image root must be a directory")
		}
		return x.rootDir(hdr)
	}
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeRegA, tar.TypeGNUSparse:
		err = x.file(hdr, name, r)
	case tar.TypeDir:
		err = x.mkdir(hdr, name)
	case tar.TypeSymlink:
		err = x.symlink(hdr, name)
	case tar.TypeLink:
		err = x.hardlink(hdr, name)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		// The runtime provides its own minimal /dev; device nodes from an image would be a way
		// to reach host devices, and fifos have no use in a fresh root.
		x.stats.Skipped++
		x.opts.log.Debug("skipping special file in layer", "entry", hdr.Name, "type", string(hdr.Typeflag))
		return nil
	default:
		return invalid(hdr, "unsupported tar entry type %q", string(hdr.Typeflag))
	}
	if err != nil {
		return err
	}
	x.mark(name)
	return nil
}

// mark records that this layer wrote name (and, implicitly, its parents).
func (x *extractor) mark(name string) {
	for p := name; p != "." && !x.written[p]; p = path.Dir(p) {
		x.written[p] = true
	}
}

// entryErr classifies a filesystem error for one entry: what a hostile or malformed layer can
// cause is invalid input; anything else (no space, I/O) is returned as it is.
func (x *extractor) entryErr(hdr *tar.Header, op string, err error) error {
	if errors.Is(err, x.escape) {
		return invalid(hdr, "%s: path escapes the image root through a symlink", op)
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		switch errno {
		case unix.ENOTDIR, unix.ENOENT, unix.EEXIST, unix.ELOOP, unix.EISDIR, unix.EINVAL,
			unix.ENAMETOOLONG, unix.EMLINK, unix.EXDEV:
			return invalid(hdr, "%s: %v", op, err)
		}
	}
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrExist) {
		return invalid(hdr, "%s: %v", op, err)
	}
	return fmt.Errorf("layer entry %q: %s: %w", hdr.Name, op, err)
}

func chownErr(err error) error {
	if errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("%w: setting image file ownership needs CAP_CHOWN (run as root, or set ResolveOptions.NoChown for a rootless runtime): %v", sandbox.ErrUnsupported, err)
	}
	return err
}

// ids maps the tar owner onto the host.
func (x *extractor) ids(hdr *tar.Header) (int, int, error) {
	if hdr.Uid < 0 || hdr.Gid < 0 {
		return 0, 0, invalid(hdr, "negative owner %d:%d", hdr.Uid, hdr.Gid)
	}
	if n := x.opts.idCount; n > 0 && (hdr.Uid >= n || hdr.Gid >= n) {
		return 0, 0, invalid(hdr, "owner %d:%d is outside the sandbox's id range 0..%d", hdr.Uid, hdr.Gid, n-1)
	}
	return x.opts.idBase + hdr.Uid, x.opts.idBase + hdr.Gid, nil
}

// mode keeps permission and sticky bits. setuid and setgid are dropped: sandboxed code runs
// with no_new_privs, and a setuid file owned by a mapped id is a needless hazard on the host.
func mode(hdr *tar.Header) fs.FileMode {
	m := fs.FileMode(hdr.Mode) & fs.ModePerm
	if hdr.Mode&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

func times(hdr *tar.Header) (time.Time, time.Time) {
	mtime := hdr.ModTime
	if mtime.IsZero() {
		mtime = time.Unix(0, 0)
	}
	atime := hdr.AccessTime
	if atime.IsZero() {
		atime = mtime
	}
	return atime, mtime
}

// ensureParent creates missing parent directories (a layer need not list them), owned by the
// sandbox's root.
func (x *extractor) ensureParent(hdr *tar.Header, dir string) error {
	if x.dirs[dir] {
		return nil
	}
	if err := x.ensureParent(hdr, path.Dir(dir)); err != nil {
		return err
	}
	fi, err := x.root.Stat(dir)
	switch {
	case err == nil && fi.IsDir():
	case err == nil:
		return invalid(hdr, "parent %q is not a directory", dir)
	case errors.Is(err, fs.ErrNotExist):
		if err := x.root.Mkdir(dir, 0o755); err != nil {
			return x.entryErr(hdr, "mkdir parent", err)
		}
		if x.opts.chown {
			if err := x.root.Lchown(dir, x.opts.idBase, x.opts.idBase); err != nil {
				return chownErr(err)
			}
		}
		x.meta[dir] = dirMeta{mode: 0o755, mtime: time.Unix(0, 0)}
	default:
		return x.entryErr(hdr, "stat parent", err)
	}
	x.dirs[dir] = true
	return nil
}

// prepare makes way for a new entry at name: an existing directory stays when a directory
// replaces it (its contents merge); anything else is removed first. It reports whether a
// directory was kept.
func (x *extractor) prepare(hdr *tar.Header, name string, isDir bool) (bool, error) {
	if err := x.ensureParent(hdr, path.Dir(name)); err != nil {
		return false, err
	}
	fi, err := x.root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, x.entryErr(hdr, "lstat", err)
	}
	if isDir && fi.IsDir() {
		return true, nil
	}
	return false, x.removeAll(hdr, name)
}

func (x *extractor) removeAll(hdr *tar.Header, name string) error {
	if err := x.root.RemoveAll(name); err != nil {
		return x.entryErr(hdr, "remove", err)
	}
	clear(x.dirs)
	x.dirs["."] = true
	for p := range x.meta {
		if p == name || strings.HasPrefix(p, name+"/") {
			delete(x.meta, p)
		}
	}
	return nil
}

func (x *extractor) file(hdr *tar.Header, name string, r io.Reader) error {
	uid, gid, err := x.ids(hdr)
	if err != nil {
		return err
	}
	if _, err := x.prepare(hdr, name, false); err != nil {
		return err
	}
	// O_EXCL: the name was just cleared, so this can never open an existing file or follow a
	// symlink planted at the final component.
	f, err := x.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return x.entryErr(hdr, "create", err)
	}
	n, err := io.Copy(f, r)
	if err == nil && x.opts.chown {
		err = chownErr(f.Chown(uid, gid))
	}
	if err == nil {
		err = f.Chmod(mode(hdr))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("layer entry %q: writing: %w", hdr.Name, err)
	}
	x.stats.Files++
	x.stats.Bytes += n
	return x.setTimes(hdr, name)
}

func (x *extractor) mkdir(hdr *tar.Header, name string) error {
	uid, gid, err := x.ids(hdr)
	if err != nil {
		return err
	}
	kept, err := x.prepare(hdr, name, true)
	if err != nil {
		return err
	}
	if !kept {
		// Owner-only until finalize sets the real mode, so a read-only directory does not block
		// its own children.
		if err := x.root.Mkdir(name, 0o700); err != nil {
			return x.entryErr(hdr, "mkdir", err)
		}
	}
	if x.opts.chown {
		if err := x.root.Lchown(name, uid, gid); err != nil {
			return chownErr(err)
		}
	}
	x.dirs[name] = true
	atime, mtime := times(hdr)
	x.meta[name] = dirMeta{mode: mode(hdr), atime: atime, mtime: mtime}
	return nil
}

func (x *extractor) rootDir(hdr *tar.Header) error {
	uid, gid, err := x.ids(hdr)
	if err != nil {
		return err
	}
	if x.opts.chown {
		if err := x.root.Lchown(".", uid, gid); err != nil {
			return chownErr(err)
		}
	}
	atime, mtime := times(hdr)
	x.meta["."] = dirMeta{mode: mode(hdr), atime: atime, mtime: mtime}
	return nil
}

func (x *extractor) symlink(hdr *tar.Header, name string) error {
	if hdr.Linkname == "" {
		return invalid(hdr, "symlink with an empty target")
	}
	uid, gid, err := x.ids(hdr)
	if err != nil {
		return err
	}
	if _, err := x.prepare(hdr, name, false); err != nil {
		return err
	}
	// The target is stored verbatim: it is only ever resolved inside the sandbox's own root
	// (and by os.Root here, which refuses to leave this one).
	if err := x.root.Symlink(hdr.Linkname, name); err != nil {
		return x.entryErr(hdr, "symlink", err)
	}
	if x.opts.chown {
		if err := x.root.Lchown(name, uid, gid); err != nil {
			return chownErr(err)
		}
	}
	x.stats.Files++
	return x.setTimes(hdr, name)
}

func (x *extractor) hardlink(hdr *tar.Header, name string) error {
	target, err := cleanName(hdr.Linkname)
	if err != nil {
		return invalid(hdr, "hard link target %q: %v", hdr.Linkname, err)
	}
	if target == "." || target == name {
		return invalid(hdr, "hard link to %q", hdr.Linkname)
	}
	if _, err := x.prepare(hdr, name, false); err != nil {
		return err
	}
	if err := x.root.Link(target, name); err != nil {
		if errors.Is(err, fs.ErrPermission) {
			return invalid(hdr, "hard link to %q: %v", hdr.Linkname, err)
		}
		return x.entryErr(hdr, "link to "+hdr.Linkname, err)
	}
	x.stats.Files++
	return nil
}

func (x *extractor) whiteout(hdr *tar.Header, target string) error {
	if err := x.removeAll(hdr, target); err != nil {
		return err
	}
	return nil
}

// opaque hides everything lower layers put in dir, keeping what this layer wrote there (the
// marker may come before or after those entries).
func (x *extractor) opaque(hdr *tar.Header, dir string) error {
	fi, err := x.root.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return x.entryErr(hdr, "lstat", err)
	}
	if !fi.IsDir() {
		return invalid(hdr, "opaque marker in %q, which is not a directory", dir)
	}
	if dir != "." {
		x.mark(dir)
	}
	return x.clearLower(hdr, dir)
}

func (x *extractor) clearLower(hdr *tar.Header, dir string) error {
	d, err := x.root.Open(dir)
	if err != nil {
		return x.entryErr(hdr, "open", err)
	}
	ents, err := d.ReadDir(-1)
	d.Close()
	if err != nil {
		return x.entryErr(hdr, "readdir", err)
	}
	for _, e := range ents {
		p := path.Join(dir, e.Name())
		switch {
		case !x.written[p]:
			if err := x.removeAll(hdr, p); err != nil {
				return err
			}
		case e.IsDir():
			if err := x.clearLower(hdr, p); err != nil {
				return err
			}
		}
	}
	return nil
}

// setTimes sets atime/mtime on name itself, never on what a symlink points to.
func (x *extractor) setTimes(hdr *tar.Header, name string) error {
	atime, mtime := times(hdr)
	return x.lutimes(hdr, name, atime, mtime)
}

func (x *extractor) lutimes(hdr *tar.Header, name string, atime, mtime time.Time) error {
	d, err := x.root.Open(path.Dir(name))
	if err != nil {
		return x.entryErr(hdr, "open parent", err)
	}
	defer d.Close()
	base := path.Base(name)
	ts := []unix.Timespec{unix.NsecToTimespec(atime.UnixNano()), unix.NsecToTimespec(mtime.UnixNano())}
	sc, err := d.SyscallConn()
	if err != nil {
		return err
	}
	var uerr error
	if err := sc.Control(func(fd uintptr) {
		uerr = unix.UtimesNanoAt(int(fd), base, ts, unix.AT_SYMLINK_NOFOLLOW)
	}); err != nil {
		return err
	}
	if uerr != nil {
		return x.entryErr(hdr, "utimes", uerr)
	}
	return nil
}

// finalize applies directory modes and times, deepest first, once no more children come.
func (x *extractor) finalize() error {
	names := make([]string, 0, len(x.meta))
	for n := range x.meta {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		di, dj := depth(names[i]), depth(names[j])
		if di != dj {
			return di > dj
		}
		return names[i] < names[j]
	})
	for _, n := range names {
		m := x.meta[n]
		hdr := &tar.Header{Name: n}
		fi, err := x.root.Lstat(n)
		if err != nil || !fi.IsDir() {
			// Removed or replaced by a later layer, or reached through a symlink: nothing to set.
			continue
		}
		if err := x.root.Chmod(n, m.mode); err != nil {
			return x.entryErr(hdr, "chmod", err)
		}
		atime := m.atime
		if atime.IsZero() {
			atime = m.mtime
		}
		if n == "." {
			if err := x.root.Chtimes(".", atime, m.mtime); err != nil {
				return x.entryErr(hdr, "utimes", err)
			}
			continue
		}
		if err := x.lutimes(hdr, n, atime, m.mtime); err != nil {
			return err
		}
	}
	return nil
}

func depth(p string) int {
	if p == "." {
		return 0
	}
	return strings.Count(p, "/") + 1
}
