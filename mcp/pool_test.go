package mcp_test

import (
	"context"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/mcp"
	"github.com/airlock-sandbox/airlock/runcode"
	"github.com/airlock-sandbox/airlock/runcode/runcodetest"
)

// TestLocalRunCodePool: with a pool, run_code claims warm sandboxes, still one per call.
func TestLocalRunCodePool(t *testing.T) {
	b := runcodetest.Backend(t, agentBin)
	pool, err := local.NewPool(t.Context(), b, runcode.PoolTemplate(runcode.Options{}, time.Minute), local.PoolOptions{Size: 1, IdleExpiry: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := pool.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	s := mcp.New(b, mcp.Options{Logger: quiet, Pool: pool})
	defer s.Close(context.Background())
	cs := connect(t, s)
	var ids []string
	for i := range 2 {
		deadline := time.Now().Add(30 * time.Second)
		for pool.Stats().Size == 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		r := call(t, cs, "run_code", map[string]any{"language": "python", "code": "print(6*7)"})
		if r.IsError {
			t.Fatalf("run %d: tool error: %s", i, text(r))
		}
		if got, want := text(r), "Exit code: 0\n\n--- stdout ---\n42\n"; got != want {
			t.Errorf("run %d: text %q, want %q", i, got, want)
		}
		ids = append(ids, structured[runcode.Result](t, r).SandboxID)
	}
	if ids[0] == ids[1] {
		t.Errorf("two runs shared sandbox %s", ids[0])
	}
	if st := pool.Stats(); st.Hits != 2 || st.Misses != 0 {
		t.Errorf("pool stats %+v, want 2 hits", st)
	}
}
