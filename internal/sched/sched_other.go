//go:build !linux

package sched

import (
	"fmt"
	"runtime"
)

// Supported is false: only Linux has SCHED_IDLE.
func Supported() bool { return false }

// Normal is false: only Linux has SCHED_IDLE.
func Normal() (normal bool, nice int) { return false, 0 }

// StartIdle runs start as it is: only Linux has SCHED_IDLE.
func StartIdle(start func() error) error { return start() }

// Restore refuses: only Linux has SCHED_IDLE.
func Restore(procs func() ([]int, error), nice int) error {
	return fmt.Errorf("scheduling classes are Linux's; this host runs %s", runtime.GOOS)
}
