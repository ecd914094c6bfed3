package agent_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/agent"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

// procFDRe matches ls's own open directory: /proc/self/fd as seen from ls.
var procFDRe = regexp.MustCompile(`^/proc/[0-9]+/fd$`)

// commandFDs runs `ls -l /proc/self/fd` through cl and returns the command's descriptors other
// than ls's own directory handle, as "fd -> target".
func commandFDs(t *testing.T, run func(sbtypes.ExecRequest) string) []string {
	t.Helper()
	out := run(sbtypes.ExecRequest{Argv: []string{"ls", "-l", "/proc/self/fd"}, Timeout: time.Minute})
	var fds []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		i := 0
		for i < len(f) && f[i] != "->" {
			i++
		}
		if i == 0 || i+1 >= len(f) {
			continue // "total 0", blank
		}
		if procFDRe.MatchString(f[i+1]) {
			continue
		}
		fds = append(fds, f[i-1]+" -> "+f[i+1])
	}
	return fds
}

// onlyStdio fails unless fds are exactly 0, 1 and 2.
func onlyStdio(t *testing.T, fds []string) {
	t.Helper()
	if len(fds) != 3 || !strings.HasPrefix(fds[0], "0 ") || !strings.HasPrefix(fds[1], "1 ") || !strings.HasPrefix(fds[2], "2 ") {
		t.Errorf("command has descriptors %q, want exactly 0, 1, 2", fds)
	}
}

// TestCommandsInheritOnlyStdio: a descriptor open in the agent's process without O_CLOEXEC
// (here opened by the embedding test; in a sandbox, left by the launcher) never reaches a
// command. internal/agentcmd tests the same through the binary with inherited descriptors.
func TestCommandsInheritOnlyStdio(t *testing.T) {
	h := newHarness(t)
	secret := filepath.Join(h.dir, "host-secret")
	if err := os.WriteFile(secret, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	// No O_CLOEXEC: what os.Open would never do, and what a careless launcher does.
	fd, err := unix.Open(secret, unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	dfd, err := unix.Open(h.dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dfd)
	cl, _ := serveInProcess(t, h, agent.Hooks{})
	fds := commandFDs(t, func(req sbtypes.ExecRequest) string {
		var out strings.Builder
		res, err := cl.Exec(context.Background(), req, &out, nil)
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec %+v %v", res, err)
		}
		return out.String()
	})
	onlyStdio(t, fds)
	for _, f := range fds {
		if strings.Contains(f, secret) || strings.HasSuffix(f, h.dir) {
			t.Errorf("command inherited %s", f)
		}
	}
}
