//go:build unix

package runcli

import "syscall"

// ownSession starts a filler in a session (and process group) of its own.
func ownSession() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setsid: true} }
