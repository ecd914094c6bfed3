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

// hostEtc are the host /etc entries a host-image sandbox sees, read-only: what dynamic linking,
// TLS roots, time zones, python3, node and bash read. Never the whole of /etc (shadow, machine
// secrets, package-manager credentials in pip.conf or npmrc).
var hostEtc = []string{
	"alternatives", "ssl/certs", "ssl/openssl.cnf", "ca-certificates", "ca-certificates.conf",
	"ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone",
	"protocols", "services", "ethertypes", "rpc", "networks", "gai.conf", "host.conf",
	"mime.types", "magic", "magic.mime", "locale.alias",
	"bash.bashrc", "profile", "inputrc", "debian_version", "os-release", "lsb-release",
	"python3", "perl",
}

// HostEtc lists the host /etc entries (relative to /etc) a host-image sandbox sees.
func HostEtc() []string {
	names := append([]string(nil), hostEtc...)
	// python3.X keeps sitecustomize in /etc/python3.X.
	matches, _ := filepath.Glob("/etc/python3.*")
	for _, m := range matches {
		names = append(names, filepath.Base(m))
	}
	return names
}

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

// bindRO binds src at dst recursively and makes every mount of the copy read-only, nosuid and
// nodev. mount_setattr(AT_RECURSIVE) reaches submounts, which MS_REMOUNT would not, and leaves
// the flags the kernel locks in a user namespace (atime, noexec) as they are.
func bindRO(src, dst string) error {
	if err := mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	return setRO(dst, true)
}

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

// touch creates an empty file to bind a file over.
func touch(p string, mode os.FileMode) error {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	return f.Close()
}

// buildRoot assembles the sandbox root under root (a host path inside our private mount
// namespace); it returns once everything is mounted, before pivot_root.
func buildRoot(cfg *Config, root string) error {
	if err := mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return err
	}
	if err := mount("tmpfs", root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=1m,mode=0755"); err != nil {
		return err
	}
	wd := path.Clean(cfg.Workdir)
	switch cfg.RootKind {
	case RootHost:
		if err := hostRoot(root, cfg.EtcDir); err != nil {
			return err
		}
	case RootDir:
		if err := dirRoot(cfg.RootSource, root, wd); err != nil {
			return err
		}
	}
	for _, d := range []string{"proc", "dev", "sys", "tmp", "root", "run", "var", strings.TrimPrefix(AirlockDir, "/")} {
		if err := mkdirIfMissing(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	// An image's own /root is a read-only bind and keeps the image's mode.
	if err := os.Chmod(filepath.Join(root, "root"), 0o700); err != nil && !errors.Is(err, unix.EROFS) {
		return err
	}
	// The runtime's own directory: the agent's socket, the writable tmpfs, the cgroup views.
	// 0700 and owned by the sandbox's root, so the code's uid cannot even look inside.
	air := filepath.Join(root, AirlockDir)
	if err := os.Chmod(air, 0o700); err != nil {
		return err
	}
	for _, d := range []string{"run", "rw", "cgroup"} {
		if err := mkdirIfMissing(filepath.Join(air, d), 0o700); err != nil {
			return err
		}
	}
	if err := mount(filepath.Join(cfg.SessionDir, "run"), filepath.Join(root, RunDir), "", unix.MS_BIND, ""); err != nil {
		return err
	}
	if err := writable(cfg, root); err != nil {
		return err
	}
	if err := devices(root); err != nil {
		return err
	}
	if err := procSys(root); err != nil {
		return err
	}
	return cgroupViews(cfg, root)
}

func mkdirIfMissing(p string, mode os.FileMode) error {
	if err := os.Mkdir(p, mode); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return nil
}

// hostRoot fills the root tmpfs from the host: /usr read-only, the top-level links or
// directories, and etcDir (the host's copy of the chosen host files and the generated ones)
// as /etc, read-only, in one bind.
func hostRoot(root, etcDir string) error {
	if err := os.Mkdir(filepath.Join(root, "usr"), 0o755); err != nil {
		return err
	}
	if err := bindRO("/usr", filepath.Join(root, "usr")); err != nil {
		return err
	}
	for _, name := range hostTop {
		if err := mirror("/"+name, filepath.Join(root, name)); err != nil {
			return err
		}
	}
	etc := filepath.Join(root, "etc")
	if err := os.Mkdir(etc, 0o755); err != nil {
		return err
	}
	if err := bindRO(etcDir, etc); err != nil {
		return err
	}
	if err := os.Mkdir(filepath.Join(root, "var"), 0o755); err != nil {
		return err
	}
	return os.Symlink("../tmp", filepath.Join(root, "var", "tmp"))
}

// mirror makes dst look like the host path src: the same symlink, a read-only bind of a
// directory or file, or nothing when src does not exist.
func mirror(src, dst string) error {
	fi, err := os.Lstat(src)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	switch {
	case fi.Mode()&os.ModeSymlink != 0:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		return os.Symlink(target, dst)
	case fi.IsDir():
		if err := os.Mkdir(dst, 0o755); err != nil {
			return err
		}
		return bindRO(src, dst)
	case fi.Mode().IsRegular():
		if err := touch(dst, 0o644); err != nil {
			return err
		}
		return bindRO(src, dst)
	}
	return nil
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
func dirRoot(src, root, workdir string) error {
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
		if err := mirror(filepath.Join(src, e.Name()), filepath.Join(root, e.Name())); err != nil {
			return err
		}
	}
	etc := filepath.Join(root, "etc")
	if _, err := os.Lstat(etc); errors.Is(err, os.ErrNotExist) {
		if err := os.Mkdir(etc, 0o755); err != nil {
			return err
		}
	}
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(src, "etc", name))
		if err != nil {
			return nil
		}
		return b
	}
	gen := filepath.Join(root, AirlockDir, "etc")
	if err := os.MkdirAll(gen, 0o755); err != nil {
		return err
	}
	for name, content := range GeneratedEtc(read("passwd"), read("group"), workdir) {
		target := filepath.Join(etc, name)
		if err := os.WriteFile(filepath.Join(gen, name), content, 0o644); err != nil {
			return err
		}
		// A missing file is created when /etc is ours (the image had none); an image's /etc
		// is read-only and only existing regular files can be covered.
		fi, err := os.Lstat(target)
		switch {
		case errors.Is(err, os.ErrNotExist):
			if err := os.WriteFile(target, content, 0o644); err != nil && !errors.Is(err, unix.EROFS) {
				return err
			}
			continue
		case err != nil:
			return err
		case !fi.Mode().IsRegular():
			continue
		}
		if err := mount(filepath.Join(gen, name), target, "", unix.MS_BIND, ""); err != nil {
			return err
		}
		if err := setRO(target, false); err != nil {
			return err
		}
	}
	return nil
}

// writable mounts the tmpfs whose size is the disk limit and binds its parts at the workdir
// and /tmp: a write past the limit fails with ENOSPC.
func writable(cfg *Config, root string) error {
	rw := filepath.Join(root, RWDir)
	data := "size=" + strconv.FormatInt(cfg.DiskBytes, 10) + ",mode=0755"
	if err := mount("tmpfs", rw, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		return err
	}
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
	wd := filepath.Join(root, path.Clean(cfg.Workdir))
	if err := os.MkdirAll(wd, 0o755); err != nil {
		if errors.Is(err, unix.EROFS) {
			return fmt.Errorf("workdir %s does not exist in the image and cannot be created inside one of its read-only directories: %w", cfg.Workdir, err)
		}
		return fmt.Errorf("workdir %s: %w", cfg.Workdir, err)
	}
	if err := mount(ws, wd, "", unix.MS_BIND, ""); err != nil {
		return err
	}
	return mount(tmp, filepath.Join(root, "tmp"), "", unix.MS_BIND, "")
}

// devices builds a minimal /dev: host device nodes bound in, a private devpts, /dev/shm.
func devices(root string) error {
	dev := filepath.Join(root, "dev")
	if err := mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "size=64k,mode=0755"); err != nil {
		return err
	}
	for _, name := range hostDevices {
		p := filepath.Join(dev, name)
		if err := touch(p, 0o666); err != nil {
			return err
		}
		if err := mount("/dev/"+name, p, "", unix.MS_BIND, ""); err != nil {
			return err
		}
	}
	pts := filepath.Join(dev, "pts")
	if err := os.Mkdir(pts, 0o755); err != nil {
		return err
	}
	if err := mount("devpts", pts, "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5"); err != nil {
		return err
	}
	shm := filepath.Join(dev, "shm")
	if err := os.Mkdir(shm, 0o1777); err != nil {
		return err
	}
	if err := mount("shm", shm, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=64m,mode=1777"); err != nil {
		return err
	}
	for name, target := range map[string]string{
		"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2",
	} {
		if err := os.Symlink(target, filepath.Join(dev, name)); err != nil {
			return err
		}
	}
	return nil
}

// procSys mounts a fresh /proc (processes of other users hidden) and a read-only /sys, with
// runc's masked and read-only paths.
func procSys(root string) error {
	proc := filepath.Join(root, "proc")
	if err := mount("proc", proc, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "hidepid=invisible"); err != nil {
		return err
	}
	sys := filepath.Join(root, "sys")
	// sysfs in a user namespace needs a network namespace of our own (we have one); a host
	// whose /sys is partly hidden refuses it, and /sys is then left empty rather than failing.
	sysErr := mount("sysfs", sys, "sysfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC|unix.MS_RDONLY, "")
	for _, p := range readonlyPaths {
		t := filepath.Join(root, p)
		if _, err := os.Lstat(t); err != nil {
			continue
		}
		if err := mount(t, t, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return err
		}
		if err := setRO(t, true); err != nil {
			return err
		}
	}
	for _, p := range maskedPaths {
		if sysErr != nil && strings.HasPrefix(p, "/sys/") {
			continue
		}
		t := filepath.Join(root, p)
		fi, err := os.Lstat(t)
		if err != nil {
			continue
		}
		if fi.IsDir() {
			err = mount("tmpfs", t, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=0,mode=0555")
		} else {
			err = mount(filepath.Join(root, "dev", "null"), t, "", unix.MS_BIND, "")
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
		d := filepath.Join(root, UnifiedDir)
		if err := os.Mkdir(d, 0o700); err != nil {
			return err
		}
		if err := mount("cgroup2", d, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return err
		}
		// cgroup v2 allows processes only in leaves once controllers are enabled below: the
		// agent moves into a leaf of its own so its per-exec cgroups can be siblings.
		leaf := filepath.Join(d, "init")
		if err := os.Mkdir(leaf, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte("0"), 0); err != nil {
			return fmt.Errorf("move init into its cgroup leaf: %w", err)
		}
		ctrls, err := os.ReadFile(filepath.Join(d, "cgroup.controllers"))
		if err != nil {
			return err
		}
		var enable []string
		for _, c := range strings.Fields(string(ctrls)) {
			enable = append(enable, "+"+c)
		}
		if len(enable) > 0 {
			if err := os.WriteFile(filepath.Join(d, "cgroup.subtree_control"), []byte(strings.Join(enable, " ")), 0); err != nil {
				return fmt.Errorf("enable controllers %v for exec cgroups: %w", enable, err)
			}
		}
		return nil
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
