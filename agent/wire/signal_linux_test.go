package wire

import (
	"testing"

	"golang.org/x/sys/unix"
)

// TestShellExitCodeLinuxNumbers: the table is the kernel's numbering, so that a client on
// another system reports what a shell on the sandbox would.
func TestShellExitCodeLinuxNumbers(t *testing.T) {
	for name, n := range linuxSignals {
		if got := unix.SignalNum(name); int(got) != n {
			t.Errorf("%s: table says %d, the kernel %d", name, n, got)
		}
	}
	for n := unix.Signal(1); n <= unix.SIGSYS; n++ {
		if _, ok := linuxSignals[unix.SignalName(n)]; !ok {
			t.Errorf("signal %d (%s) is missing from the table", n, unix.SignalName(n))
		}
	}
}

func TestShellExitCode(t *testing.T) {
	for _, tc := range []struct {
		code   int
		signal string
		want   int
	}{
		{0, "", 0},
		{3, "", 3},
		{-1, "SIGKILL", 137},
		{-1, "SIGUSR1", 138}, // darwin's own number would make it 158
		{-1, "SIGSEGV", 139},
		{-1, "SIGNOPE", -1}, // a name the table lacks stays what the agent said
		{2, "SIGTERM", 2},   // an exit code is not a death by signal
	} {
		if got := ShellExitCode(tc.code, tc.signal); got != tc.want {
			t.Errorf("ShellExitCode(%d, %q) = %d, want %d", tc.code, tc.signal, got, tc.want)
		}
	}
}
