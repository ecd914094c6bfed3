package nsinit

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// envConfigFD names the fd the config is on after a re-exec (FDConfig otherwise).
const envConfigFD = "AIRLOCK_INIT_CONFIG_FD"

// reexec runs this binary again with the same arguments and fds, the config (Reexec cleared)
// in a memfd named by envConfigFD. The kernel gives a process that execs as its user
// namespace's root every capability there; init's first exec happened before the host wrote
// its maps (Config.Reexec), when it was nobody in the namespace, and kept none.
func reexec(cfg *Config) error {
	cfg.Reexec = false
	b, err := cfg.Encode()
	if err != nil {
		return err
	}
	mfd, err := unix.MemfdCreate("airlock-init-config", 0) // no close-on-exec: the new image reads it
	if err != nil {
		return fmt.Errorf("re-exec: memfd: %w", err)
	}
	// Above the fds Main knows (FDSelf's number, free by now, is closed again at start).
	fd, err := unix.FcntlInt(uintptr(mfd), unix.F_DUPFD, 10)
	unix.Close(mfd)
	if err != nil {
		return fmt.Errorf("re-exec: memfd: %w", err)
	}
	f := os.NewFile(uintptr(fd), "config")
	if _, err := f.Write(b); err != nil {
		return fmt.Errorf("re-exec: %w", err)
	}
	if _, err := f.Seek(0, 0); err != nil {
		return fmt.Errorf("re-exec: %w", err)
	}
	// The agent binary's start marked every inherited fd close-on-exec (agentcmd): the status
	// pipe must pass this exec.
	if _, err := unix.FcntlInt(FDStatus, unix.F_SETFD, 0); err != nil {
		return fmt.Errorf("re-exec: status fd: %w", err)
	}
	// So must the cgroup fd's placeholder (Config.CgroupCodeDir): its number stays taken
	// until setup puts the clone there, never given to another file meanwhile.
	if cfg.CgroupCodeDir != "" {
		if _, err := unix.FcntlInt(FDCgroup, unix.F_SETFD, 0); err != nil {
			return fmt.Errorf("re-exec: cgroup fd: %w", err)
		}
	}
	env := append(os.Environ(), envConfigFD+"="+strconv.Itoa(fd))
	err = unix.Exec("/proc/self/exe", os.Args, env)
	return fmt.Errorf("re-exec /proc/self/exe: %w", err)
}

// configFD is the fd readConfig reads: FDConfig, or the re-exec's memfd.
func configFD() int {
	v := os.Getenv(envConfigFD)
	if v == "" {
		return FDConfig
	}
	os.Unsetenv(envConfigFD) // nothing the agent starts inherits it
	if n, err := strconv.Atoi(v); err == nil && n > 2 {
		return n
	}
	return FDConfig
}
