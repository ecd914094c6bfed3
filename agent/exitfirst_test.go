package agent_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
	"github.com/airlock-sandbox/airlock/token"
)

// doomed reports whether pid can no longer run code of its own: gone, a zombie, exiting
// (PF_EXITING), or with SIGKILL pending.
func doomed(pid int) bool {
	if !alive(pid) {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) > 6 {
		if flags, err := strconv.ParseUint(f[6], 10, 64); err == nil && flags&0x4 != 0 { // PF_EXITING
			return true
		}
	}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return true
	}
	for _, line := range strings.Split(string(st), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "SigPnd" && k != "ShdPnd") {
			continue
		}
		if mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64); err == nil && mask&(1<<(9-1)) != 0 { // SIGKILL
			return true
		}
	}
	return false
}

// runProcess starts req as a background process, reads its output to the terminal frame and
// returns both; the pids the script wrote to dir/p* are checked by the caller.
func runProcess(t *testing.T, ctx context.Context, cl *client.Client, req client.ProcessRequest) (string, sbtypes.ExecResult) {
	t.Helper()
	p, err := cl.StartProcess(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	s, err := cl.Attach(ctx, p.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var out strings.Builder
	res, err := s.Wait(&out, nil)
	if err != nil {
		t.Fatal(err)
	}
	return out.String(), res
}

// TestProcessExitFirst: a background process started with ExitFirst reports the same exit and
// output as one without; by the time its exit arrives, what it left holding its output has
// been sent SIGKILL (the guard: the output must end where it would have), and everything it
// left and the exec cgroup are gone soon after. Checked to fail with the kill in
// execGroup.killListed removed (the leftover holding stdout is alive at the report).
func TestProcessExitFirst(t *testing.T) {
	for kind, setup := range killScopes(t) {
		t.Run(kind, func(t *testing.T) {
			h := newHarness(t)
			base := setup(h)
			h.start()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			tests := []struct {
				name   string
				script string // %[1]s: a directory for pid files p1, p2
				pids   int
				output int // how many of the pids hold the output
			}{
				{"clean exit", "echo done", 0, 0},
				{"exit code", "echo out; exit 7", 0, 0},
				{"signal", "kill -TERM $$", 0, 0},
				{"leftovers", `cd %[1]s; setsid sleep 1000 >/dev/null 2>&1 </dev/null & echo $! > p1; sleep 1001 >/dev/null 2>&1 </dev/null & echo $! > p2; echo done`, 2, 0},
				{"leftover holding stdout", `cd %[1]s; (sleep 0.3; echo late) & echo $! > p1; echo done`, 1, 1},
				{"leftovers, one holding stderr", `cd %[1]s; (sleep 0.3; echo late >&2) & echo $! > p1; sleep 1000 >/dev/null 2>&1 </dev/null & echo $! > p2; echo done`, 2, 1},
			}
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					var outs [2]string
					var results [2]sbtypes.ExecResult
					for i, first := range []bool{false, true} {
						dir := t.TempDir()
						req := client.ProcessRequest{ExecRequest: sbtypes.ExecRequest{Shell: fmt.Sprintf(tc.script, dir), Timeout: time.Minute}, ExitFirst: first}
						outs[i], results[i] = runProcess(t, ctx, h.cl, req)
						var pids []int
						for n := 1; n <= tc.pids; n++ {
							pids = append(pids, readPid(t, filepath.Join(dir, fmt.Sprintf("p%d", n))))
						}
						for _, pid := range pids[:tc.output] {
							if !doomed(pid) {
								t.Errorf("exitFirst %v: pid %d left by the process still runs when its exit is reported", first, pid)
							}
						}
						requireAllDead(t, pids)
						eventually(t, "exec cgroups removed", func() bool { return len(execCgroups(t, base)) == 0 })
					}
					if outs[0] != outs[1] {
						t.Errorf("stdout %q with exitFirst, %q without", outs[1], outs[0])
					}
					a, b := results[0], results[1]
					a.Duration, b.Duration = 0, 0
					if a != b {
						t.Errorf("result %+v with exitFirst, %+v without", b, a)
					}
				})
			}
		})
	}
}

// TestExecRefusesExitFirst: an exec's answer promises that nothing it started runs on, so an
// exec cannot ask for its exit first.
func TestExecRefusesExitFirst(t *testing.T) {
	h := newHarness(t).start()
	code, body := h.raw(http.MethodPost, "/v1/exec", h.token(token.Execute, nil), strings.NewReader(`{"argv":["true"],"timeoutMs":1000,"exitFirst":true}`))
	if code != http.StatusBadRequest || !strings.Contains(string(body), "exitFirst") {
		t.Errorf("exec with exitFirst: %d %s, want 400 naming exitFirst", code, body)
	}
}
