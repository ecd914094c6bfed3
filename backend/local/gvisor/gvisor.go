// Package gvisor drives runsc, gVisor's OCI runtime: finding it, a sandbox's bundle (its root and spec) and runsc's commands.
package gvisor

import (
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/airlock-sandbox/airlock/backend/local/nsinit"
	"github.com/airlock-sandbox/airlock/backend/local/sessions"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// Runtime gvisor runs the same root filesystem and the same agent under runsc: the sandbox's
// kernel is gVisor's Sentry, not the host's. The agent runs as the container's process
// ("serve" with a config file, no init stage: runsc makes the namespaces, the mounts and its
// own seccomp filter), listening on a unix socket runsc creates on the host
// (--host-uds=create) in the session's run directory.

// Install is the command that builds a runsc this runtime accepts (hack/runsc.sh has its version).
const Install = "CGO_ENABLED=0 go install gvisor.dev/gvisor/runsc@v0.0.0-20260905035102-160fafc42237"

// pidsHeadroom: gVisor's own threads (Sentry and gofer) count against the host pids limit
// and it panics when it cannot make one; the guest's process limit is RLIMIT_NPROC.
const pidsHeadroom = 512

// Find returns runsc's path (opt, else runsc on PATH), or why it cannot be used.
func Find(opt string) (string, error) {
	p := opt
	if p == "" {
		var err error
		if p, err = exec.LookPath("runsc"); err != nil {
			return "", fmt.Errorf("%w: runtime gvisor needs runsc on PATH: %s", sandbox.ErrUnsupported, Install)
		}
	}
	f, err := elf.Open(p)
	if err != nil {
		return "", fmt.Errorf("%w: runsc %s: %v", sandbox.ErrUnsupported, p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			// runsc re-executes itself inside the chroot it builds, where no dynamic loader exists.
			return "", fmt.Errorf("%w: runsc %s is dynamically linked and fails inside its own chroot; rebuild it static: %s", sandbox.ErrUnsupported, p, Install)
		}
	}
	return p, nil
}

// Runsc runs runsc's commands for the sessions whose directories it is given; each session
// keeps runsc's state in <dir>/runsc.
type Runsc struct{ Bin string }

func (r Runsc) command(ctx context.Context, dir string, args ...string) *exec.Cmd {
	full := append([]string{"--root", filepath.Join(dir, "runsc"), "--network=none", "--host-uds=create"}, args...)
	return exec.CommandContext(ctx, r.Bin, full...)
}

// run runs a runsc command for session dir, returning its combined output.
func (r Runsc) run(ctx context.Context, dir string, args ...string) ([]byte, error) {
	out, err := r.command(ctx, dir, args...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("runsc %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return out, nil
}

// Start runs container id from session dir's bundle, detached; runsc and the container write
// their output to log (gVisor writes a container's stdout at offset 0 of a regular file: give
// it a file of its own).
func (r Runsc) Start(ctx context.Context, dir, id string, log io.Writer) error {
	cmd := r.command(ctx, dir, "run", "--detach", "--bundle", filepath.Join(dir, "bundle"), id)
	cmd.Stdout, cmd.Stderr = log, log
	return cmd.Run()
}

// State is container id's status as runsc has it ("created", "running", "paused",
// "stopped") and the host pid of its sandbox (Sentry) process.
func (r Runsc) State(ctx context.Context, dir, id string) (status string, pid int, err error) {
	out, err := r.run(ctx, dir, "state", id)
	if err != nil {
		return "", 0, err
	}
	var st specs.State
	if err := json.Unmarshal(out, &st); err != nil {
		return "", 0, fmt.Errorf("runsc state: %w", err)
	}
	return string(st.Status), st.Pid, nil
}

// Pid is the host pid of container id's sandbox (Sentry) process.
func (r Runsc) Pid(ctx context.Context, dir, id string) (int, error) {
	status, pid, err := r.State(ctx, dir, id)
	if err != nil {
		return 0, err
	}
	if pid <= 0 {
		return 0, fmt.Errorf("runsc state: container %s is %s without a pid", id, status)
	}
	return pid, nil
}

// SetPaused stops (runsc pause) or restarts (runsc resume) every task of container id in its
// Sentry, each stopped at a point where the Sentry's own state is whole. One already in that
// state is left as it is.
func (r Runsc) SetPaused(ctx context.Context, dir, id string, paused bool) error {
	status, _, err := r.State(ctx, dir, id)
	if err != nil {
		return err
	}
	const stateRunning, statePaused = string(specs.StateRunning), "paused" // runsc's word, not the OCI spec's
	switch {
	case paused && status == stateRunning:
		_, err = r.run(ctx, dir, "pause", id)
	case !paused && status == statePaused:
		_, err = r.run(ctx, dir, "resume", id)
	case status != stateRunning && status != statePaused:
		err = fmt.Errorf("runsc: container %s is %s", id, status)
	}
	return err
}

// Delete kills and deletes container id; one that does not exist is deleted already.
func (r Runsc) Delete(ctx context.Context, dir, id string) error {
	out, err := r.run(ctx, dir, "delete", "--force", id)
	if err != nil && !strings.Contains(string(out), "does not exist") && !strings.Contains(string(out), "not found") {
		return err
	}
	return nil
}

// Root returns the root filesystem directory: image's when it is a directory (non-empty), or
// for the host image a skeleton in session dir's bundle (links, mount points and a generated
// /etc) that the spec's mounts fill from the host.
func Root(dir, image, workdir string) (string, error) {
	if image != "" {
		return image, nil
	}
	root := filepath.Join(dir, "bundle", "rootfs")
	for _, d := range []string{"", "usr", "etc", "proc", "dev", "sys", "tmp", "root", "run", "var", ".airlock", ".airlock/run", ".airlock/bin"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return "", err
		}
	}
	if err := os.MkdirAll(filepath.Join(root, workdir), 0o755); err != nil {
		return "", err
	}
	for _, name := range hostDirs {
		fi, err := os.Lstat("/" + name)
		if err != nil {
			continue
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			t, err := os.Readlink("/" + name)
			if err != nil {
				return "", err
			}
			if err := os.Symlink(t, filepath.Join(root, name)); err != nil {
				return "", err
			}
		} else if err := os.Mkdir(filepath.Join(root, name), 0o755); err != nil {
			return "", err
		}
	}
	for name, content := range nsinit.GeneratedEtc(nil, nil, workdir) {
		if err := os.WriteFile(filepath.Join(root, "etc", name), content, 0o644); err != nil {
			return "", err
		}
	}
	return root, nil
}

// hostDirs are the host's top-level program directories the host image shows (each a
// directory or a link to one).
var hostDirs = []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"}

// Config is what a sandbox's OCI spec is made of.
type Config struct {
	// Dir is the session's directory (its name is the container's), Root the root filesystem
	// (Root's answer), HostImage whether it is the host image's skeleton.
	Dir, Root string
	HostImage bool
	// AgentPath is the agent binary on the host, AgentArgs go before "serve", AgentConfig is
	// the agent's config file on the host.
	AgentPath   string
	AgentArgs   []string
	AgentConfig string
	// CgroupParent is the parent of the sandbox's cgroup.
	CgroupParent string
	Hostname     string
	Workdir      string
	// The limits: CPU in thousandths of a core, memory and each tmpfs (/tmp, the workdir) in
	// bytes, and the guest's process limit.
	CPUMillis, MemoryBytes, DiskBytes int64
	MaxProcesses                      int64
}

// Spec is the OCI runtime spec for the sandbox.
func Spec(c Config) *specs.Spec {
	uint64p := func(v uint64) *uint64 { return &v }
	int64p := func(v int64) *int64 { return &v }
	period := uint64(100000)
	quota := max(c.CPUMillis*int64(period)/1000, 1000)
	pids := c.MaxProcesses + pidsHeadroom
	disk := strconv.FormatInt(c.DiskBytes, 10)
	caps := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL", "CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP"}
	args := append(append([]string{"/.airlock/bin/airlock-agent"}, c.AgentArgs...), "serve", "--config", "/.airlock/agent.json")
	s := &specs.Spec{
		Version:  specs.Version,
		Root:     &specs.Root{Path: c.Root, Readonly: true},
		Hostname: c.Hostname,
		Process: &specs.Process{
			Args: args, Cwd: "/", Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"},
			User:            specs.User{UID: 0, GID: 0},
			NoNewPrivileges: true,
			Capabilities:    &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps},
			// The guest's process limit (code runs as uid 1000): gVisor enforces RLIMIT_NPROC.
			Rlimits: []specs.POSIXRlimit{{Type: "RLIMIT_NPROC", Hard: uint64(c.MaxProcesses), Soft: uint64(c.MaxProcesses)}},
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			// Under gVisor /tmp and the workdir are separate tmpfs mounts, each of the disk size.
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777", "size=" + disk}},
			{Destination: c.Workdir, Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=0755", "uid=1000", "gid=1000", "size=" + disk}},
			{Destination: "/.airlock/bin/airlock-agent", Type: "bind", Source: c.AgentPath, Options: []string{"bind", "ro"}},
			{Destination: "/.airlock/agent.json", Type: "bind", Source: c.AgentConfig, Options: []string{"bind", "ro"}},
			{Destination: "/.airlock/run", Type: "bind", Source: filepath.Join(c.Dir, "run"), Options: []string{"bind", "rw"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: path.Join("/", c.CgroupParent, filepath.Base(c.Dir)),
			Resources: &specs.LinuxResources{
				CPU:    &specs.LinuxCPU{Quota: &quota, Period: uint64p(period)},
				Memory: &specs.LinuxMemory{Limit: int64p(c.MemoryBytes), Swap: int64p(c.MemoryBytes)},
				Pids:   &specs.LinuxPids{Limit: &pids},
			},
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
			},
		},
	}
	if c.HostImage {
		s.Mounts = append(s.Mounts, specs.Mount{Destination: "/usr", Type: "bind", Source: "/usr", Options: []string{"rbind", "ro"}})
		for _, name := range hostDirs {
			if fi, err := os.Lstat("/" + name); err == nil && fi.IsDir() {
				s.Mounts = append(s.Mounts, specs.Mount{Destination: "/" + name, Type: "bind", Source: "/" + name, Options: []string{"rbind", "ro"}})
			}
		}
		for _, name := range sessions.HostEtc() {
			src := filepath.Join("/etc", name)
			fi, err := os.Stat(src)
			if err != nil || !(fi.IsDir() || fi.Mode().IsRegular()) {
				continue
			}
			s.Mounts = append(s.Mounts, specs.Mount{Destination: src, Type: "bind", Source: src, Options: []string{"rbind", "ro"}})
		}
	}
	return s
}
