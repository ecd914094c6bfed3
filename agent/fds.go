//go:build linux

package agent

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// CloseOnExecFrom marks every file descriptor >= low close-on-exec.
//
// A launcher's descriptors opened without O_CLOEXEC survive exec into the agent (and through
// the runtime's init stage); left as they are, every command the agent forks would inherit
// them and could read or write whatever they point at on the host. Go opens its own files
// close-on-exec, so after this only the descriptors a spawn places at 0..2 reach a command.
// The flag changes nothing for this process's own use of the descriptors.
func CloseOnExecFrom(low int) error {
	if low < 0 {
		return fmt.Errorf("close-on-exec from %d: not a file descriptor", low)
	}
	// One syscall (Linux 5.11+); ENOSYS/EINVAL on older kernels, EPERM under some seccomp
	// profiles: then the slower walk of /proc/self/fd.
	if err := unix.CloseRange(uint(low), ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err == nil {
		return nil
	}
	return cloexecByProc(low)
}

func cloexecByProc(low int) error {
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		// Fail closed: without the list the inherited descriptors cannot be found.
		return fmt.Errorf("close-on-exec from %d: close_range unavailable and %w", low, err)
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("close-on-exec from %d: read /proc/self/fd: %w", low, err)
	}
	self := int(d.Fd())
	for _, n := range names {
		fd, err := strconv.Atoi(n)
		if err != nil || fd < low || fd == self {
			continue
		}
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if errors.Is(err, unix.EBADF) {
			continue // closed since the listing was read
		}
		if err != nil {
			return fmt.Errorf("close-on-exec: fd %d: %w", fd, err)
		}
		if flags&unix.FD_CLOEXEC != 0 {
			continue
		}
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, flags|unix.FD_CLOEXEC); err != nil && !errors.Is(err, unix.EBADF) {
			return fmt.Errorf("close-on-exec: fd %d: %w", fd, err)
		}
	}
	return nil
}
