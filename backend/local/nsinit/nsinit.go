// Package nsinit is the in-namespace first stage of a local sandbox: it builds the root and becomes the agent.
package nsinit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/agent"
)

// Main runs the init stage. The host starts the agent binary as "init" in new user, mount,
// pid, network, ipc and uts namespaces, with the fds described at FDSelf; it blocks on the
// config pipe until the host has put it in its cgroups.
func Main(args []string) int {
	marks := Marks{Main: Clock()}
	// The cgroup namespace is per thread: unshare it and mount the cgroup views from one
	// locked thread, never handed to other goroutines.
	runtime.LockOSThread()
	status := os.NewFile(FDStatus, "status")
	unix.Close(FDSelf)
	if status == nil {
		fmt.Fprintln(os.Stderr, "airlock init: status fd missing: this command is started by the local runtime only")
		return 2
	}
	cfg, err := readConfig()
	if err == nil && cfg.Reexec {
		err = reexec(cfg) // returns only on failure
	}
	marks.Config = Clock()
	if err == nil {
		err = setup(cfg)
	}
	marks.Root = Clock()
	if err != nil {
		report(status, Status{Error: err.Error()})
		fmt.Fprintln(os.Stderr, "airlock init:", err)
		return 1
	}
	if err := serve(cfg, status, marks); err != nil {
		fmt.Fprintln(os.Stderr, "airlock init: agent:", err)
		return 1
	}
	return 0
}

var (
	reportMu sync.Mutex
	reported bool
)

// report writes the one status line and closes the pipe; later calls do nothing.
func report(f *os.File, s Status) {
	reportMu.Lock()
	defer reportMu.Unlock()
	if reported {
		return
	}
	reported = true
	b, _ := json.Marshal(s)
	_, _ = f.Write(append(b, '\n'))
	_ = f.Close()
}

func readConfig() (*Config, error) {
	f := os.NewFile(uintptr(configFD()), "config") // reexec.go
	if f == nil {
		return nil, errors.New("config fd missing")
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	if len(b) == 0 {
		return nil, errors.New("the host closed the config pipe without sending a config")
	}
	var cfg Config
	if err := json.Unmarshal(b, &cfg); err != nil {
		return nil, fmt.Errorf("decode config: %w", err)
	}
	if err := cfg.check(); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return &cfg, nil
}

// setup runs in the new namespaces, as the user namespace's root, inside the sandbox's cgroups.
func setup(cfg *Config) error {
	unix.Umask(0o022)
	// v1: after joining the cgroups (the host did that before sending the config), so the
	// cgroup views mounted below are rooted at this sandbox's cgroup. v2: none; init is born
	// in the sandbox's leaf "init", and a namespace rooted there would hide the agent's exec
	// cgroups (clone3 places a child only below the caller's namespace root): the agent sees
	// them through FDCgroup, and each command gets a namespace rooted at its own cgroup.
	if cfg.CgroupVersion == 1 {
		if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
			return fmt.Errorf("unshare cgroup namespace: %w", err)
		}
	}
	if cfg.CgroupCodeDir != "" {
		if err := cloneCgroupFD(cfg.CgroupCodeDir); err != nil {
			return err
		}
	}
	// No user namespace can be made inside, by any path (unshare, clone, clone3, whose flags a
	// seccomp filter cannot read): the limit is this namespace's and its descendants', and
	// only this namespace's root (CAP_SYS_RESOURCE here) could raise it again; code cannot.
	if err := os.WriteFile("/proc/sys/user/max_user_namespaces", []byte("0"), 0); err != nil {
		return fmt.Errorf("forbid nested user namespaces: %w", err)
	}
	if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
		return fmt.Errorf("sethostname %q: %w", cfg.Hostname, err)
	}
	if err := loopbackUp(); err != nil {
		return err
	}
	root := cfg.RootMount
	if root == "" {
		root = filepath.Join(cfg.SessionDir, "root")
	}
	if err := buildRoot(cfg, root); err != nil {
		return err
	}
	return pivot(root)
}

// cloneCgroupFD makes FDCgroup (a placeholder until now) a detached clone of a mount rooted at
// dir, the code cgroup, as a root host hands it over (local's v2Cgroup.execParent): ".." from
// its root stays there. Done in init's own mount namespace, where it may (Config.CgroupCodeDir).
func cloneCgroupFD(dir string) error {
	fd, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("clone the code cgroup %s: open_tree: %w", dir, err)
	}
	defer unix.Close(fd)
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, attr); err != nil {
		return fmt.Errorf("clone the code cgroup %s: mount_setattr: %w", dir, err)
	}
	if err := unix.Dup3(fd, FDCgroup, unix.O_CLOEXEC); err != nil {
		return fmt.Errorf("clone the code cgroup %s: dup3: %w", dir, err)
	}
	return nil
}

// loopbackUp brings lo up: the only interface of the sandbox's network namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("loopback: socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback: get flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback: set up: %w", err)
	}
	return nil
}

// writablePaths are where commands may write (Landlock), besides nothing else.
func writablePaths(workdir string) []string {
	return []string{
		workdir, "/tmp", "/dev/shm", "/dev/pts",
		"/dev/null", "/dev/zero", "/dev/full", "/dev/tty",
	}
}

func serve(cfg *Config, status *os.File, marks Marks) error {
	// The sandbox's lifetime: when Serve returns, init (PID 1) exits and the kernel kills
	// every process of the pid namespace; the host reaps the cgroups and the state dir.
	// The idle timeout is the agent's (Config.IdleTimeout): Serve returns agent.ErrIdle.
	ctx, cancel := context.WithDeadline(context.Background(), cfg.Deadline)
	defer cancel()
	acfg := cfg.Agent
	acfg.Listen = "unix:" + AgentSocket
	acfg.FilesRoot = "/"
	acfg.CodeUID, acfg.CodeGID = CodeUID, CodeGID
	if cfg.CgroupVersion == 2 {
		acfg.CgroupV2 = fmt.Sprintf("/proc/self/fd/%d", FDCgroup)
	} else {
		acfg.CgroupV1Freezer, acfg.CgroupV1Memory = FreezerDir, MemoryDir
	}
	var abi int
	hooks := agent.Hooks{
		PrepareSpawnThread: func() error {
			var err error
			abi, err = prepareSpawner(cfg, writablePaths(acfg.Workdir))
			return err
		},
		Ready: func(addr string) {
			marks.Ready = Clock()
			report(status, Status{Ready: true, LandlockABI: abi, Marks: &marks})
		},
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	slog.SetDefault(logger)
	err := agent.Serve(ctx, acfg, hooks)
	report(status, Status{Error: fmt.Sprintf("agent stopped before it was ready: %v", err)})
	if errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil || errors.Is(err, agent.ErrIdle) {
		return nil // the sandbox's lifetime or idle timeout ended
	}
	return err
}
