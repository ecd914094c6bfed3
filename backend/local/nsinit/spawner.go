package nsinit

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"unsafe"

	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// The spawner thread is the one OS thread every command is forked from. Everything installed
// here is per thread and inherited by the children: the agent's other threads stay free to
// manage cgroups and files while every command starts restricted.

// prepareSpawner restricts the calling (locked) thread. Order matters: the cgroup namespace
// and the pids placement need privileges that no_new_privs, the emptied bounding set and
// seccomp take away.
func prepareSpawner(cfg *Config, writable []string) (landlockABI int, err error) {
	if cfg.CgroupVersion == 2 {
		// No cgroup namespace here (setup): clone3 places a command only below the caller's
		// namespace root, and the code cgroup is a sibling of init's.
	} else if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return 0, fmt.Errorf("unshare cgroup namespace on the spawner thread: %w", err)
	}
	if cfg.CgroupVersion == 1 {
		// Code gets its own pids child (pids.max = the declared limit) so a fork bomb cannot
		// take the headroom the agent's own threads need. v1 places threads individually.
		// "0" is the calling thread: the kernel moves it without the global threadgroup lock
		// that naming a tid takes (an RCU grace period, ~10ms measured here).
		tasks := filepath.Join(PidsDir, CodePidsName, "tasks")
		if err := os.WriteFile(tasks, []byte("0"), 0); err != nil {
			return 0, fmt.Errorf("move the spawner thread into the code pids cgroup: %w", err)
		}
	}
	for c, last := 0, lastCap(); c <= last; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			return 0, fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return 0, fmt.Errorf("no_new_privs: %w", err)
	}
	abi, err := landlockThread(cfg, writable)
	if err != nil {
		return 0, err
	}
	if err := loadSeccomp(cfg.Seccomp); err != nil {
		return 0, err
	}
	return abi, nil
}

func lastCap() int {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err == nil {
		if n, err := strconv.Atoi(string(trimNL(b))); err == nil {
			return n
		}
	}
	return 63 // PR_CAPBSET_DROP answers EINVAL past the last one
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}

// loadSeccomp installs the host-compiled filter on this thread only (no TSYNC).
func loadSeccomp(prog []byte) error {
	n := len(prog) / 8
	filter := make([]unix.SockFilter, n)
	for i := range filter {
		b := prog[i*8:]
		filter[i] = unix.SockFilter{
			Code: binary.NativeEndian.Uint16(b[0:2]),
			Jt:   b[2],
			Jf:   b[3],
			K:    binary.NativeEndian.Uint32(b[4:8]),
		}
	}
	fprog := unix.SockFprog{Len: uint16(n), Filter: &filter[0]}
	if _, _, e := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog))); e != 0 {
		return fmt.Errorf("load seccomp filter (%d instructions): %w", n, e)
	}
	return nil
}

// Landlock rights by ABI version: the rights this runtime handles are every filesystem right
// the running kernel knows, so an unknown (newer) right is never left unhandled by mistake.
func landlockFSRights(abi int) uint64 {
	switch {
	case abi >= 9:
		return 1<<17 - 1
	case abi >= 5:
		return 1<<16 - 1
	case abi >= 3:
		return 1<<15 - 1
	case abi == 2:
		return 1<<14 - 1
	case abi == 1:
		return 1<<13 - 1
	}
	return 0
}

// fileRights are the rights that apply to a non-directory.
const fileRights = ll.AccessFSExecute | ll.AccessFSWriteFile | ll.AccessFSReadFile | ll.AccessFSTruncate | ll.AccessFSIoctlDev

// landlockThread restricts this thread (and what it forks) to reading and executing
// everywhere and writing only in writable. Best effort by ABI: a kernel without Landlock
// returns 0 and nothing is restricted by it (seccomp, the mount layout and the uid still are).
func landlockThread(cfg *Config, writable []string) (int, error) {
	abi, err := ll.LandlockGetABIVersion()
	if err != nil || abi < 1 {
		return 0, nil
	}
	handled := landlockFSRights(abi)
	attr := ll.RulesetAttr{HandledAccessFS: handled}
	if abi >= 6 {
		attr.Scoped = ll.ScopeAbstractUnixSocket | ll.ScopeSignal
	}
	fd, err := ll.LandlockCreateRuleset(&attr, 0)
	if err != nil {
		return 0, fmt.Errorf("landlock create ruleset (abi %d): %w", abi, err)
	}
	defer unix.Close(fd)
	read := uint64(ll.AccessFSExecute | ll.AccessFSReadFile | ll.AccessFSReadDir)
	if err := addPathRule(fd, "/", read&handled); err != nil {
		return 0, err
	}
	// On v1 the spawner thread itself enters each exec's freezer cgroup by writing its thread
	// id (the agent's design): it must keep writing cgroup files there. Commands inherit this
	// rule too, but /.airlock is mode 0700 and owned by the sandbox's root, which commands
	// never are. On v2 commands are born in their cgroup (clone3 takes a directory fd the
	// agent opened on another thread): nothing to write.
	if cfg.CgroupVersion == 1 {
		if err := addPathRule(fd, FreezerDir, uint64(ll.AccessFSWriteFile|ll.AccessFSReadFile|ll.AccessFSReadDir)&handled); err != nil {
			return 0, err
		}
	}
	for _, p := range writable {
		fi, err := os.Stat(p)
		if err != nil {
			continue // an optional device the root does not have
		}
		rights := handled
		if !fi.IsDir() {
			rights &= fileRights
		}
		if err := addPathRule(fd, p, rights); err != nil {
			return 0, err
		}
	}
	if err := ll.LandlockRestrictSelf(fd, 0); err != nil {
		return 0, fmt.Errorf("landlock restrict self (abi %d): %w", abi, err)
	}
	return abi, nil
}

func addPathRule(rulesetFD int, p string, rights uint64) error {
	fd, err := unix.Open(p, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("landlock rule %s: %w", p, err)
	}
	defer unix.Close(fd)
	if err := ll.LandlockAddPathBeneathRule(rulesetFD, &ll.PathBeneathAttr{AllowedAccess: rights, ParentFd: fd}, 0); err != nil {
		return fmt.Errorf("landlock rule %s: %w", p, err)
	}
	return nil
}
