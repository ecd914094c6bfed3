//go:build !unix

package runcli

import "syscall"

// ownSession has no session to start a filler in: a filler parks the local runtime's
// sandboxes, which this system cannot make (sessions.Claim finds none), so none is started.
func ownSession() *syscall.SysProcAttr { return nil }

// lowerGroup does nothing: this system has no process groups to lower.
func lowerGroup(pgid, nice int) {}

// OwnNice is -1: this system has no nice values.
func OwnNice() int { return -1 }
