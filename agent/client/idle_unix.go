//go:build unix

package client

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// stillIdle reports whether a kept connection can carry a request: nothing arrived on it since
// its last answer and the agent has not closed it (a peek that does not wait says "would
// block"). A connection it cannot look into is trusted.
func stillIdle(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	idle := false
	err = rc.Control(func(fd uintptr) {
		var b [1]byte
		for {
			_, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
			if err != unix.EINTR {
				idle = err == unix.EAGAIN
				return
			}
		}
	})
	return err == nil && idle
}
