//go:build linux

package agent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
	"github.com/airlock-sandbox/airlock/token"
)

// maxListEntries bounds one directory listing.
const maxListEntries = 100_000

// files is the files API. Every access goes through os.Root opened once on FilesRoot, so `..`,
// absolute symlinks and symlinks swapped mid-walk cannot leave the root. Denied paths are
// checked twice: lexically on the request, and on where the opened directory or file really is
// (/proc/self/fd), because a relative symlink inside the root may lead into a denied subtree.
// Operations on a final component (mkdir, remove, rename, write's replace) act on an already
// verified parent directory, never on a path that is resolved again.
type files struct {
	root     *os.Root
	rootReal string
	deny     []string
	uid, gid int
	chown    bool
}

func newFiles(cfg *Config) (*files, error) {
	real, err := filepath.EvalSymlinks(cfg.FilesRoot)
	if err != nil {
		return nil, fmt.Errorf("%w: agent config filesRoot: %v", sbtypes.ErrInvalid, err)
	}
	root, err := os.OpenRoot(real)
	if err != nil {
		return nil, fmt.Errorf("%w: agent config filesRoot: %v", sbtypes.ErrInvalid, err)
	}
	f := &files{root: root, rootReal: real, deny: slices.Clone(cfg.DenyPaths), uid: int(cfg.CodeUID), gid: int(cfg.CodeGID)}
	f.chown = os.Geteuid() == 0 && !(cfg.CodeUID == 0 && cfg.CodeGID == 0)
	return f, nil
}

func (f *files) close() { f.root.Close() }

// clean validates an API path and returns it cleaned (absolute, sandbox view) and relative to
// the root ("." for the root itself).
func (f *files) clean(field, p string) (abs, rel string, err error) {
	switch {
	case p == "":
		return "", "", fmt.Errorf("%w: %s is empty", sbtypes.ErrInvalid, field)
	case !strings.HasPrefix(p, "/"):
		return "", "", fmt.Errorf("%w: %s %q is not absolute", sbtypes.ErrInvalid, field, p)
	case strings.IndexByte(p, 0) >= 0:
		return "", "", fmt.Errorf("%w: %s contains a NUL byte", sbtypes.ErrInvalid, field)
	}
	for _, c := range strings.Split(p, "/") {
		if c == ".." {
			return "", "", fmt.Errorf("%w: %s %q contains '..'; give the path without it", sbtypes.ErrInvalid, field, p)
		}
	}
	abs = path.Clean(p)
	if err := f.allowed(abs); err != nil {
		return "", "", err
	}
	rel = strings.TrimPrefix(abs, "/")
	if rel == "" {
		rel = "."
	}
	return abs, rel, nil
}

// allowed refuses abs if it is a denied path or below one.
func (f *files) allowed(abs string) error {
	for _, d := range f.deny {
		if abs == d || strings.HasPrefix(abs, d+"/") {
			return fmt.Errorf("%w: %s is inside %s, which the files API does not serve", sbtypes.ErrForbidden, abs, d)
		}
	}
	return nil
}

// holdsDenied refuses a recursive operation on abs when a denied path lies below it.
func (f *files) holdsDenied(abs string) error {
	for _, d := range f.deny {
		if abs == "/" || strings.HasPrefix(d, abs+"/") {
			return fmt.Errorf("%w: %s contains %s, which the files API does not serve", sbtypes.ErrForbidden, abs, d)
		}
	}
	return nil
}

// where returns the sandbox path an open file really is at, refusing denied locations.
func (f *files) where(file *os.File) (string, error) {
	target, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(int(file.Fd())))
	if err != nil {
		// Fail closed: without /proc the location cannot be verified.
		return "", fmt.Errorf("%w: cannot verify where %s is: %v", sbtypes.ErrRefused, file.Name(), err)
	}
	if strings.HasSuffix(target, " (deleted)") {
		return "", fmt.Errorf("%w: %s was removed", sbtypes.ErrNotFound, file.Name())
	}
	var sp string
	switch {
	case f.rootReal == "/":
		sp = target
	case target == f.rootReal:
		sp = "/"
	case strings.HasPrefix(target, f.rootReal+"/"):
		sp = strings.TrimPrefix(target, f.rootReal)
	default:
		return "", fmt.Errorf("%w: %s resolves outside the files root", sbtypes.ErrForbidden, file.Name())
	}
	if err := f.allowed(sp); err != nil {
		return "", err
	}
	return sp, nil
}

// dir opens rel as a directory, verified, and returns a Root on it with its sandbox path.
func (f *files) dir(rel string) (*os.Root, *os.File, string, error) {
	sub, err := f.root.OpenRoot(rel)
	if err != nil {
		return nil, nil, "", f.fsError(err)
	}
	d, err := sub.Open(".")
	if err != nil {
		sub.Close()
		return nil, nil, "", f.fsError(err)
	}
	sp, err := f.where(d)
	if err != nil {
		d.Close()
		sub.Close()
		return nil, nil, "", err
	}
	return sub, d, sp, nil
}

// parentOf opens the verified parent directory of rel (which is not ".").
type parentDir struct {
	root *os.Root
	file *os.File
	base string
	sp   string // the target's real sandbox path: verified parent + base
}

func (p *parentDir) close() {
	p.file.Close()
	p.root.Close()
}

func (f *files) parent(field, rel string) (*parentDir, error) {
	if rel == "." {
		return nil, fmt.Errorf("%w: %s: not allowed on /", sbtypes.ErrInvalid, field)
	}
	dir, base := path.Split(rel)
	if dir == "" {
		dir = "."
	}
	sub, d, sp, err := f.dir(strings.TrimSuffix(dir, "/"))
	if err != nil {
		return nil, err
	}
	target := path.Join(sp, base)
	if err := f.allowed(target); err != nil {
		d.Close()
		sub.Close()
		return nil, err
	}
	return &parentDir{root: sub, file: d, base: base, sp: target}, nil
}

// The refusals of os.Root of its own (not the kernel's): unexported errors.New values in package
// os with no sentinel to match, so their text is the only signal; rootRefusal reads it here alone
// and TestRootRefusal fails should a Go release change it.
const (
	rootOther  = iota
	rootNotDir // "not a directory": a root that is not a directory
	rootEscape // "path escapes from parent": a name or symlink leading out of the root
)

func rootRefusal(err error) int {
	switch err.Error() {
	case "not a directory":
		return rootNotDir
	case "path escapes from parent":
		return rootEscape
	}
	return rootOther
}

// fsError maps a filesystem error to a sandbox error class with a message that says what.
func (f *files) fsError(err error) error {
	var pe *fs.PathError
	msg := err.Error()
	if errors.As(err, &pe) {
		// Paths in messages are sandbox paths: the host's layout is none of the caller's business.
		p := pe.Path
		if f.rootReal != "/" {
			p = strings.TrimPrefix(p, f.rootReal)
		}
		p = path.Clean("/" + p)
		msg = pe.Op + " " + p + ": " + pe.Err.Error()
		switch rootRefusal(pe.Err) {
		case rootNotDir:
			return fmt.Errorf("%w: %s", sbtypes.ErrInvalid, msg)
		case rootEscape:
			return fmt.Errorf("%w: %s (the files API is confined to its root; absolute symlinks are not followed)", sbtypes.ErrForbidden, msg)
		}
	}
	switch {
	case errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("%w: %s (not a directory)", sbtypes.ErrInvalid, msg)
	case errors.Is(err, syscall.EISDIR):
		return fmt.Errorf("%w: %s (is a directory)", sbtypes.ErrInvalid, msg)
	case errors.Is(err, syscall.ENOTEMPTY):
		return fmt.Errorf("%w: %s (directory not empty; remove it with recursive)", sbtypes.ErrConflict, msg)
	}
	return fmt.Errorf("%w: %s", classify(err), msg)
}

func fileType(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "file"
	case m.IsDir():
		return "dir"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	}
	return "other"
}

func info(sp string, fi fs.FileInfo, target string) sbtypes.FileInfo {
	return sbtypes.FileInfo{
		Name:    path.Base(sp),
		Path:    sp,
		Size:    fi.Size(),
		Mode:    uint32(fi.Mode().Perm()),
		Type:    fileType(fi.Mode()),
		ModTime: fi.ModTime().UTC(),
		Target:  target,
	}
}

// lstat describes base in r, with its target when it is a symlink.
func (f *files) lstat(r *os.Root, base, sp string) (sbtypes.FileInfo, error) {
	fi, err := r.Lstat(base)
	if err != nil {
		return sbtypes.FileInfo{}, f.fsError(err)
	}
	var target string
	if fi.Mode()&fs.ModeSymlink != 0 {
		target, _ = r.Readlink(base)
	}
	return info(sp, fi, target), nil
}

func (s *server) filesRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/files", s.authed(token.Execute, s.readFile))
	mux.HandleFunc("PUT /v1/files", s.authed(token.Execute, s.writeFile))
	mux.HandleFunc("GET /v1/files/stat", s.authed(token.Execute, s.statFile))
	mux.HandleFunc("GET /v1/files/list", s.authed(token.Execute, s.listDir))
	mux.HandleFunc("POST /v1/files/mkdir", s.authed(token.Execute, s.mkdir))
	mux.HandleFunc("POST /v1/files/remove", s.authed(token.Execute, s.remove))
	mux.HandleFunc("POST /v1/files/rename", s.authed(token.Execute, s.rename))
}

func queryInt(r *http.Request, name string, def int64) (int64, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%w: query parameter %s=%q is not a non-negative integer", sbtypes.ErrInvalid, name, v)
	}
	return n, nil
}

// readFile streams a byte range of a regular file. FIFOs, devices and sockets are refused
// without blocking: the open is non-blocking and the type is checked on the open file.
func (s *server) readFile(w http.ResponseWriter, r *http.Request) {
	f := s.files
	if err := onlyQuery(r, "path", "offset", "length"); err != nil {
		writeError(w, err)
		return
	}
	abs, rel, err := f.clean("path", r.URL.Query().Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	offset, err := queryInt(r, "offset", 0)
	if err != nil {
		writeError(w, err)
		return
	}
	length, err := queryInt(r, "length", -1)
	if err != nil {
		writeError(w, err)
		return
	}
	if fi, err := f.root.Stat(rel); err != nil {
		writeError(w, f.fsError(err))
		return
	} else if err := regular(abs, fi); err != nil {
		writeError(w, err)
		return
	}
	file, err := f.root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		writeError(w, f.fsError(err))
		return
	}
	defer file.Close()
	fi, err := file.Stat()
	if err != nil {
		writeError(w, f.fsError(err))
		return
	}
	// Checked again on the open file: the name may have been swapped for a FIFO since.
	if err := regular(abs, fi); err != nil {
		writeError(w, err)
		return
	}
	if _, err := f.where(file); err != nil {
		writeError(w, err)
		return
	}
	size := fi.Size()
	if offset > size {
		writeError(w, fmt.Errorf("%w: offset %d is past the end of %s (%d bytes)", sbtypes.ErrInvalid, offset, abs, size))
		return
	}
	n := size - offset
	if length >= 0 && length < n {
		n = length
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	w.WriteHeader(http.StatusOK)
	// A file that shrinks mid-read ends the body short of Content-Length: the client sees an
	// unexpected EOF, never a silently short file.
	_, _ = io.Copy(w, io.NewSectionReader(file, offset, n))
}

func regular(abs string, fi fs.FileInfo) error {
	switch {
	case fi.Mode().IsRegular():
		return nil
	case fi.IsDir():
		return fmt.Errorf("%w: %s is a directory", sbtypes.ErrInvalid, abs)
	}
	return fmt.Errorf("%w: %s is not a regular file (%s); only regular files are read or written", sbtypes.ErrInvalid, abs, fi.Mode().Type())
}

// writeFile replaces a file atomically: a temporary file in the same directory, fsync, rename.
func (s *server) writeFile(w http.ResponseWriter, r *http.Request) {
	f := s.files
	if err := onlyQuery(r, "path", "mode"); err != nil {
		writeError(w, err)
		return
	}
	abs, rel, err := f.clean("path", r.URL.Query().Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	mode := uint64(0o644)
	if v := r.URL.Query().Get("mode"); v != "" {
		mode, err = strconv.ParseUint(v, 8, 32)
		if err != nil || mode > 0o777 {
			writeError(w, fmt.Errorf("%w: query parameter mode=%q is not an octal permission 0..0777", sbtypes.ErrInvalid, v))
			return
		}
	}
	p, err := f.parent("path", rel)
	if err != nil {
		writeError(w, err)
		return
	}
	defer p.close()
	if fi, err := p.root.Lstat(p.base); err == nil && !fi.Mode().IsRegular() && fi.Mode()&fs.ModeSymlink == 0 {
		writeError(w, regular(abs, fi))
		return
	}
	tmp := ".airlock-write-" + newID()
	tf, err := p.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		writeError(w, f.fsError(err))
		return
	}
	err = func() error {
		if err := s.copyIntoMemory(tf, r.Body, abs); err != nil {
			if errors.Is(err, sbtypes.ErrTooLarge) {
				return err
			}
			if errors.Is(err, syscall.ENOSPC) {
				// Name the limit the write ran into: the filesystem's size (the sandbox's disk).
				var st unix.Statfs_t
				if unix.Fstatfs(int(tf.Fd()), &st) == nil {
					return fmt.Errorf("%w: the filesystem of %s holds %d bytes, the sandbox's disk limit (limits.disk), and it is full", f.fsError(err), abs, int64(st.Blocks)*st.Bsize)
				}
			}
			if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EFBIG) || errors.Is(err, syscall.EDQUOT) {
				return f.fsError(err)
			}
			return fmt.Errorf("%w: write %s: %v", sbtypes.ErrRefused, abs, err)
		}
		if err := tf.Chmod(os.FileMode(mode)); err != nil {
			return f.fsError(err)
		}
		if f.chown {
			if err := tf.Chown(f.uid, f.gid); err != nil {
				return f.fsError(err)
			}
		}
		if err := tf.Sync(); err != nil {
			return f.fsError(err)
		}
		if err := tf.Close(); err != nil {
			return f.fsError(err)
		}
		if err := p.root.Rename(tmp, p.base); err != nil {
			return f.fsError(err)
		}
		return p.file.Sync()
	}()
	if err != nil {
		tf.Close()
		_ = p.root.Remove(tmp)
		writeError(w, err)
		return
	}
	fi, err := f.lstat(p.root, p.base, p.sp)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, fi)
}

// uploadReserve is the memory an upload into a memory-backed file system leaves free for the
// agent and the code: an upload that would take it is refused instead of OOM-killing the
// agent, which is its writer.
const uploadReserve = 16 << 20

// memoryRoom is how much of the memory limit is left, and the limit: the cgroup's usage where
// the agent can read it, else the configured limit less what tf's file system holds (the code's
// own memory is then not counted: the OOM killer takes the code first, oom_score_adj).
func (s *server) memoryRoom(tf *os.File) (room, limit int64, ok bool) {
	if room, limit, ok = s.cg.memoryRoom(); ok || s.cfg.MemoryBytes <= 0 {
		return room, limit, ok
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(tf.Fd()), &st); err != nil {
		return 0, 0, false
	}
	used := int64(st.Blocks-st.Bfree) * st.Bsize
	return s.cfg.MemoryBytes - used, s.cfg.MemoryBytes, true
}

// copyIntoMemory copies body into tf. Where tf lives in memory (tmpfs, charged to the
// sandbox's memory cgroup: the local runtime's writable layer), each chunk first needs room in
// the memory limit; an upload that would fill it is refused (ErrTooLarge, naming the limit).
func (s *server) copyIntoMemory(tf *os.File, body io.Reader, abs string) error {
	var st unix.Statfs_t
	if s.cg == nil || unix.Fstatfs(int(tf.Fd()), &st) != nil || st.Type != unix.TMPFS_MAGIC {
		_, err := io.Copy(tf, body)
		return err
	}
	buf := make([]byte, 1<<20)
	for {
		n, rerr := io.ReadFull(body, buf)
		if n > 0 {
			if room, limit, ok := s.memoryRoom(tf); ok && room < int64(n)+uploadReserve {
				return fmt.Errorf("%w: writing %s: the sandbox's files are in its memory (tmpfs) and %d of its %d bytes (limits.memory) are left: the upload would fill them", sbtypes.ErrTooLarge, abs, room, limit)
			}
			if _, err := tf.Write(buf[:n]); err != nil {
				return err
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

func (s *server) statFile(w http.ResponseWriter, r *http.Request) {
	f := s.files
	if err := onlyQuery(r, "path"); err != nil {
		writeError(w, err)
		return
	}
	_, rel, err := f.clean("path", r.URL.Query().Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	if rel == "." {
		sub, d, sp, err := f.dir(".")
		if err != nil {
			writeError(w, err)
			return
		}
		defer sub.Close()
		defer d.Close()
		fi, err := d.Stat()
		if err != nil {
			writeError(w, f.fsError(err))
			return
		}
		writeJSON(w, http.StatusOK, info(sp, fi, ""))
		return
	}
	p, err := f.parent("path", rel)
	if err != nil {
		writeError(w, err)
		return
	}
	defer p.close()
	fi, err := f.lstat(p.root, p.base, p.sp)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, fi)
}

func (s *server) listDir(w http.ResponseWriter, r *http.Request) {
	f := s.files
	if err := onlyQuery(r, "path"); err != nil {
		writeError(w, err)
		return
	}
	_, rel, err := f.clean("path", r.URL.Query().Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	sub, d, sp, err := f.dir(rel)
	if err != nil {
		writeError(w, err)
		return
	}
	defer sub.Close()
	defer d.Close()
	names, err := d.Readdirnames(maxListEntries + 1)
	if err != nil && err != io.EOF {
		writeError(w, f.fsError(err))
		return
	}
	if len(names) > maxListEntries {
		writeError(w, fmt.Errorf("%w: %s has more than %d entries", sbtypes.ErrTooLarge, sp, maxListEntries))
		return
	}
	slices.Sort(names)
	out := make([]sbtypes.FileInfo, 0, len(names))
	for _, n := range names {
		fi, err := f.lstat(sub, n, path.Join(sp, n))
		if err != nil {
			if errors.Is(err, sbtypes.ErrNotFound) {
				continue // removed since the listing was read
			}
			writeError(w, err)
			return
		}
		out = append(out, fi)
	}
	writeJSON(w, http.StatusOK, out)
}

// testHookMkdir, when set (tests), runs right after mkdir made name in parent and before the
// agent opens it: where code racing the agent would swap something else in.
var testHookMkdir func(parent *os.Root, name string)

// mkdirFresh makes name in parent with mode, owned by the code's uid/gid; an error wrapping
// fs.ErrExist when name exists. sp is the sandbox path, for messages.
//
// Code that can write to parent can rename and replace its entries at any moment, so neither
// the name nor whatever is opened by it later is necessarily the directory mkdir made: a
// chmod/chown through either could hand the code a directory it swapped in. Instead the
// directory is made inside a staging directory only the agent can change, opened there (no
// swap possible), renamed into place, and set up through the descriptor held since.
func (f *files) mkdirFresh(parent *os.Root, name, sp string, mode os.FileMode) error {
	if _, err := parent.Lstat(name); err == nil {
		return fmt.Errorf("mkdir %s: %w", sp, fs.ErrExist)
	}
	pf, err := parent.Open(".")
	if err != nil {
		return f.fsError(err)
	}
	defer pf.Close()
	pfd := int(pf.Fd())
	fail := func(err error) error { return fmt.Errorf("%w: mkdir %s: %v", classify(err), sp, err) }
	stage := ".airlock-mkdir-" + newID()
	if err := unix.Mkdirat(pfd, stage, 0o700); err != nil {
		return fail(err)
	}
	if testHookMkdir != nil {
		testHookMkdir(parent, stage)
	}
	// By name: if the stage was swapped, what goes is an empty directory the code could have
	// removed itself; rmdir removes nothing else.
	defer unix.Unlinkat(pfd, stage, unix.AT_REMOVEDIR)
	sfd, err := unix.Openat(pfd, stage, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%w: mkdir %s: the directory being made was replaced (%v); try again", sbtypes.ErrConflict, sp, err)
	}
	defer unix.Close(sfd)
	var st unix.Stat_t
	if err := unix.Fstat(sfd, &st); err != nil {
		return fail(err)
	}
	// Whatever it is, once nobody but the agent may change its entries, what is made inside
	// stays what was made.
	if st.Uid != uint32(os.Geteuid()) || st.Mode&0o022 != 0 {
		return fmt.Errorf("%w: mkdir %s: the directory being made was replaced; try again", sbtypes.ErrConflict, sp)
	}
	if err := unix.Mkdirat(sfd, "d", 0o700); err != nil {
		return fail(err)
	}
	dfd, err := unix.Openat(sfd, "d", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		_ = unix.Unlinkat(sfd, "d", unix.AT_REMOVEDIR)
		return fail(err)
	}
	defer unix.Close(dfd)
	err = unix.Renameat2(sfd, "d", pfd, name, unix.RENAME_NOREPLACE)
	if err == unix.EINVAL {
		// A filesystem without RENAME_NOREPLACE: rename(2) replaces only an empty directory.
		err = unix.Renameat(sfd, "d", pfd, name)
	}
	if err != nil {
		_ = unix.Unlinkat(sfd, "d", unix.AT_REMOVEDIR)
		if err == unix.EEXIST || err == unix.ENOTEMPTY || err == unix.ENOTDIR || err == unix.EISDIR {
			return fmt.Errorf("mkdir %s: %w", sp, fs.ErrExist)
		}
		return fail(err)
	}
	// After the rename: chmod could take away the write permission a directory needs to be
	// moved to another parent (its ".." changes).
	if err := unix.Fchmod(dfd, uint32(mode.Perm())); err != nil {
		return fail(err)
	}
	if f.chown {
		if err := unix.Fchown(dfd, f.uid, f.gid); err != nil {
			return fail(err)
		}
	}
	return nil
}

// mkdir is mkdir -p, one verified directory at a time so no component is resolved twice.
func (s *server) mkdir(w http.ResponseWriter, r *http.Request) {
	f := s.files
	var req wire.MkdirRequest
	if err := readRequest(r, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.Mode == 0 {
		req.Mode = 0o755
	}
	if req.Mode > 0o777 {
		writeError(w, fmt.Errorf("%w: mode %#o is not a permission 0..0777", sbtypes.ErrInvalid, req.Mode))
		return
	}
	_, rel, err := f.clean("path", req.Path)
	if err != nil {
		writeError(w, err)
		return
	}
	cur, d, sp, err := f.dir(".")
	if err != nil {
		writeError(w, err)
		return
	}
	d.Close()
	defer func() { cur.Close() }()
	if rel != "." {
		for _, c := range strings.Split(rel, "/") {
			if c == "" || c == "." {
				continue
			}
			target := path.Join(sp, c)
			if err := f.allowed(target); err != nil {
				writeError(w, err)
				return
			}
			if err := f.mkdirFresh(cur, c, target, os.FileMode(req.Mode)); err != nil && !errors.Is(err, fs.ErrExist) {
				writeError(w, err)
				return
			}
			next, err := cur.OpenRoot(c)
			if err != nil {
				writeError(w, f.fsError(err))
				return
			}
			cur.Close()
			cur = next
			nd, err := cur.Open(".")
			if err != nil {
				writeError(w, f.fsError(err))
				return
			}
			sp, err = f.where(nd)
			nd.Close()
			if err != nil {
				writeError(w, err)
				return
			}
		}
	}
	fi, err := cur.Stat(".")
	if err != nil {
		writeError(w, f.fsError(err))
		return
	}
	writeJSON(w, http.StatusOK, info(sp, fi, ""))
}

func (s *server) remove(w http.ResponseWriter, r *http.Request) {
	f := s.files
	var req wire.RemoveRequest
	if err := readRequest(r, &req); err != nil {
		writeError(w, err)
		return
	}
	_, rel, err := f.clean("path", req.Path)
	if err != nil {
		writeError(w, err)
		return
	}
	p, err := f.parent("path", rel)
	if err != nil {
		writeError(w, err)
		return
	}
	defer p.close()
	fi, err := p.root.Lstat(p.base)
	if err != nil {
		writeError(w, f.fsError(err))
		return
	}
	if req.Recursive && fi.IsDir() {
		if err := f.holdsDenied(p.sp); err != nil {
			writeError(w, err)
			return
		}
		err = p.root.RemoveAll(p.base)
	} else {
		err = p.root.Remove(p.base)
	}
	if err != nil {
		writeError(w, f.fsError(err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) rename(w http.ResponseWriter, r *http.Request) {
	f := s.files
	var req wire.RenameRequest
	if err := readRequest(r, &req); err != nil {
		writeError(w, err)
		return
	}
	_, fromRel, err := f.clean("from", req.From)
	if err != nil {
		writeError(w, err)
		return
	}
	_, toRel, err := f.clean("to", req.To)
	if err != nil {
		writeError(w, err)
		return
	}
	from, err := f.parent("from", fromRel)
	if err != nil {
		writeError(w, err)
		return
	}
	defer from.close()
	to, err := f.parent("to", toRel)
	if err != nil {
		writeError(w, err)
		return
	}
	defer to.close()
	if err := f.holdsDenied(from.sp); err != nil {
		writeError(w, err)
		return
	}
	// renameat on the two verified directory fds: os.Root.Rename would resolve both paths
	// again from the root, and the parents may have been swapped since they were checked.
	if err := unix.Renameat(int(from.file.Fd()), from.base, int(to.file.Fd()), to.base); err != nil {
		writeError(w, f.fsError(&fs.PathError{Op: "rename", Path: req.From + " -> " + req.To, Err: err}))
		return
	}
	fi, err := f.lstat(to.root, to.base, to.sp)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, fi)
}
