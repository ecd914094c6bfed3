//go:build unix

package runcli

import "syscall"

// ownSession starts a filler in a session (and process group) of its own.
func ownSession() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setsid: true} }

// lowerGroup sets every process of process group pgid to nice.
func lowerGroup(pgid, nice int) { _ = syscall.Setpriority(syscall.PRIO_PGRP, pgid, nice) }

// OwnNice is this thread's nice value (-20..19; the system call answers 20 - nice).
func OwnNice() int {
	p, err := syscall.Getpriority(syscall.PRIO_PROCESS, 0)
	if err != nil {
		return -1
	}
	return 20 - p
}
