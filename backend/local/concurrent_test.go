package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
)

// TestConcurrentTerminate: two processes sharing a state dir may end the same sandbox at once
// (a run's terminate and another process's reconcile reaping it, or two terminates): both
// succeed, and a New whose reconcile races a terminate starts. Each round races on fresh
// sandboxes; the kernel answers ENODEV for a cgroup removed while the other side reads it.
func TestConcurrentTerminate(t *testing.T) {
	b1 := newTestBackend(t)
	b2 := newTestBackendAt(t, b1.opts.StateDir)
	for round := range 8 {
		ids := make([]string, 3)
		pids := make([]int, 3)
		for i := range ids {
			s, err := b1.Create(t.Context(), hostDecl(fmt.Sprintf("race-%d-%d", round, i)))
			if err != nil {
				t.Fatal(err)
			}
			ids[i], pids[i] = s.ID, b1.sessionInitPID(s.ID)
		}
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for _, id := range ids {
			for _, b := range []*Backend{b1, b2} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := b.Terminate(context.Background(), id); err != nil {
						errs <- fmt.Errorf("terminate %s: %w", id, err)
					}
				}()
			}
		}
		// A third process starting on the state dir meanwhile: its reconcile finds the
		// sandboxes half-terminated and reaps them too.
		wg.Add(1)
		go func() {
			defer wg.Done()
			b3, err := New(context.Background(), Options{StateDir: b1.opts.StateDir, AgentPath: agentBin})
			if err != nil {
				errs <- fmt.Errorf("new during terminates: %w", err)
				return
			}
			b3.Close()
		}()
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("round %d: %v", round, err)
		}
		for i, id := range ids {
			assertGone(t, b1, id, pids[i])
		}
	}
}

// TestReconcileReportsReaped: what a New's reconcile removed is reported (airlock gc prints
// it), here an orphan cgroup no session owns.
func TestReconcileReportsReaped(t *testing.T) {
	b := newTestBackend(t)
	const id = "s-00000000000000aa"
	for _, d := range cgroupParentDirs(b) {
		if err := os.MkdirAll(filepath.Join(d, id), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b2 := newTestBackendAt(t, b.opts.StateDir)
	if got := b2.Reaped(); !slices.Contains(got, id) {
		t.Fatalf("reaped %v, want %s", got, id)
	}
	for _, d := range cgroupParentDirs(b) {
		if _, err := os.Stat(filepath.Join(d, id)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup %s left: %v", d, err)
		}
	}
	if got := b.Reaped(); len(got) != 0 {
		t.Errorf("the first backend reaped %v from an empty state dir", got)
	}
}
