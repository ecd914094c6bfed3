package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/runcode"
	"github.com/airlock-sandbox/airlock/spec"
)

// pooledRun is one run_code call through the pool: call to result.
func pooledRun(be *local.Backend, p *local.Pool, rootfs string) error {
	res, _, err := runcode.RunDetached(context.Background(), be, runcode.Request{Language: "python", Code: snippet},
		runcode.Options{Image: spec.Image{Dir: rootfs}, Pool: p, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	if res.ExitCode != 0 || strings.TrimSpace(res.Stdout) != "4" {
		return fmt.Errorf("pooled run: exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	return nil
}

// parkedOne waits until a parked sandbox is parked in the state dir and no filler runs for it.
func parkedOne(state string) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		keys, _ := filepath.Glob(filepath.Join(local.ParkedDir(state), "*", "s-*"))
		if len(keys) > 0 && len(testutil.PoolFillers(state)) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(local.ParkedDir(state), "fill.log"))
			return fmt.Errorf("no spare parked in %s within 2 minutes; filler log:\n%s", state, log)
		}
		time.Sleep(time.Millisecond)
	}
}

// terminateParked, at the benchmark's end, waits for fillers and terminates the sandboxes parked
// in be's state dir (they would otherwise live out their lifetime).
func terminateParked(b *testing.B, be *local.Backend, state string) {
	b.Cleanup(func() {
		for deadline := time.Now().Add(2 * time.Minute); len(testutil.PoolFillers(state)) > 0 && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		// Parked parked sandboxes are their fillers' until claimed (List does not show them): claimed and
		// terminated as airlock gc --pool does, before the state dir's cgroup parent goes.
		if _, err := be.RetireParked(context.Background(), false); err != nil {
			b.Errorf("terminating the parked sandboxes: %v", err)
		}
	})
}
