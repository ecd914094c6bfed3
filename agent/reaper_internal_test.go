package agent

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
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

// TestReaperHandSpec: the command and its three stdio fds the agent hands a reaper arrive
// whole, the fds the same files (a write through one is read from the original pipe).
func TestReaperHandSpec(t *testing.T) {
	l, err := newReapLink()
	if err != nil {
		t.Fatal(err)
	}
	defer l.close()
	uid := uint32(65534)
	env := make([]string, 5000) // more than one socket buffer
	for i := range env {
		env[i] = fmt.Sprintf("K%d=%s", i, strings.Repeat("v", 100))
	}
	want := &reaperSpec{Path: "/bin/sh", Argv: []string{"sh", "-c", "x"}, Env: env, Dir: "/tmp", TTY: true, UID: &uid, GID: 100}
	var rs, ws [3]*os.File
	for i := range 3 {
		if rs[i], ws[i], err = os.Pipe(); err != nil {
			t.Fatal(err)
		}
		defer rs[i].Close()
		defer ws[i].Close()
	}
	handed := make(chan error, 1)
	go func() { handed <- l.hand(want, ws[:]) }()
	got, fds, err := readSpec(l.child)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-handed; err != nil {
		t.Fatal(err)
	}
	if got.Path != want.Path || !slices.Equal(got.Argv, want.Argv) || !slices.Equal(got.Env, want.Env) ||
		got.Dir != want.Dir || got.TTY != want.TTY || got.UID == nil || *got.UID != uid || got.GID != want.GID {
		t.Errorf("spec %+v, want %+v", got, want)
	}
	if len(fds) != 3 {
		t.Fatalf("%d fds, want 3", len(fds))
	}
	for i, fd := range fds {
		if _, err := unix.Write(fd, []byte{byte('a' + i)}); err != nil {
			t.Fatal(err)
		}
		unix.Close(fd)
		b := make([]byte, 1)
		if _, err := rs[i].Read(b); err != nil || b[0] != byte('a'+i) {
			t.Errorf("fd %d: read %q %v", i, b, err)
		}
	}
}
