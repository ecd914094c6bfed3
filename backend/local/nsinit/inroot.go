package nsinit

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// inRoot resolves sandbox paths inside the root being built, before pivot_root, the way the
// sandbox will see them afterwards: openat2 with RESOLVE_IN_ROOT, so a symlink an image put at
// /etc, /root or in the workdir ("/", "../../var/lib/...") resolves below the root, never on
// the host; RESOLVE_NO_MAGICLINKS refuses /proc/<pid>/fd-style jumps. Mounts go onto the
// opened target through /proc/self/fd/N (what runc and filepath-securejoin do), and files are
// created with *at calls on a parent resolved the same way, never following the last component.
type inRoot struct {
	host string // the root's host path, for messages and for reading back where a path led
	fd   int
}

const resolveInRoot = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS

func openInRoot(host string) (*inRoot, error) {
	fd, err := unix.Open(host, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open root %s: %w", host, err)
	}
	// The root's path as the kernel names it (a state dir below a symlink, /var/run, names
	// it differently): resolved() compares the kernel's names of paths below it.
	real, err := os.Readlink(fdPath(fd))
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("open root %s: %w", host, err)
	}
	return &inRoot{host: real, fd: fd}, nil
}

func (r *inRoot) close() { unix.Close(r.fd) }

// pathErr names the sandbox path (and what it resolved to, when that differs).
func (r *inRoot) pathErr(op, p string, err error) error {
	return &os.PathError{Op: op, Path: p, Err: err}
}

// open resolves p (a sandbox path) and opens it with flags (O_PATH when 0).
func (r *inRoot) open(p string, flags int) (int, error) {
	if flags == 0 {
		flags = unix.O_PATH
	}
	rel := strings.TrimPrefix(path.Clean("/"+p), "/")
	if rel == "" {
		rel = "."
	}
	how := &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Resolve: resolveInRoot}
	fd, err := unix.Openat2(r.fd, rel, how)
	// EAGAIN: a rename or mount raced the in-root walk; the kernel asks for a retry.
	for i := 0; i < 16 && (errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN)); i++ {
		fd, err = unix.Openat2(r.fd, rel, how)
	}
	if err != nil {
		return -1, r.pathErr("open", p, err)
	}
	return fd, nil
}

// resolved is the sandbox path p leads to after its symlinks, read back from the opened fd.
func (r *inRoot) resolved(fd int) (string, error) {
	target, err := os.Readlink(fdPath(fd))
	if err != nil {
		return "", err
	}
	if target == r.host {
		return "/", nil
	}
	rest, ok := strings.CutPrefix(target, r.host+"/")
	if !ok {
		return "", fmt.Errorf("%s is outside the root %s", target, r.host)
	}
	return "/" + rest, nil
}

func fdPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// parent opens p's parent directory inside the root and returns it with p's last component.
func (r *inRoot) parent(p string) (int, string, error) {
	p = path.Clean("/" + p)
	dir, base := path.Split(p)
	if base == "" {
		return -1, "", r.pathErr("open", p, unix.EINVAL)
	}
	fd, err := r.open(dir, unix.O_PATH|unix.O_DIRECTORY)
	return fd, base, err
}

// lstat is fstatat of p's last component without following it.
func (r *inRoot) lstat(p string) (*unix.Stat_t, error) {
	dfd, base, err := r.parent(p)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, r.pathErr("lstat", p, err)
	}
	return &st, nil
}

// mkdir creates the directory p; an existing p (of any type, a symlink included) is left as it
// is when existOK.
func (r *inRoot) mkdir(p string, mode uint32, existOK bool) error {
	dfd, base, err := r.parent(p)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	if err := unix.Mkdirat(dfd, base, mode); err != nil && !(existOK && errors.Is(err, unix.EEXIST)) {
		return r.pathErr("mkdir", p, err)
	}
	return nil
}

// mkdirAll creates p and its missing parents, each resolved inside the root.
func (r *inRoot) mkdirAll(p string, mode uint32) error {
	cur := "/"
	for _, c := range strings.Split(strings.Trim(path.Clean("/"+p), "/"), "/") {
		if c == "" {
			continue
		}
		cur = path.Join(cur, c)
		fd, err := r.open(cur, unix.O_PATH|unix.O_DIRECTORY)
		if err == nil {
			unix.Close(fd)
			continue
		}
		if !errors.Is(err, unix.ENOENT) {
			return err
		}
		if err := r.mkdir(cur, mode, true); err != nil {
			return err
		}
		if fd, err = r.open(cur, unix.O_PATH|unix.O_DIRECTORY); err != nil {
			return fmt.Errorf("%s exists but does not lead to a directory inside the root (a symlink resolves inside it, never on the host): %w", cur, err)
		}
		unix.Close(fd)
	}
	return nil
}

// create makes the file p (never following a symlink at p) and writes content; an existing
// file is an error unless mayExist, when it is truncated and rewritten.
func (r *inRoot) create(p string, content []byte, mode uint32, mayExist bool) error {
	dfd, base, err := r.parent(p)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	flags := unix.O_WRONLY | unix.O_CREAT | unix.O_NOFOLLOW | unix.O_CLOEXEC
	if !mayExist {
		flags |= unix.O_EXCL
	} else {
		flags |= unix.O_TRUNC
	}
	fd, err := unix.Openat(dfd, base, flags, mode)
	if err != nil {
		return r.pathErr("create", p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	_, err = f.Write(content)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// readFile reads the regular file p as the sandbox would see it; nil when it cannot.
func (r *inRoot) readFile(p string) []byte {
	fd, err := r.open(p, unix.O_RDONLY)
	if err != nil {
		return nil
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil
	}
	b, err := io.ReadAll(io.LimitReader(f, 16<<20))
	if err != nil {
		return nil
	}
	return b
}

func (r *inRoot) symlink(target, p string) error {
	dfd, base, err := r.parent(p)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	if err := unix.Symlinkat(target, dfd, base); err != nil {
		return r.pathErr("symlink", p, err)
	}
	return nil
}

// mount mounts source (a host path, or "" for a filesystem) onto the sandbox path target,
// resolved inside the root.
func (r *inRoot) mount(source, target, fstype string, flags uintptr, data string) error {
	fd, err := r.open(target, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return r.mountFD(source, fd, target, fstype, flags, data)
}

func (r *inRoot) mountFD(source string, fd int, target, fstype string, flags uintptr, data string) error {
	if err := unix.Mount(source, fdPath(fd), fstype, flags, data); err != nil {
		return &mountErr{op: "mount " + fstype + " " + source, target: target, err: err}
	}
	return nil
}

// bindRO binds the host path src at target recursively, read-only (see bindRO).
func (r *inRoot) bindRO(src, target string) error {
	if err := r.mount(src, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	return r.setRO(target, true)
}

// setRO is setRO on the sandbox path target.
func (r *inRoot) setRO(target string, recursive bool) error {
	fd, err := r.open(target, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	flags := unix.AT_EMPTY_PATH
	if recursive {
		flags |= unix.AT_RECURSIVE
	}
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if err := unix.MountSetattr(fd, "", uint(flags), attr); err != nil {
		return &mountErr{op: "mount_setattr ro", target: target, err: err}
	}
	return nil
}
