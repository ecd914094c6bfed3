package local

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/sandbox"
)

// TestTerminateFrozenExecCgroup: an exec's cgroup frozen on its own (the agent freezes one while
// it kills it, and may be killed itself before it thaws it) does not keep its processes, and so
// the sandbox, alive past terminate: thawing the sandbox's cgroup alone leaves such a child
// frozen.
func TestTerminateFrozenExecCgroup(t *testing.T) {
	x := newBox(t, nil)
	pid := x.b.sessionInitPID(x.sess.ID)
	execDone := make(chan error, 1)
	go func() {
		_, err := x.a.Exec(context.Background(), sandbox.ExecRequest{Shell: "echo started; exec sleep 1000", Timeout: 5 * time.Minute}, io.Discard, io.Discard)
		execDone <- err
	}()
	// The exec's own cgroup, once its process is in it.
	var execCg string
	deadline := time.Now().Add(30 * time.Second)
	for execCg == "" {
		dirs, _ := filepath.Glob(x.cgroupFile("freezer", map[int]string{1: "exec-*", 2: "code/exec-*"}[x.b.cg.version()]))
		for _, d := range dirs {
			if b, err := os.ReadFile(filepath.Join(d, "cgroup.procs")); err == nil && strings.TrimSpace(string(b)) != "" {
				execCg = d
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the exec's cgroup never held its process")
		}
		time.Sleep(10 * time.Millisecond)
	}
	file, frozen := "freezer.state", "FROZEN"
	if x.b.cg.version() == 2 {
		file, frozen = "cgroup.freeze", "1"
	}
	if err := os.WriteFile(filepath.Join(execCg, file), []byte(frozen), 0); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := x.b.Terminate(ctx, x.sess.ID); err != nil {
		t.Fatalf("terminate with a frozen exec cgroup: %v", err)
	}
	assertGone(t, x.b, x.sess.ID, pid)
	select {
	case <-execDone:
	case <-time.After(30 * time.Second):
		t.Fatal("the exec call did not end with its sandbox")
	}
}
