package local

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/backend/local/spares"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// Pause and resume use the cgroup freezer (v1 freezer.state, v2 cgroup.freeze). The kernel's
// freezer state is the only record of a pause: every process sharing the state dir sees it, and
// a sandbox stays paused across a restart of the process that paused it.
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

// pauseTimeout bounds how long a freeze or thaw may take to settle.
const pauseTimeout = 2 * time.Second

// The freezer and the read of its state are spares' (a claimer checks a spare is not paused).
type freezer = spares.Freezer

func freezerOf(rec *record) freezer { return spares.FreezerOf(&rec.RecordCore) }

// parseFrozenEvent reads the "frozen" line of a v2 cgroup.events file: whether every task of
// the cgroup has actually stopped.
func parseFrozenEvent(r io.Reader) (bool, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == "frozen" {
			switch v {
			case "0":
				return false, nil
			case "1":
				return true, nil
			}
			return false, fmt.Errorf("cgroup.events: frozen %q", v)
		}
	}
	if err := sc.Err(); err != nil {
		return false, err
	}
	return false, errors.New("cgroup.events has no frozen line")
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
	want := "0"
	if frozen {
		want = "1"
	}
	if err := os.WriteFile(filepath.Join(f.Dir, "cgroup.freeze"), []byte(want), 0); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, pauseTimeout)
	defer cancel()
	for {
		ev, err := os.Open(filepath.Join(f.Dir, "cgroup.events"))
		if err != nil {
			return err
		}
		got, err := parseFrozenEvent(ev)
		ev.Close()
		if err != nil {
			return err
		}
		if got == frozen {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cgroup %s did not settle (frozen %v, wanted %v)", f.Dir, got, frozen)
		case <-time.After(time.Millisecond):
		}
	}
}

// paused is the session's pause state as the kernel has it; false when it cannot be read (the
// sandbox is going or gone, and its other state says so).
func (s *session) paused() bool {
	p, err := freezerOf(&s.rec).Paused()
	return err == nil && p
}

// Pause freezes every process of the sandbox: it uses no CPU and keeps its memory, processes and
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
	fz := freezerOf(&s.rec)
	if err := setFrozen(ctx, fz, true); err != nil {
		// Half-frozen is neither state: go back to running, and say why.
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pauseTimeout)
		defer cancel()
		if terr := setFrozen(tctx, fz, false); terr != nil {
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
	if err := setFrozen(ctx, freezerOf(&s.rec), false); err != nil {
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
// enough: it answers once resumed. The client that asked is kept as the session's warm one
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
	s.warm.Store(c)
	return nil
}

// pausableAgent is the agent client Connect returns: while the sandbox is paused, every call
// is refused at once with sandbox.ErrConflict instead of waiting on a frozen agent. The freezer
// is read on each call (a few microseconds), so a pause made by another process counts too.
type pausableAgent struct {
	*client.Client
	fz freezer
	id string
}

func (b *Backend) pausableClient(s *session) *pausableAgent {
	return &pausableAgent{Client: b.client(s), fz: freezerOf(&s.rec), id: s.rec.ID}
}

func (a *pausableAgent) check() error {
	if p, err := a.fz.Paused(); err == nil && p {
		return fmt.Errorf("%w: session %s is paused: resume it first", sandbox.ErrConflict, a.id)
	}
	return nil
}

func (a *pausableAgent) Health(ctx context.Context) (sandbox.Health, error) {
	if err := a.check(); err != nil {
		return sandbox.Health{}, err
	}
	return a.Client.Health(ctx)
}

func (a *pausableAgent) Shutdown(ctx context.Context) error {
	if err := a.check(); err != nil {
		return err
	}
	return a.Client.Shutdown(ctx)
}

func (a *pausableAgent) Exec(ctx context.Context, req sandbox.ExecRequest, stdout, stderr io.Writer) (sandbox.ExecResult, error) {
	if err := a.check(); err != nil {
		return sandbox.ExecResult{}, err
	}
	return a.Client.Exec(ctx, req, stdout, stderr)
}

func (a *pausableAgent) ExecStream(ctx context.Context, req sandbox.ExecRequest, opts ...client.ExecOption) (*client.Stream, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	return a.Client.ExecStream(ctx, req, opts...)
}

func (a *pausableAgent) ReadFile(ctx context.Context, path string, offset, length int64) (io.ReadCloser, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	return a.Client.ReadFile(ctx, path, offset, length)
}

func (a *pausableAgent) WriteFile(ctx context.Context, path string, r io.Reader, mode uint32) error {
	if err := a.check(); err != nil {
		return err
	}
	return a.Client.WriteFile(ctx, path, r, mode)
}

func (a *pausableAgent) Mkdir(ctx context.Context, path string, mode uint32) error {
	if err := a.check(); err != nil {
		return err
	}
	return a.Client.Mkdir(ctx, path, mode)
}

func (a *pausableAgent) List(ctx context.Context, path string) ([]sandbox.FileInfo, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	return a.Client.List(ctx, path)
}

func (a *pausableAgent) Stat(ctx context.Context, path string) (sandbox.FileInfo, error) {
	if err := a.check(); err != nil {
		return sandbox.FileInfo{}, err
	}
	return a.Client.Stat(ctx, path)
}

func (a *pausableAgent) Remove(ctx context.Context, path string, recursive bool) error {
	if err := a.check(); err != nil {
		return err
	}
	return a.Client.Remove(ctx, path, recursive)
}

func (a *pausableAgent) Rename(ctx context.Context, from, to string) error {
	if err := a.check(); err != nil {
		return err
	}
	return a.Client.Rename(ctx, from, to)
}

func (a *pausableAgent) StartProcess(ctx context.Context, req client.ProcessRequest, opts ...client.ExecOption) (client.Process, error) {
	if err := a.check(); err != nil {
		return client.Process{}, err
	}
	return a.Client.StartProcess(ctx, req, opts...)
}

func (a *pausableAgent) Processes(ctx context.Context) ([]client.Process, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	return a.Client.Processes(ctx)
}

func (a *pausableAgent) Process(ctx context.Context, id string) (client.Process, error) {
	if err := a.check(); err != nil {
		return client.Process{}, err
	}
	return a.Client.Process(ctx, id)
}

func (a *pausableAgent) RemoveProcess(ctx context.Context, id string) error {
	if err := a.check(); err != nil {
		return err
	}
	return a.Client.RemoveProcess(ctx, id)
}

func (a *pausableAgent) Attach(ctx context.Context, id string, fromStart bool) (*client.Stream, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	return a.Client.Attach(ctx, id, fromStart)
}

func (a *pausableAgent) WriteStdin(ctx context.Context, id string, r io.Reader, closeAfter bool) error {
	if err := a.check(); err != nil {
		return err
	}
	return a.Client.WriteStdin(ctx, id, r, closeAfter)
}

func (a *pausableAgent) Handoff(ctx context.Context, id string, req client.HandoffRequest) (*client.Stream, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	return a.Client.Handoff(ctx, id, req)
}

func (a *pausableAgent) Signal(ctx context.Context, id, signal string) error {
	if err := a.check(); err != nil {
		return err
	}
	return a.Client.Signal(ctx, id, signal)
}

func (a *pausableAgent) Wait(ctx context.Context, id string) (sandbox.ExecResult, error) {
	if err := a.check(); err != nil {
		return sandbox.ExecResult{}, err
	}
	return a.Client.Wait(ctx, id)
}

func (a *pausableAgent) Resize(ctx context.Context, id string, rows, cols int) error {
	if err := a.check(); err != nil {
		return err
	}
	return a.Client.Resize(ctx, id, rows, cols)
}

// frozen reports whether the v1 cgroup is paused (kill must thaw it for the kill to land).
func (c *v1Cgroup) frozen() bool {
	p, err := freezer{Version: 1, Dir: c.dir("freezer")}.Paused()
	return err == nil && p
}
