//go:build unix

package gcp

import (
	"os"
	"syscall"
)

// socketpair returns the two ends of a connected unix stream socket pair, both close-on-exec.
// Not every unix has SOCK_CLOEXEC (darwin), so the flag is set after, under ForkLock as the
// standard library does, so that no concurrent fork inherits either end.
func socketpair() (ours, theirs *os.File, err error) {
	syscall.ForkLock.RLock()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err == nil {
		syscall.CloseOnExec(fds[0])
		syscall.CloseOnExec(fds[1])
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return nil, nil, err
	}
	return os.NewFile(uintptr(fds[0]), "bridge"), os.NewFile(uintptr(fds[1]), "bridge-launcher"), nil
}
