//go:build !unix

package runcli

import "syscall"

// ownSession has no session to start a filler in: a filler parks the local runtime's
// sandboxes, which this system cannot make (sessions.Claim finds none), so none is started.
func ownSession() *syscall.SysProcAttr { return nil }
