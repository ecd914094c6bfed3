//go:build linux

package sessions

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
	"github.com/airlock-sandbox/airlock/token"
)

// Claim takes a parked sandbox of key (newest first) that this process can use at once, with at
// least minLeft of its lifetime left. No sandbox parked (or every one taken by other claimers):
// nil, nil, nil. The parked sandboxes it took but cannot use (record unreadable or for another session,
// a gVisor one, init gone, too little lifetime left, a stale /etc copy, paused, an agent that
// does not answer for it) are returned in discarded: they are this process's claims, for the
// caller to terminate through the full runtime (or, were it to exit first, for the next
// reconcile to reap).
func Claim(ctx context.Context, stateDir, key string, minLeft time.Duration) (c *Claimed, discarded []string, err error) {
	parked, err := ParkedIDs(stateDir, key)
	if err != nil || len(parked) == 0 {
		return nil, nil, err
	}
	owner, err := SelfProc()
	if err != nil {
		return nil, nil, err
	}
	master, err := statedir.ReadMaster(stateDir)
	if err != nil {
		return nil, nil, err
	}
	for _, id := range parked {
		if !Take(stateDir, key, id, owner) {
			continue // another claimer won it
		}
		e, err := ReadTaken(stateDir, id, owner)
		var c *Claimed
		if err == nil {
			c, err = open(ctx, stateDir, e, master, minLeft)
		}
		if err == nil {
			prev := LastClaim(stateDir, key)
			StampClaim(stateDir, key)
			c.Left = len(parked) - 1 - len(discarded)
			c.BackToBack = !prev.IsZero() && time.Since(prev) < ParkQuiet
			return c, discarded, nil
		}
		discarded = append(discarded, id)
		if ctx.Err() != nil {
			return nil, discarded, fmt.Errorf("%w: claiming a parked sandbox: %v", sbtypes.ErrDeadlineExceeded, context.Cause(ctx))
		}
	}
	return nil, discarded, nil
}

// open checks a parked sandbox just taken and connects to it.
func open(ctx context.Context, stateDir string, e Entry, master []byte, minLeft time.Duration) (_ *Claimed, err error) {
	dir := filepath.Join(stateDir, e.Session)
	rec, err := ReadRecord(dir)
	if err != nil {
		return nil, err
	}
	switch left := time.Until(rec.ExpiresAt); {
	case rec.ID != e.Session:
		return nil, fmt.Errorf("record of session %s names session %q", e.Session, rec.ID)
	case rec.Runtime != "":
		return nil, fmt.Errorf("runtime %q: only a native parked sandbox is claimed without the runtime", rec.Runtime)
	case !rec.ExpiresAt.IsZero() && left < minLeft:
		return nil, fmt.Errorf("%v of lifetime left, %v needed", left.Round(time.Second), minLeft)
	}
	pidfd, err := unix.PidfdOpen(rec.InitPID, 0)
	if err != nil {
		return nil, fmt.Errorf("init %d: %w", rec.InitPID, err)
	}
	defer func() {
		if err != nil {
			unix.Close(pidfd)
		}
	}()
	// Checked after opening the pidfd: the fd now pins this very process.
	if !Running(rec.InitPID, rec.InitStart) {
		return nil, fmt.Errorf("init %d is gone", rec.InitPID)
	}
	if p, err := FreezerOf(&rec.RecordCore).Paused(); err == nil && p {
		return nil, errors.New("paused")
	}
	tokens, err := claimTokens(e, master, rec)
	if err != nil {
		return nil, err
	}
	// The /etc check (stat calls and a manifest) overlaps the wait for the agent.
	etc := make(chan error, 1)
	go func() { etc <- EtcCurrent(stateDir, rec) }()
	agent := client.New("unix:"+filepath.Join(dir, "run", "agent.sock"), tokens)
	hctx, cancel := context.WithTimeout(ctx, HealthTimeout)
	h, err := agent.Health(hctx)
	cancel()
	if err == nil && h.SandboxID != rec.SandboxID {
		err = fmt.Errorf("agent answered for sandbox %q, want %q", h.SandboxID, rec.SandboxID)
	}
	if etcErr := <-etc; err == nil {
		err = etcErr
	}
	if err != nil {
		agent.Close()
		return nil, err
	}
	return &Claimed{ID: rec.ID, Record: rec, Prestart: e.Prestart, Agent: agent, pidfd: pidfd}, nil
}

// claimTokens is a claimer's token source: the filler's token (Entry.Token, valid as long as
// the sandbox, whose remaining lifetime open has checked), else tokens minted with the
// session's key (an entry parked without one).
func claimTokens(e Entry, master []byte, rec *Record) (func() string, error) {
	if e.Token != "" {
		return func() string { return e.Token }, nil
	}
	key, err := token.DeriveKey(master, rec.ID)
	if err != nil {
		return nil, err
	}
	return Tokens(key, rec.RecordCore, time.Now), nil
}

// Kill ends every process of the parked sandbox and returns once its init is gone: PID 1 of the
// sandbox's pid namespace, so the kernel has killed and reaped every other process there by
// then (the code's detached children too). Its cgroups and state dir stay for the full
// runtime to remove (backend/local's Terminate, by any process). When ctx ends first the
// error wraps sbtypes.ErrOutcomeUnknown. Kill releases the parked sandbox (Close) either way.
func (c *Claimed) Kill(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pidfd < 0 {
		if c.killed {
			return nil
		}
		return fmt.Errorf("%w: kill %s: released without a kill", sbtypes.ErrOutcomeUnknown, c.ID)
	}
	defer c.closeLocked()
	if err := SignalKill(c.pidfd, FreezerOf(&c.Record.RecordCore)); err != nil {
		return fmt.Errorf("%w: kill %s: %v", sbtypes.ErrOutcomeUnknown, c.ID, err)
	}
	if err := waitExitCtx(ctx, c.pidfd); err != nil {
		return fmt.Errorf("%w: kill %s: init %d still alive: %v", sbtypes.ErrOutcomeUnknown, c.ID, c.Record.InitPID, err)
	}
	c.killed = true
	return nil
}

// Close releases the parked sandbox without killing it (its init's pidfd, the agent client): the
// caller terminates it through the full runtime.
func (c *Claimed) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closeLocked()
}

func (c *Claimed) closeLocked() error {
	if c.pidfd < 0 {
		return nil
	}
	err := unix.Close(c.pidfd)
	c.pidfd = -1
	return errors.Join(err, c.Agent.Close())
}

// SignalKill sends SIGKILL to a sandbox's init through its pidfd (no pid reuse) and thaws the
// sandbox's freezer subtree, for a paused sandbox cannot die frozen. An init already gone is
// no error.
func SignalKill(pidfd int, fz Freezer) error {
	if err := unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return err
	}
	_ = fz.Thaw() // its cgroup may be gone already
	return nil
}

// WaitExit blocks until the process behind pidfd has exited (true: the pidfd turned
// readable), or stop (a file descriptor) is readable or closed at the other end, or polling
// fails (false).
func WaitExit(pidfd, stop int) bool {
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}, {Fd: int32(stop), Events: unix.POLLIN}}
	for {
		_, err := unix.Poll(fds, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil || fds[1].Revents != 0 {
			return false
		}
		if fds[0].Revents != 0 {
			return true
		}
	}
}

// waitExitCtx is WaitExit until ctx ends.
func waitExitCtx(ctx context.Context, pidfd int) error {
	stopR, stopW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer stopR.Close()
	stop := context.AfterFunc(ctx, func() { stopW.Close() })
	exited := WaitExit(pidfd, int(stopR.Fd()))
	if stop() {
		stopW.Close()
	}
	if exited {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return errors.New("poll of its pidfd failed")
}
