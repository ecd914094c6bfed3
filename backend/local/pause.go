package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/airlock-sandbox/airlock/backend/local/pause"
	"github.com/airlock-sandbox/airlock/backend/local/sessions"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// Pause and resume use the cgroup freezer (v1 freezer.state, v2 cgroup.freeze). The kernel's
// freezer state is the only record of a pause: every process sharing the state dir sees it, and
// a sandbox stays paused across a restart of the process that paused it. A gVisor sandbox is
// paused by runsc instead (its Sentry stops its tasks; see suspend), recorded by a mark file in
// its session dir, which every process sharing the state dir sees too.
//
// Clocks while paused:
//   - the lifetime keeps running: a sandbox paused past its expiry is terminated then (the
//     native init, frozen, cannot end itself, so the backend does; a paused sandbox whose
//     expiry passes while no airlock process runs is ended by the next one's reconcile);
//   - an exec's timeout is wall-clock too: one that expires while paused ends, timed out,
//     as soon as the sandbox resumes;
//   - the idle timeout is not enforced by this backend yet (capability idleTimeout). When it
//     is, paused time must not count as idle; the agent's idle clock (CLOCK_MONOTONIC) runs
//     while frozen, so it has to discount a freeze before that wiring lands.
//
// While paused, every agent call through Connect is refused with sandbox.ErrConflict rather
// than waiting on an agent that cannot answer; a call already in flight when the pause comes
// simply continues after the resume.

var _ sandbox.Pauser = (*Backend)(nil)

// The freezer and the read of its state are parked sandboxes' (a claimer checks a parked sandbox is not paused).
type freezer = sessions.Freezer

// freezer is the session's freezer; a gVisor session's records its pause in a mark file.
func (s *session) freezer() freezer {
	f := sessions.FreezerOf(&s.rec.RecordCore)
	if s.rec.Runtime == string(spec.RuntimeGVisor) {
		f.Mark = filepath.Join(s.dir, sessions.PauseMark)
	}
	return f
}

// setFrozen freezes or thaws the sandbox and waits, bounded, until every task has settled in
// that state.
func setFrozen(ctx context.Context, f freezer, frozen bool) error {
	if f.Version == 1 {
		state := "THAWED"
		if frozen {
			state = "FROZEN"
		}
		// v1Cgroup.setFreezer wants the cgroup path below the hierarchy.
		rel, err := filepath.Rel(filepath.Join(cgroupRoot, "freezer"), f.Dir)
		if err != nil {
			return err
		}
		return (&v1Cgroup{path: "/" + rel}).setFreezer(ctx, state)
	}
	return pause.SetV2(ctx, f.Dir, frozen)
}

// paused is the session's pause state as the kernel has it; false when it cannot be read (the
// sandbox is going or gone, and its other state says so).
func (s *session) paused() bool {
	p, err := s.freezer().Paused()
	return err == nil && p
}

// suspend pauses (frozen) or resumes the sandbox. A gVisor sandbox is paused by runsc, never by
// the freezer: frozen while its Sentry's platform (systrap) drives a stub process through
// ptrace, the Sentry panics ("ptrace status unexpected", "failed getting response from syscall
// thread") and the sandbox is lost (docs/pause.md), and runsc delete waits forever on a frozen
// Sentry. runsc pause stops the Sentry's tasks, each where its state is whole; the Sentry then
// idles (0.25 ms of CPU in 5 s). The mark is made before the pause and removed after the
// resume, so a call is refused for as long as the sandbox may be paused.
func (b *Backend) suspend(ctx context.Context, s *session, frozen bool) error {
	fz := s.freezer()
	if fz.Mark == "" {
		return setFrozen(ctx, fz, frozen)
	}
	rs, err := b.runsc()
	if err != nil {
		return err
	}
	if frozen {
		if err := os.WriteFile(fz.Mark, nil, 0o600); err != nil {
			return err
		}
		return rs.SetPaused(ctx, s.dir, s.rec.ID, true)
	}
	if err := rs.SetPaused(ctx, s.dir, s.rec.ID, false); err != nil {
		return err
	}
	if err := os.Remove(fz.Mark); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// Pause stops every process of the sandbox: it uses no CPU and keeps its memory, processes and
// open connections. Pausing a paused sandbox succeeds.
func (b *Backend) Pause(ctx context.Context, sessionID string) error {
	s, err := b.lookup(ctx, sessionID)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone || s.exited() {
		return fmt.Errorf("%w: session %s has ended", sandbox.ErrNotFound, sessionID)
	}
	if err := b.suspend(ctx, s, true); err != nil {
		// Half-frozen is neither state: go back to running, and say why.
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pause.Timeout)
		defer cancel()
		if terr := b.suspend(tctx, s, false); terr != nil {
			return fmt.Errorf("%w: pause %s: %v (and thawing again failed: %v)", sandbox.ErrOutcomeUnknown, sessionID, err, terr)
		}
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: session %s: its cgroup is gone", sandbox.ErrNotFound, sessionID)
		}
		return fmt.Errorf("pause %s: %w", sessionID, err)
	}
	b.armPausedExpiryLocked(s)
	b.log.Debug("sandbox paused", "session", sessionID)
	return nil
}

// Resume thaws a paused sandbox: every process continues where it stopped. Resuming a running
// sandbox succeeds.
func (b *Backend) Resume(ctx context.Context, sessionID string) error {
	s, err := b.lookup(ctx, sessionID)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone || s.exited() {
		return fmt.Errorf("%w: session %s has ended", sandbox.ErrNotFound, sessionID)
	}
	if err := b.suspend(ctx, s, false); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: session %s: its cgroup is gone", sandbox.ErrNotFound, sessionID)
		}
		return fmt.Errorf("%w: resume %s: %v", sandbox.ErrOutcomeUnknown, sessionID, err)
	}
	if s.rec.Runtime != string(spec.RuntimeGVisor) && s.stopTimer != nil {
		// Running again, the native init enforces its deadline itself.
		s.stopTimer()
		s.stopTimer = nil
	}
	b.log.Debug("sandbox resumed", "session", sessionID)
	return nil
}

// armPausedExpiryLocked ends a paused native sandbox at its expiry: its init, frozen, cannot.
// A gVisor sandbox's lifetime timer already runs in this process. The caller holds s.mu.
func (b *Backend) armPausedExpiryLocked(s *session) {
	if s.rec.Runtime == string(spec.RuntimeGVisor) || s.stopTimer != nil {
		return
	}
	timer := time.AfterFunc(time.Until(s.rec.ExpiresAt), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := b.destroy(ctx, s.rec.ID, s); err != nil {
			b.log.Error("end expired paused sandbox", "session", s.rec.ID, "err", err)
		}
	})
	s.stopTimer = func() { timer.Stop() }
}

// adoptedPaused arms the expiry of a paused sandbox another process left (see adopt).
func (b *Backend) adoptedPaused(s *session) {
	if !s.paused() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	b.armPausedExpiryLocked(s)
}

// checkAgent is adopt's proof of life: the agent answers for the right sandbox. A paused
// sandbox's agent cannot answer; its init is alive (the caller holds its pidfd) and that is
// enough: it answers once resumed. The client that asked is kept as the session's cached client
// (its connection open): a lookup adopts on the way to a Connect, which takes it.
func (b *Backend) checkAgent(ctx context.Context, s *session) error {
	if s.paused() {
		return nil
	}
	c := b.client(s)
	h, err := c.Health(ctx)
	if err == nil && h.SandboxID != s.rec.SandboxID {
		err = fmt.Errorf("agent answered for sandbox %q, want %q", h.SandboxID, s.rec.SandboxID)
	}
	if err != nil {
		c.Close()
		return err
	}
	s.cachedClient.Store(c)
	return nil
}

// pausableClient is the agent client Connect returns: refused while the sandbox is paused.
func (b *Backend) pausableClient(s *session) *pause.Agent {
	return pause.NewAgent(b.client(s), s.freezer(), s.rec.ID)
}

// frozen reports whether the v1 cgroup is paused (kill must thaw it for the kill to land).
func (c *v1Cgroup) frozen() bool {
	p, err := freezer{Version: 1, Dir: c.dir("freezer")}.Paused()
	return err == nil && p
}
