package agent

import (
	"slices"
	"syscall"
	"testing"
)

func TestParseStatPPID(t *testing.T) {
	for _, tc := range []struct {
		line string
		ppid int
		ok   bool
	}{
		{"42 (sleep) S 7 42 42 0 -1 4194304", 7, true},
		{"42 (a b) c) R 9 42 42", 9, true}, // a command name may hold spaces and ')'
		{"42 ()) Z 1 0", 1, true},
		{"42 (sleep S 7", 0, false},
		{"42 (sleep) S", 0, false},
		{"42 (sleep) S x", 0, false},
	} {
		ppid, ok := parseStatPPID([]byte(tc.line))
		if ppid != tc.ppid || ok != tc.ok {
			t.Errorf("%q: %d %v, want %d %v", tc.line, ppid, ok, tc.ppid, tc.ok)
		}
	}
}

func TestParseReaperLine(t *testing.T) {
	for _, tc := range []struct {
		line     string
		pid      int
		startErr error
		exit     *reaperExit
		bad      bool
	}{
		{line: "p 1234", pid: 1234},
		{line: "e 2", startErr: syscall.ENOENT},
		{line: "x 0 1", exit: &reaperExit{status: 0, swept: true}},
		{line: "x 65280 0", exit: &reaperExit{status: 255 << 8}},   // exit 255, not all gone
		{line: "x 9 1", exit: &reaperExit{status: 9, swept: true}}, // SIGKILL
		{line: "", bad: true},
		{line: "p", bad: true},
		{line: "p 0", bad: true},
		{line: "p -3", bad: true},
		{line: "e 0", bad: true},
		{line: "x 0", bad: true},
		{line: "x 0 2", bad: true},
		{line: "x -1 1", bad: true},
		{line: "q 1", bad: true},
	} {
		pid, startErr, exit, err := parseReaperLine(tc.line)
		if (err != nil) != tc.bad || pid != tc.pid || startErr != tc.startErr ||
			(exit == nil) != (tc.exit == nil) || exit != nil && *exit != *tc.exit {
			t.Errorf("%q: %d %v %+v %v", tc.line, pid, startErr, exit, err)
		}
	}
}

func TestReaperArgv(t *testing.T) {
	for _, tc := range []struct {
		tty  bool
		cred *syscall.Credential
		want []string
	}{
		{false, nil, []string{reaperArg0, "-", "-", "/bin/sh", "sh", "-c", "x"}},
		{true, &syscall.Credential{Uid: 65534, Gid: 100}, []string{reaperArg0, "tty", "65534:100", "/bin/sh", "sh", "-c", "x"}},
	} {
		if got := reaperArgv("/bin/sh", []string{"sh", "-c", "x"}, tc.tty, tc.cred); !slices.Equal(got, tc.want) {
			t.Errorf("%v %+v: %q, want %q", tc.tty, tc.cred, got, tc.want)
		}
	}
}
