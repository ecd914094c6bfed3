package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"github.com/airlock-sandbox/airlock/backend/local/stats"
	"github.com/airlock-sandbox/airlock/sandbox"
)

var _ sandbox.StatsReader = (*Backend)(nil)

// Stats is the sandbox's usage as its cgroup counts it (every process of the sandbox, the
// agent included): cpu time, memory now and at most, processes and threads now. The counters
// are hierarchical, so the agent's per-exec cgroups below the sandbox's are in them.
func (b *Backend) Stats(ctx context.Context, sessionID string) (sandbox.Stats, error) {
	s, err := b.lookup(ctx, sessionID)
	if err != nil {
		return sandbox.Stats{}, err
	}
	if s.exited() {
		return sandbox.Stats{}, fmt.Errorf("%w: session %s has ended", sandbox.ErrNotFound, sessionID)
	}
	st, err := stats.Read(s.rec.CgroupVersion, s.rec.Cgroup)
	if errors.Is(err, fs.ErrNotExist) {
		return sandbox.Stats{}, fmt.Errorf("%w: session %s: its cgroup is gone", sandbox.ErrNotFound, sessionID)
	}
	if err != nil {
		return sandbox.Stats{}, fmt.Errorf("stats of %s: %w", sessionID, err)
	}
	return st, nil
}
