//go:build unix

package kernfile

import (
	"os"

	"golang.org/x/sys/unix"
)

// Not os.File: os.Open registers every descriptor with the runtime's poller, and a kernfs file
// is pollable and always ready, so each open costs an epoll_ctl pair and wakes the thread
// parked in epoll_wait (seen in a scheduler trace of an exec: four such wakeups per exec; and
// on every agent call's pause check), on paths where every wakeup takes CPU from the work.

// Read reads a small kernel file whole.
func Read(name string) ([]byte, error) {
	fd, err := Open(name, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	buf := make([]byte, 0, 512)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := unix.Read(fd, buf[len(buf):cap(buf)])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: name, Err: err}
		}
		if n == 0 {
			return buf, nil
		}
		buf = buf[:len(buf)+n]
	}
}

// Write writes s to a kernel file in one write (a control file takes one value per write).
func Write(name, s string) error {
	fd, err := Open(name, unix.O_WRONLY)
	if err != nil {
		return err
	}
	err = WriteFD(fd, name, s)
	cerr := unix.Close(fd)
	if err != nil {
		return err
	}
	if cerr != nil {
		return &os.PathError{Op: "close", Path: name, Err: cerr}
	}
	return nil
}

// WriteFD writes s in one write to fd, a kernel file kept open (name is for errors).
func WriteFD(fd int, name, s string) error {
	for {
		_, err := unix.Write(fd, []byte(s))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return &os.PathError{Op: "write", Path: name, Err: err}
		}
		return nil
	}
}

// Open opens name (O_CLOEXEC added) and returns the raw descriptor, retrying on EINTR.
func Open(name string, mode int) (int, error) {
	for {
		fd, err := unix.Open(name, mode|unix.O_CLOEXEC, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return -1, &os.PathError{Op: "open", Path: name, Err: err}
		}
		return fd, nil
	}
}
