package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestThousandCycles: 1,000 create/exec/terminate cycles leave no cgroup, directory, process
// or mount behind.
func TestThousandCycles(t *testing.T) {
	if testing.Short() {
		t.Skip("1,000 sandboxes: run without -short")
	}
	b := newTestBackend(t)
	ctx := context.Background()
	type seen struct {
		id  string
		pid int
	}
	var all []seen
	for i := range 1000 {
		s, err := b.Create(ctx, hostDecl(fmt.Sprintf("cycle-%d", i)))
		if err != nil {
			t.Fatalf("cycle %d: create: %v", i, err)
		}
		pid := b.sessionInitPID(s.ID)
		a, err := b.Connect(ctx, s.ID)
		if err != nil {
			t.Fatalf("cycle %d: connect: %v", i, err)
		}
		out, _, res := run(t, a, "echo $((6*7))")
		a.Close()
		if out != "42\n" || res.ExitCode != 0 {
			t.Fatalf("cycle %d: exec: %q %+v", i, out, res)
		}
		if err := b.Terminate(ctx, s.ID); err != nil {
			t.Fatalf("cycle %d: terminate: %v", i, err)
		}
		all = append(all, seen{s.ID, pid})
	}
	for _, s := range all {
		if left := leftovers(b, s.id, s.pid); len(left) > 0 {
			t.Errorf("%s left %v", s.id, left)
		}
	}
	for _, d := range cgroupParentDirs(b) {
		entries, _ := os.ReadDir(d)
		if len(entries) > 0 {
			var names []string
			for _, e := range entries {
				if e.IsDir() {
					names = append(names, e.Name())
				}
			}
			if len(names) > 0 {
				t.Errorf("cgroups left under %s: %v", d, names)
			}
		}
	}
	if left := stateLeftovers(b.opts.StateDir); len(left) > 0 {
		t.Errorf("state dir holds %v after 1,000 cycles", left)
	}
	// A host /etc change during the run (an apt install elsewhere rewrites ld.so.cache) makes the
	// next create build a new copy; the superseded one is reclaimed by the next start, which
	// holds the state dir's exclusive lock (no create of another process can be choosing it).
	b.Close()
	newTestBackendAt(t, b.opts.StateDir)
	if copies, _ := os.ReadDir(filepath.Join(b.opts.StateDir, etcCacheDir)); len(copies) > 2 {
		t.Errorf("/etc copies after 1,000 cycles and a restart: %d entries, want one copy and its manifest", len(copies))
	}
}
