package runcode_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/runcode"
	"github.com/airlock-sandbox/airlock/runcode/runcodetest"
)

// TestLocalPoolSameResults: runs served from a warm pool give what cold runs give, each in a
// sandbox of its own that is gone once the pool has terminated it.
func TestLocalPoolSameResults(t *testing.T) {
	b := runcodetest.Backend(t, agentBin)
	ctx := t.Context()
	pool, err := local.NewPool(ctx, b, runcode.PoolTemplate(runcode.Options{}, time.Minute), local.PoolOptions{Size: 2, IdleExpiry: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := pool.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	corpus := []runcode.Request{
		{Language: "python", Code: "import json, sys\nprint(json.dumps({'v': sys.version_info[0]}))"},
		{Language: "python", Code: "import sys\nprint(sys.stdin.read()[::-1])", Stdin: "olleh"},
		{Language: "python", Code: "raise KeyError('k')"},
		{Language: "bash", Code: "echo err >&2; exit 7"},
		{Language: "python", Code: "print('x' * 3000000)"},
		// A fresh sandbox each time: what an earlier run left is not there.
		{Language: "bash", Code: "ls -A /tmp /workspace; touch /tmp/left-behind /workspace/left-behind"},
		{Language: "bash", Code: "ls -A /tmp /workspace; touch /tmp/left-behind /workspace/left-behind"},
		{Language: "bash", Code: "sleep 100", TimeoutSeconds: 1},
	}
	for _, req := range corpus {
		waitFor(t, func() bool { return pool.Stats().Size > 0 })
		cold, err := runcode.Run(ctx, b, req, runcode.Options{})
		if err != nil {
			t.Fatal(err)
		}
		warm, err := runcode.Run(ctx, b, req, runcode.Options{Pool: pool})
		if err != nil {
			t.Fatal(err)
		}
		if warm.ExitCode != cold.ExitCode || warm.Stdout != cold.Stdout || warm.TimedOut != cold.TimedOut || warm.Truncated != cold.Truncated ||
			lastLine(warm.Stderr) != lastLine(cold.Stderr) {
			t.Errorf("%s %q: warm %+v, cold %+v", req.Language, req.Code, brief(warm), brief(cold))
		}
	}
	if st := pool.Stats(); st.Hits != uint64(len(corpus)) {
		t.Errorf("pool stats %+v: want every warm run a hit", st)
	}
	// Discarded sandboxes are terminated by the pool's reaper.
	waitFor(t, func() bool {
		list, _ := b.List(ctx)
		return len(list) == pool.Stats().Size
	})
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

func brief(r runcode.Result) runcode.Result {
	if len(r.Stdout) > 80 {
		r.Stdout = r.Stdout[:80] + "..."
	}
	return r
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
