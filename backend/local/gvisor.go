package local

import (
	"context"
	"crypto/ed25519"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/agent"
	"github.com/airlock-sandbox/airlock/backend/local/nsinit"
	"github.com/airlock-sandbox/airlock/backend/local/spares"
	"github.com/airlock-sandbox/airlock/internal/backoff"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
	"github.com/airlock-sandbox/airlock/token"
)

// runtime: gvisor runs the same root filesystem and the same agent under runsc, gVisor's OCI
// runtime: the sandbox's kernel is gVisor's Sentry, not the host's. The agent runs as the
// container's process ("serve" with a config file, no init stage: runsc makes the namespaces,
// the mounts and its own seccomp filter), listening on a unix socket runsc creates on the
// host (--host-uds=create) in the session's run directory.

const runscInstall = "CGO_ENABLED=0 go install gvisor.dev/gvisor/runsc@v0.0.0-20260905035102-160fafc42237"

// gvisorPidsHeadroom: gVisor's own threads (Sentry and gofer) count against the host pids
// limit and it panics when it cannot make one; the guest's process limit is RLIMIT_NPROC.
const gvisorPidsHeadroom = 512

// findRunsc returns runsc's path, or why it cannot be used.
func findRunsc(opt string) (string, error) {
	p := opt
	if p == "" {
		var err error
		if p, err = exec.LookPath("runsc"); err != nil {
			return "", fmt.Errorf("%w: runtime gvisor needs runsc on PATH: %s", sandbox.ErrUnsupported, runscInstall)
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
			return "", fmt.Errorf("%w: runsc %s is dynamically linked and fails inside its own chroot; rebuild it static: %s", sandbox.ErrUnsupported, p, runscInstall)
		}
	}
	return p, nil
}

// runscBinary finds runsc once per backend.
func (b *Backend) runscBinary() (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.runscPath == "" {
		p, err := findRunsc(b.opts.RunscPath)
		if err != nil {
			return "", err
		}
		b.runscPath = p
	}
	return b.runscPath, nil
}

// runsc runs a runsc command for session dir, returning its combined output.
func (b *Backend) runsc(ctx context.Context, dir string, args ...string) ([]byte, error) {
	bin, err := b.runscBinary()
	if err != nil {
		return nil, err
	}
	full := append([]string{"--root", filepath.Join(dir, "runsc"), "--network=none", "--host-uds=create"}, args...)
	cmd := exec.CommandContext(ctx, bin, full...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("runsc %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return out, nil
}

// startGVisor is start for runtime gvisor.
func (b *Backend) startGVisor(ctx context.Context, id string, decl spec.Sandbox, r *resolved) (*session, error) {
	if _, err := b.runscBinary(); err != nil {
		return nil, err
	}
	// runsc's delete removes every cgroup directory its create made, the parent too when it
	// made that, and fails (EBUSY) while another sandbox is still in it: made here first,
	// the parent is never runsc's (seen on cgroup v2 with concurrent creates).
	if err := b.cg.ensureParent(); err != nil {
		return nil, fmt.Errorf("cgroup parent: %w", err)
	}
	dir := filepath.Join(b.opts.StateDir, id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("session dir: %w", err)
	}
	for _, d := range []string{"run", "bundle", "runsc"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			return nil, err
		}
	}
	key, err := token.DeriveKey(b.master, id)
	if err != nil {
		return nil, err
	}
	ring, err := token.NewKeyRing(key.Public().(ed25519.PublicKey)).MarshalText()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	s := &session{
		dir: dir, key: key, done: make(chan struct{}),
		rec: record{RecordCore: spares.RecordCore{
			ID: id, SandboxID: decl.ID, Generation: 1, CreatedAt: now.UTC(), ExpiresAt: now.Add(r.lifetime).UTC(),
			Cgroup: path.Join("/", b.opts.CgroupParent, id), CgroupVersion: b.cg.version(), Runtime: string(spec.RuntimeGVisor),
			Creator: creatorOf(decl),
		}, Spec: decl},
	}
	acfg := agent.Config{
		SandboxID: decl.ID, SessionID: id, Generation: 1, KeyRing: string(ring),
		Listen: "unix:" + nsinit.AgentSocket, FilesRoot: "/",
		Workdir: r.workdir, Policy: r.policy, CodeUID: nsinit.CodeUID, CodeGID: nsinit.CodeGID,
	}
	acfgJSON, err := json.Marshal(acfg)
	if err != nil {
		return nil, err
	}
	agentCfg := filepath.Join(dir, "agent.json")
	if err := os.WriteFile(agentCfg, acfgJSON, 0o600); err != nil {
		return nil, err
	}
	bundle := filepath.Join(dir, "bundle")
	rootPath, err := b.gvisorRoot(dir, r)
	if err != nil {
		return nil, err
	}
	ociSpec, err := b.gvisorSpec(dir, rootPath, agentCfg, r)
	if err != nil {
		return nil, err
	}
	js, err := json.MarshalIndent(ociSpec, "", " ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), js, 0o600); err != nil {
		return nil, err
	}
	// gVisor writes a container's stdout at offset 0 of a regular file: give it its own file.
	logf, err := os.OpenFile(filepath.Join(dir, initLog), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	bin, err := b.runscBinary()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, bin, "--root", filepath.Join(dir, "runsc"), "--network=none", "--host-uds=create",
		"run", "--detach", "--bundle", bundle, id)
	cmd.Stdout, cmd.Stderr = logf, logf
	err = cmd.Run()
	logf.Close()
	if err != nil {
		return s, fmt.Errorf("runsc run: %v%s", err, b.logTail(dir))
	}
	pid, err := b.runscPid(ctx, dir, id)
	if err != nil {
		return s, err
	}
	s.rec.InitPID = pid
	if s.rec.InitStart, err = startTime(pid); err != nil {
		return s, fmt.Errorf("runsc sandbox process %d: %w", pid, err)
	}
	// The agent listens once the Sentry has booted: poll its health until ctx ends.
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, startTimeout)
		defer cancel()
	}
	c := b.client(s)
	defer c.Close()
	for wait := backoff.New(5*time.Millisecond, 100*time.Millisecond); ; {
		hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		h, err := c.Health(hctx)
		cancel()
		if err == nil {
			if h.SandboxID != decl.ID {
				return s, fmt.Errorf("%w: agent of %s answered for sandbox %q", sandbox.ErrUnreachable, id, h.SandboxID)
			}
			break
		}
		if !alive(s.rec.InitPID, s.rec.InitStart) {
			return s, fmt.Errorf("gVisor sandbox exited before its agent answered: %v%s", err, b.logTail(dir))
		}
		if !wait.Wait(ctx) {
			return s, fmt.Errorf("%w: agent of %s did not answer: %v", sandbox.ErrDeadlineExceeded, id, err)
		}
	}
	if err := writeRecord(dir, &s.rec); err != nil {
		return s, err
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return s, err
	}
	b.mu.Lock()
	b.sessions[id] = s
	b.mu.Unlock()
	b.watchAdopted(s, pidfd)
	b.enforceLifetime(s)
	return s, nil
}

// runscPid is the host pid of the sandbox (Sentry) process.
func (b *Backend) runscPid(ctx context.Context, dir, id string) (int, error) {
	out, err := b.runsc(ctx, dir, "state", id)
	if err != nil {
		return 0, err
	}
	var st struct {
		Pid    int    `json:"pid"`
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return 0, fmt.Errorf("runsc state: %w", err)
	}
	if st.Pid <= 0 {
		return 0, fmt.Errorf("runsc state: container %s is %s without a pid", id, st.Status)
	}
	return st.Pid, nil
}

// gvisorRoot returns the root filesystem directory: the image's, or for the host image a
// skeleton in the state dir (links, mount points and a generated /etc) that the spec's
// mounts fill from the host.
func (b *Backend) gvisorRoot(dir string, r *resolved) (string, error) {
	if r.rootKind == nsinit.RootDir {
		return r.rootSrc, nil
	}
	root := filepath.Join(dir, "bundle", "rootfs")
	for _, d := range []string{"", "usr", "etc", "proc", "dev", "sys", "tmp", "root", "run", "var", ".airlock", ".airlock/run", ".airlock/bin"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return "", err
		}
	}
	if err := os.MkdirAll(filepath.Join(root, r.workdir), 0o755); err != nil {
		return "", err
	}
	for _, name := range []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"} {
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
	for name, content := range nsinit.GeneratedEtc(nil, nil, r.workdir) {
		if err := os.WriteFile(filepath.Join(root, "etc", name), content, 0o644); err != nil {
			return "", err
		}
	}
	return root, nil
}

// gvisorSpec is the OCI runtime spec for the sandbox.
func (b *Backend) gvisorSpec(dir, rootPath, agentCfg string, r *resolved) (*specs.Spec, error) {
	uint64p := func(v uint64) *uint64 { return &v }
	int64p := func(v int64) *int64 { return &v }
	period := uint64(100000)
	quota := max(r.limits.CPUMillis*int64(period)/1000, 1000)
	pids := r.limits.MaxProcesses + gvisorPidsHeadroom
	disk := strconv.FormatInt(r.disk, 10)
	caps := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL", "CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP"}
	args := append(append([]string{"/.airlock/bin/airlock-agent"}, b.agentArgs...), "serve", "--config", "/.airlock/agent.json")
	s := &specs.Spec{
		Version:  specs.Version,
		Root:     &specs.Root{Path: rootPath, Readonly: true},
		Hostname: r.hostname,
		Process: &specs.Process{
			Args: args, Cwd: "/", Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"},
			User:            specs.User{UID: 0, GID: 0},
			NoNewPrivileges: true,
			Capabilities:    &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps},
			// The guest's process limit (code runs as uid 1000): gVisor enforces RLIMIT_NPROC.
			Rlimits: []specs.POSIXRlimit{{Type: "RLIMIT_NPROC", Hard: uint64(r.limits.MaxProcesses), Soft: uint64(r.limits.MaxProcesses)}},
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			// Under gVisor /tmp and the workdir are separate tmpfs mounts, each of the disk size.
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777", "size=" + disk}},
			{Destination: r.workdir, Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=0755", "uid=1000", "gid=1000", "size=" + disk}},
			{Destination: "/.airlock/bin/airlock-agent", Type: "bind", Source: b.agentPath, Options: []string{"bind", "ro"}},
			{Destination: "/.airlock/agent.json", Type: "bind", Source: agentCfg, Options: []string{"bind", "ro"}},
			{Destination: "/.airlock/run", Type: "bind", Source: filepath.Join(dir, "run"), Options: []string{"bind", "rw"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: path.Join("/", b.opts.CgroupParent, filepath.Base(dir)),
			Resources: &specs.LinuxResources{
				CPU:    &specs.LinuxCPU{Quota: &quota, Period: uint64p(period)},
				Memory: &specs.LinuxMemory{Limit: int64p(r.limits.MemoryBytes), Swap: int64p(r.limits.MemoryBytes)},
				Pids:   &specs.LinuxPids{Limit: &pids},
			},
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
			},
		},
	}
	if r.rootKind == nsinit.RootHost {
		s.Mounts = append(s.Mounts, specs.Mount{Destination: "/usr", Type: "bind", Source: "/usr", Options: []string{"rbind", "ro"}})
		for _, name := range []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"} {
			if fi, err := os.Lstat("/" + name); err == nil && fi.IsDir() {
				s.Mounts = append(s.Mounts, specs.Mount{Destination: "/" + name, Type: "bind", Source: "/" + name, Options: []string{"rbind", "ro"}})
			}
		}
		for _, name := range spares.HostEtc() {
			src := filepath.Join("/etc", name)
			fi, err := os.Stat(src)
			if err != nil || !(fi.IsDir() || fi.Mode().IsRegular()) {
				continue
			}
			s.Mounts = append(s.Mounts, specs.Mount{Destination: src, Type: "bind", Source: src, Options: []string{"rbind", "ro"}})
		}
	}
	return s, nil
}

// enforceLifetime ends a gVisor session at its expiry: its agent has no deadline of its own
// (unlike the native init). A later New reaps one that expired while no process watched.
func (b *Backend) enforceLifetime(s *session) {
	d := time.Until(s.rec.ExpiresAt)
	// Held while arming: the callback's destroy takes the same lock and reads stopTimer.
	s.mu.Lock()
	defer s.mu.Unlock()
	timer := time.AfterFunc(d, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := b.destroy(ctx, s.rec.ID, s); err != nil {
			b.log.Error("end expired gVisor sandbox", "session", s.rec.ID, "err", err)
		}
	})
	s.stopTimer = func() { timer.Stop() }
}

// stopGVisor kills and deletes the runsc container; the caller then removes what remains.
func (b *Backend) stopGVisor(ctx context.Context, dir, id string) error {
	if _, err := os.Stat(filepath.Join(dir, "runsc")); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if _, err := b.runscBinary(); err != nil {
		return err
	}
	out, err := b.runsc(ctx, dir, "delete", "--force", id)
	if err != nil && !strings.Contains(string(out), "does not exist") && !strings.Contains(string(out), "not found") {
		return err
	}
	return nil
}
