package nsinit

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Code runs as this user; the files API and the workdir belong to it.
const (
	CodeUID  = 1000
	CodeGID  = 1000
	CodeUser = "sandbox"
)

// hostTop are the top-level host paths a host-image root takes: symlinks are recreated (a
// merged-/usr host), directories bound read-only (a split one).
var hostTop = []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"}

// Paths masked in /proc and /sys (runc's defaults): files get /dev/null, directories an
// empty read-only tmpfs.
var maskedPaths = []string{
	"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
	"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
	"/sys/firmware", "/sys/devices/virtual/powercap",
}

// readonlyPaths are made read-only inside /proc.
var readonlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}

// hostDevices are bound from the host /dev: mknod is not possible in a user namespace.
var hostDevices = []string{"null", "zero", "full", "random", "urandom", "tty"}

type mountErr struct {
	op, target string
	err        error
}

func (e *mountErr) Error() string { return e.op + " " + e.target + ": " + e.err.Error() }
func (e *mountErr) Unwrap() error { return e.err }

func mount(source, target, fstype string, flags uintptr, data string) error {
	if err := unix.Mount(source, target, fstype, flags, data); err != nil {
		return &mountErr{op: "mount " + fstype + " " + source, target: target, err: err}
	}
	return nil
}

// setRO makes every mount at target read-only, nosuid and nodev (recursive: submounts too).
// mount_setattr(AT_RECURSIVE) reaches submounts, which MS_REMOUNT would not, and leaves the
// flags the kernel locks in a user namespace (atime, noexec) as they are.
func setRO(target string, recursive bool) error {
	flags := 0
	if recursive {
		flags = unix.AT_RECURSIVE
	}
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if err := unix.MountSetattr(-1, target, uint(flags), attr); err != nil {
		return &mountErr{op: "mount_setattr ro", target: target, err: err}
	}
	return nil
}

// buildRoot assembles the sandbox root under root (a host path inside our private mount
// namespace); it returns once everything is mounted, before pivot_root. Every path below root
// is resolved inside it (inroot.go): an image's symlinks never lead init to the host.
func buildRoot(cfg *Config, root string) error {
	if err := mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return err
	}
	if err := mount("tmpfs", root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=1m,mode=0755"); err != nil {
		return err
	}
	r, err := openInRoot(root)
	if err != nil {
		return err
	}
	defer r.close()
	// The runtime's own directory: the agent's socket, the writable tmpfs, the cgroup views.
	// 0700 and owned by the sandbox's root, so the code's uid cannot even look inside. Made
	// first, never taken from an image.
	if err := r.mkdir(AirlockDir, 0o700, false); err != nil {
		return err
	}
	switch cfg.RootKind {
	case RootHost:
		if err := hostRoot(r, cfg.EtcDir); err != nil {
			return err
		}
	case RootDir:
		if err := dirRoot(r, cfg.RootSource, path.Clean(cfg.Workdir)); err != nil {
			return err
		}
	}
	// An image's own /root (or a symlink there) is left as the image has it.
	for _, d := range []string{"/proc", "/dev", "/sys", "/tmp", "/run", "/var"} {
		if err := r.mkdir(d, 0o755, true); err != nil {
			return err
		}
	}
	if err := r.mkdir("/root", 0o700, true); err != nil {
		return err
	}
	for _, d := range []string{"run", "rw", "cgroup"} {
		if err := r.mkdir(path.Join(AirlockDir, d), 0o700, false); err != nil {
			return err
		}
	}
	if err := r.mount(filepath.Join(cfg.SessionDir, "run"), RunDir, "", unix.MS_BIND, ""); err != nil {
		return err
	}
	if err := writable(cfg, r); err != nil {
		return err
	}
	if err := devices(r); err != nil {
		return err
	}
	if err := procSys(r); err != nil {
		return err
	}
	if err := bindResolvConf(cfg, r); err != nil { // resolv.go
		return err
	}
	return cgroupViews(cfg, root)
}

// hostRoot fills the root tmpfs from the host: /usr read-only, the top-level links or
// directories, and etcDir (the host's copy of the chosen host files and the generated ones)
// as /etc, read-only, in one bind.
func hostRoot(r *inRoot, etcDir string) error {
	if err := r.mkdir("/usr", 0o755, false); err != nil {
		return err
	}
	if err := r.bindRO("/usr", "/usr"); err != nil {
		return err
	}
	for _, name := range hostTop {
		if err := mirror(r, "/"+name, "/"+name); err != nil {
			return err
		}
	}
	if err := r.mkdir("/etc", 0o755, false); err != nil {
		return err
	}
	if err := r.bindRO(etcDir, "/etc"); err != nil {
		return err
	}
	if err := r.mkdir("/var", 0o755, false); err != nil {
		return err
	}
	return r.symlink("../tmp", "/var/tmp")
}

// mirror makes the sandbox path dst look like the host path src: the same symlink, a
// read-only bind of a directory or file, or nothing when src does not exist. src is opened
// without following it and bound through its fd, so what was inspected is what is bound.
func mirror(r *inRoot, src, dst string) error {
	fd, err := unix.Open(src, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return &os.PathError{Op: "open", Path: src, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &os.PathError{Op: "stat", Path: src, Err: err}
	}
	if err := r.mkdirAll(path.Dir(dst), 0o755); err != nil {
		return err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(fd, "", buf)
		if err != nil {
			return &os.PathError{Op: "readlink", Path: src, Err: err}
		}
		return r.symlink(string(buf[:n]), dst)
	case unix.S_IFDIR:
		if err := r.mkdir(dst, 0o755, false); err != nil {
			return err
		}
	case unix.S_IFREG:
		if err := r.create(dst, nil, 0o644, false); err != nil {
			return err
		}
	default:
		return nil
	}
	return r.bindRO(fdPath(fd), dst)
}

const hostsFile = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"

// GeneratedEtc returns the /etc files this runtime writes: passwd and group (the image's own,
// when given, with the sandbox user added if missing), hosts, and an empty resolv.conf (under
// egress deny there is no resolver to ask).
func GeneratedEtc(imagePasswd, imageGroup []byte, workdir string) map[string][]byte {
	passwd := imagePasswd
	if passwd == nil {
		passwd = []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
	}
	group := imageGroup
	if group == nil {
		group = []byte("root:x:0:\ntty:x:5:\nnogroup:x:65534:\n")
	}
	return map[string][]byte{
		"passwd":      addEntry(passwd, CodeUID, fmt.Sprintf("%s:x:%d:%d:sandbox:%s:/bin/sh", CodeUser, CodeUID, CodeGID, workdir)),
		"group":       addEntry(group, CodeGID, fmt.Sprintf("%s:x:%d:", CodeUser, CodeGID)),
		"hosts":       []byte(hostsFile),
		"resolv.conf": nil,
		"nsswitch.conf": []byte("passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n" +
			"networks: files\nprotocols: files\nservices: files\n"),
	}
}

// addEntry appends line to a passwd/group file unless an entry already has id in its third field.
func addEntry(file []byte, id int, line string) []byte {
	want := strconv.Itoa(id)
	for _, l := range strings.Split(string(file), "\n") {
		if f := strings.Split(l, ":"); len(f) > 2 && f[2] == want {
			return file
		}
	}
	out := append([]byte(nil), file...)
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	return append(out, line+"\n"...)
}

// dirRoot fills the root tmpfs from an image directory: every top-level entry bound read-only
// (symlinks recreated), except the directories this runtime mounts itself. Nothing in the
// image is modified: a user-namespace overlay could not copy up files owned by unmapped ids.
// /etc/passwd, group, hosts and resolv.conf are replaced by generated files bound over them.
// The image's own symlinks (at /etc, in it, anywhere) resolve inside the root, as they will
// for the sandbox.
func dirRoot(r *inRoot, src, workdir string) error {
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("root source %s is not a directory", src)
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	own := map[string]bool{"proc": true, "dev": true, "sys": true, "tmp": true, strings.TrimPrefix(AirlockDir, "/"): true}
	for _, e := range entries {
		if own[e.Name()] {
			continue
		}
		if err := mirror(r, filepath.Join(src, e.Name()), "/"+e.Name()); err != nil {
			return err
		}
	}
	if fd, err := r.open("/etc", unix.O_PATH|unix.O_DIRECTORY); err == nil {
		unix.Close(fd)
	} else if _, lerr := r.lstat("/etc"); errors.Is(lerr, unix.ENOENT) {
		if err := r.mkdir("/etc", 0o755, false); err != nil {
			return err
		}
	} else {
		return fmt.Errorf("the image's /etc does not lead to a directory inside the image (its symlinks resolve inside the image, never on the host): %w", err)
	}
	gen := path.Join(AirlockDir, "etc")
	if err := r.mkdir(gen, 0o755, false); err != nil {
		return err
	}
	for name, content := range GeneratedEtc(r.readFile("/etc/passwd"), r.readFile("/etc/group"), workdir) {
		target := "/etc/" + name
		if err := r.create(path.Join(gen, name), content, 0o644, false); err != nil {
			return err
		}
		// A missing file is created when /etc is ours (the image had none); an image's /etc
		// is read-only and only existing regular files can be covered.
		st, err := r.lstat(target)
		switch {
		case errors.Is(err, unix.ENOENT):
			if err := r.create(target, content, 0o644, false); err != nil && !errors.Is(err, unix.EROFS) {
				return err
			}
			continue
		case err != nil:
			return err
		case st.Mode&unix.S_IFMT != unix.S_IFREG:
			continue
		}
		if err := r.mount(filepath.Join(r.host, gen, name), target, "", unix.MS_BIND, ""); err != nil {
			return err
		}
		if err := r.setRO(target, false); err != nil {
			return err
		}
	}
	return nil
}

// runtimeDirs are where a workdir must not lead, through the image's symlinks or not: the
// runtime mounts them itself.
var runtimeDirs = []string{"/proc", "/dev", "/sys", "/tmp", AirlockDir}

// writable mounts the tmpfs whose size is the disk limit and binds its parts at the workdir
// and /tmp: a write past the limit fails with ENOSPC.
func writable(cfg *Config, r *inRoot) error {
	if err := r.mount("tmpfs", RWDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size="+strconv.FormatInt(cfg.DiskBytes, 10)+",mode=0755"); err != nil {
		return err
	}
	rw := filepath.Join(r.host, RWDir) // made by this runtime, never from an image
	ws, tmp := filepath.Join(rw, "workspace"), filepath.Join(rw, "tmp")
	if err := os.Mkdir(ws, 0o755); err != nil {
		return err
	}
	if err := os.Chown(ws, CodeUID, CodeGID); err != nil {
		return err
	}
	if err := os.Mkdir(tmp, 0o777); err != nil {
		return err
	}
	if err := unix.Chmod(tmp, 0o1777); err != nil {
		return err
	}
	if cfg.Restore != "" { // restore.go
		if err := restoreSnapshot(cfg.Restore, rw); err != nil {
			return err
		}
	}
	wd := path.Clean(cfg.Workdir)
	if err := r.mkdirAll(wd, 0o755); err != nil {
		if errors.Is(err, unix.EROFS) {
			return fmt.Errorf("workdir %s does not exist in the image and cannot be created inside one of its read-only directories: %w", cfg.Workdir, err)
		}
		return fmt.Errorf("workdir %s: %w", cfg.Workdir, err)
	}
	fd, err := r.open(wd, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return fmt.Errorf("workdir %s: %w", cfg.Workdir, err)
	}
	defer unix.Close(fd)
	real, err := r.resolved(fd)
	if err != nil {
		return fmt.Errorf("workdir %s: %w", cfg.Workdir, err)
	}
	for _, d := range append([]string{"/"}, runtimeDirs...) {
		if real == d || (d != "/" && strings.HasPrefix(real, d+"/")) {
			return fmt.Errorf("workdir %s leads through the image's symlinks to %s, a directory the runtime owns (%s)", cfg.Workdir, real, d)
		}
	}
	if err := r.mountFD(ws, fd, wd, "", unix.MS_BIND, ""); err != nil {
		return err
	}
	return r.mount(tmp, "/tmp", "", unix.MS_BIND, "")
}

// devices builds a minimal /dev: host device nodes bound in, a private devpts, /dev/shm.
func devices(r *inRoot) error {
	if err := r.mount("tmpfs", "/dev", "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "size=64k,mode=0755"); err != nil {
		return err
	}
	for _, name := range hostDevices {
		p := "/dev/" + name
		if err := r.create(p, nil, 0o666, false); err != nil {
			return err
		}
		if err := r.mount("/dev/"+name, p, "", unix.MS_BIND, ""); err != nil {
			return err
		}
	}
	if err := r.mkdir("/dev/pts", 0o755, false); err != nil {
		return err
	}
	if err := r.mount("devpts", "/dev/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5"); err != nil {
		return err
	}
	if err := r.mkdir("/dev/shm", 0o1777, false); err != nil {
		return err
	}
	if err := r.mount("shm", "/dev/shm", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=64m,mode=1777"); err != nil {
		return err
	}
	for name, target := range map[string]string{
		"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2",
	} {
		if err := r.symlink(target, "/dev/"+name); err != nil {
			return err
		}
	}
	return nil
}

// procSys mounts a fresh /proc (processes of other users hidden) and a read-only /sys, with
// runc's masked and read-only paths.
func procSys(r *inRoot) error {
	if err := r.mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "hidepid=invisible"); err != nil {
		return err
	}
	// sysfs in a user namespace needs a network namespace of our own (we have one); a host
	// whose /sys is partly hidden refuses it, and /sys is then left empty rather than failing.
	sysErr := r.mount("sysfs", "/sys", "sysfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC|unix.MS_RDONLY, "")
	for _, p := range readonlyPaths {
		fd, err := r.open(p, 0)
		if err != nil {
			continue
		}
		err = r.mountFD(fdPath(fd), fd, p, "", unix.MS_BIND|unix.MS_REC, "")
		unix.Close(fd)
		if err != nil {
			return err
		}
		if err := r.setRO(p, true); err != nil {
			return err
		}
	}
	for _, p := range maskedPaths {
		if sysErr != nil && strings.HasPrefix(p, "/sys/") {
			continue
		}
		st, err := r.lstat(p)
		if err != nil {
			continue
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			err = r.mount("tmpfs", p, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=0,mode=0555")
		} else {
			err = r.mount(filepath.Join(r.host, "dev", "null"), p, "", unix.MS_BIND, "")
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// cgroupViews mounts the hierarchies the agent makes per-exec cgroups in. They are mounted
// after the cgroup namespace was unshared, so their root is this sandbox's cgroup.
func cgroupViews(cfg *Config, root string) error {
	if cfg.CgroupVersion == 2 {
		return nil // the agent's view is FDCgroup
	}
	for dir, ctrl := range map[string]string{FreezerDir: "freezer", MemoryDir: "memory", PidsDir: "pids"} {
		d := filepath.Join(root, dir)
		if err := os.Mkdir(d, 0o700); err != nil {
			return err
		}
		if err := mount("cgroup", d, "cgroup", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ctrl); err != nil {
			return err
		}
	}
	return nil
}

// pivot makes root the filesystem root, detaches the host's, and makes the root read-only.
func pivot(root string) error {
	if err := os.Chdir(root); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return &mountErr{op: "pivot_root", target: root, err: err}
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return &mountErr{op: "umount old root", target: root, err: err}
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	return setRO("/", false)
}
