package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/backend/local/egresswire"
	"github.com/airlock-sandbox/airlock/backend/local/gvisor"
	"github.com/airlock-sandbox/airlock/backend/local/sessions"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/spec"
	"github.com/airlock-sandbox/airlock/token"
)

// reconcile adopts every live sandbox in the state dir and reaps every broken one, then every
// cgroup under this backend's parent that has no state dir. It runs under the exclusive lock.
func (b *Backend) reconcile(ctx context.Context) error {
	entries, err := os.ReadDir(b.opts.StateDir)
	if err != nil {
		return err
	}
	var errs []error
	known := map[string]bool{}
	for _, e := range entries {
		id := e.Name()
		if !e.IsDir() || checkSessionID(id) != nil {
			continue
		}
		known[id] = true
		dir := filepath.Join(b.opts.StateDir, id)
		// A sandbox whose init is exiting or a zombie is dead (a run's parked sandbox it killed, say):
		// reaped, not asked for its agent. pool.go: a pooled sandbox nobody claimed, whose
		// pool's process is gone, is reaped; pool_parked.go: so is a parked sandbox nobody can claim or use
		// any more.
		// stale.go: a one-shot sandbox whose creator is gone is reaped too; nobody may use it.
		if rec, err := readRecord(dir); err == nil && running(rec.InitPID, rec.InitStart) && !b.reapablePooled(dir, rec) && !b.reapableParked(dir, rec) && !b.reapableOrphan(rec) {
			if heldElsewhere(dir, rec.Spec.Labels) {
				// pool_held.go: another process's until claimed, and no lookup of this one finds
				// it; its claimer adopts it (and proves its agent) when it takes it.
				continue
			}
			if s, err := b.adopt(ctx, dir, rec); err == nil {
				s.dropCachedClient() // no Connect is on its way: no connection held open for one
				b.log.Info("adopted sandbox", "session", id, "sandbox", rec.SandboxID, "pid", rec.InitPID)
				continue
			} else {
				b.log.Warn("sandbox does not answer; reaping it", "session", id, "err", err)
			}
		}
		if err := b.destroy(ctx, id, nil); err != nil {
			errs = append(errs, err)
		} else {
			b.reaped = append(b.reaped, id)
			b.log.Info("reaped broken sandbox", "session", id)
		}
	}
	names, err := b.cg.list()
	if err != nil {
		errs = append(errs, err)
	}
	for _, id := range names {
		if known[id] || checkSessionID(id) != nil {
			continue
		}
		if err := b.destroy(ctx, id, nil); err != nil {
			errs = append(errs, err)
		} else {
			b.reaped = append(b.reaped, id)
			b.log.Info("reaped orphan cgroup", "session", id)
		}
	}
	// pool_parked.go: index entries of parked sandboxes reaped above.
	if err := b.sweepParkedIndex(); err != nil {
		errs = append(errs, err)
	}
	// idrange: ranges of sessions that are gone (adopted ones keep theirs).
	if err := b.ids.Sweep(b.opts.StateDir); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("reconcile %s: %w", b.opts.StateDir, errors.Join(errs...))
	}
	return nil
}

// reapableOrphan reports (and logs) a sandbox nobody may reattach to whose creator is gone.
func (b *Backend) reapableOrphan(rec *record) bool {
	if !creatorGone(rec) {
		return false
	}
	b.log.Info("reaping a sandbox nobody may reattach to whose creator is gone", "session", rec.ID, "sandbox", rec.SandboxID, "creator", rec.Creator)
	return true
}

// adopt takes over a live sandbox another process created: its agent must answer.
func (b *Backend) adopt(ctx context.Context, dir string, rec *record) (*session, error) {
	b.mu.Lock()
	if s := b.sessions[rec.ID]; s != nil {
		b.mu.Unlock()
		return s, nil
	}
	b.mu.Unlock()
	pidfd, err := unix.PidfdOpen(rec.InitPID, 0)
	if err != nil {
		return nil, fmt.Errorf("init %d: %w", rec.InitPID, err)
	}
	// Checked after opening the pidfd: the fd now pins this very process.
	if !alive(rec.InitPID, rec.InitStart) {
		unix.Close(pidfd)
		return nil, fmt.Errorf("init %d is gone", rec.InitPID)
	}
	key, err := token.DeriveKey(b.master, rec.ID)
	if err != nil {
		unix.Close(pidfd)
		return nil, err
	}
	s := &session{rec: *rec, dir: dir, key: key, done: make(chan struct{})}
	if rec.Runtime == "" {
		s.pidfd = pidfd // destroy signals init through it (gVisor's init is runsc's, stopped its own way)
	}
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// pause.go: the agent answers for the right sandbox, or the sandbox is paused.
	if err := b.checkAgent(hctx, s); err != nil {
		unix.Close(pidfd)
		return nil, err
	}
	b.mu.Lock()
	if prev := b.sessions[rec.ID]; prev != nil {
		b.mu.Unlock()
		s.dropCachedClient()
		unix.Close(pidfd)
		return prev, nil
	}
	b.sessions[rec.ID] = s
	b.mu.Unlock()
	b.watchAdopted(s, pidfd)
	if rec.Runtime == string(spec.RuntimeGVisor) {
		b.enforceLifetime(s)
	}
	b.adoptedPaused(s) // pause.go
	// egress.go: re-attached when the process that attached it is gone.
	b.adoptEgress(ctx, s)
	return s, nil
}

// shortHash is sessions.ShortHash (the /etc manifests' names use it too).
var shortHash = sessions.ShortHash

// probeCapabilities is what this backend enforces here.
//
// processLimit: limits.maxProcesses counts the code's processes and threads. The code lives in
// a pids cgroup of its own with exactly that limit (v1: the spawner thread's; v2: the parent of
// the per-exec cgroups); the sandbox's cgroup allows agentPidsHeadroom (32) more for the
// agent's own threads, so a fork bomb cannot starve the agent.
func probeCapabilities(cg cgroupDriver, runsc string) capability.Set {
	set := capability.Set{Platform: capability.Local, Entries: map[capability.Name]capability.Status{},
		Bounds: capability.Bounds{MaxProcesses: idRange}}
	no := func(n capability.Name, why string) { set.Entries[n] = capability.Status{Reason: why} }
	yes := func(n ...capability.Name) {
		for _, x := range n {
			set.Entries[x] = capability.Status{Supported: true}
		}
	}
	for _, n := range capability.Names {
		no(n, "not implemented by the local backend yet")
	}
	yes(capability.Files, capability.Reconnect, capability.EgressDeny, capability.SessionLifetime,
		capability.Env, capability.Stdin, capability.PTY, capability.BackgroundProcesses,
		capability.Labels, capability.Workdir, capability.ImageHost, capability.ImageDir,
		capability.ImageOCI, capability.ImageRef, capability.DiskLimit,
		capability.IdleTimeout) // the agent ends itself when idle (agent.Config.IdleTimeout)
	// The writable layer is tmpfs: files count against limits.memory (capability.LocalMemoryNote).
	set.Notes = map[capability.Property]string{capability.PropMemory: capability.LocalMemoryNote}
	if cg != nil {
		yes(capability.EnforcedLimits, capability.ProcessLimit)
		yes(capability.SuspendResume) // pause.go: the cgroup freezer
		yes(capability.Snapshot)      // snapshot.go: captured under the freezer
		yes(capability.Stats)         // stats.go: the sandbox's cgroup counters
	} else {
		no(capability.EnforcedLimits, "no usable cgroup hierarchy")
		no(capability.ProcessLimit, "no usable cgroup hierarchy")
		no(capability.Stats, "no usable cgroup hierarchy")
	}
	yes(capability.Preview) // preview.go
	no(capability.DockerRuntime, "the local backend runs sandboxes itself; use the docker platform")
	if _, err := gvisor.Find(runsc); err != nil {
		no(capability.GVisor, err.Error())
	} else if cg == nil {
		no(capability.GVisor, "no usable cgroup hierarchy")
	} else {
		yes(capability.GVisor)
	}
	egresswire.Capabilities(set.Entries) // publicOnlyEgress, domainEgressRules
	return set
}

// Reaped returns the sessions New's reconcile removed: broken sandboxes (their init gone, their
// agent not answering, a parked sandbox or pooled one nobody can use) and orphan cgroups.
func (b *Backend) Reaped() []string { return slices.Clone(b.reaped) }

// ReconcileError is New's error when its reconcile failed: what it reaped before that, too.
type ReconcileError struct {
	Reaped []string
	Err    error
}

func (e *ReconcileError) Error() string { return e.Err.Error() }
func (e *ReconcileError) Unwrap() error { return e.Err }
