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

// newDirPool is a one-sandbox warm pool of rootfs with python pre-started, for the side-by-side
// table's airlock-library-pool row.
func newDirPool(b *testing.B, be *local.Backend, rootfs string) *local.Pool {
	b.Helper()
	quiet := slog.New(slog.DiscardHandler)
	pf, err := runcode.Prestart(runcode.PrestartOptions{Languages: []runcode.Language{runcode.Python}, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	opts := runcode.Options{Image: spec.Image{Dir: rootfs}}
	p, err := local.NewPool(context.Background(), be, runcode.PoolTemplate(opts, 10*time.Minute),
		local.PoolOptions{Size: 1, IdleExpiry: 10 * time.Minute, Logger: quiet, Prestart: pf})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := p.Close(context.Background()); err != nil {
			b.Error(err)
		}
	})
	return p
}

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

// settledPool waits until the pool holds a ready sandbox and creates or reaps nothing.
func settledPool(p *local.Pool) error {
	deadline := time.Now().Add(2 * time.Minute)
	for st := p.Stats(); st.Size < 1 || st.Creating > 0 || st.Reaping > 0; st = p.Stats() {
		if time.Now().After(deadline) {
			return fmt.Errorf("pool did not settle: %+v", st)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// parkedSpare waits until a spare is parked in the state dir and no filler runs for it.
func parkedSpare(state string) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		keys, _ := filepath.Glob(filepath.Join(local.SparesDir(state), "*", "s-*"))
		if len(keys) > 0 && len(testutil.SpareFillers(state)) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(local.SparesDir(state), "fill.log"))
			return fmt.Errorf("no spare parked in %s within 2 minutes; filler log:\n%s", state, log)
		}
		time.Sleep(time.Millisecond)
	}
}

// terminateSpares, at the benchmark's end, waits for fillers and terminates the spares parked
// in be's state dir (they would otherwise live out their lifetime).
func terminateSpares(b *testing.B, be *local.Backend, state string) {
	b.Cleanup(func() {
		for deadline := time.Now().Add(2 * time.Minute); len(testutil.SpareFillers(state)) > 0 && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		list, _ := be.List(context.Background())
		for _, s := range list {
			if s.Labels[local.LabelSpare] != "" {
				if err := be.Terminate(context.Background(), s.ID); err != nil {
					b.Errorf("terminating spare %s: %v", s.ID, err)
				}
			}
		}
	})
}
