package local

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/agent"
	"github.com/airlock-sandbox/airlock/backend/local/gvisor"
	"github.com/airlock-sandbox/airlock/backend/local/nsinit"
	"github.com/airlock-sandbox/airlock/backend/local/sessions"
	"github.com/airlock-sandbox/airlock/internal/backoff"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
	"github.com/airlock-sandbox/airlock/token"
)

// Runtime gvisor (package gvisor drives runsc): the session around a runsc container.

// runsc is runsc's command runner, runsc found once per backend.
func (b *Backend) runsc() (gvisor.Runsc, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.runscPath == "" {
		p, err := gvisor.Find(b.opts.RunscPath)
		if err != nil {
			return gvisor.Runsc{}, err
		}
		b.runscPath = p
	}
	return gvisor.Runsc{Bin: b.runscPath}, nil
}

// startGVisor is start for runtime gvisor.
func (b *Backend) startGVisor(ctx context.Context, id string, decl spec.Sandbox, r *resolved) (*session, error) {
	rs, err := b.runsc()
	if err != nil {
		return nil, err
	}
	// runsc's delete removes every cgroup directory its create made, the parent too when it
	// made that, and fails (EBUSY) while another sandbox is still in it: made here first,
	// the parent is never runsc's (seen on cgroup v2 with concurrent creates).
	if err := b.cg.ensureParent(); err != nil {
		return nil, fmt.Errorf("cgroup parent: %w", err)
	}
	dir := filepath.Join(b.opts.StateDir, id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("session dir: %w", err)
	}
	for _, d := range []string{"run", "bundle", "runsc"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			return nil, err
		}
	}
	key, err := token.DeriveKey(b.master, id)
	if err != nil {
		return nil, err
	}
	ring, err := token.NewKeyRing(key.Public().(ed25519.PublicKey)).MarshalText()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	s := &session{
		dir: dir, key: key, done: make(chan struct{}),
		rec: record{RecordCore: sessions.RecordCore{
			ID: id, SandboxID: decl.ID, Generation: 1, CreatedAt: now.UTC(), ExpiresAt: now.Add(r.lifetime).UTC(),
			Cgroup: path.Join("/", b.opts.CgroupParent, id), CgroupVersion: b.cg.version(), Runtime: string(spec.RuntimeGVisor),
			Creator: creatorOf(decl),
		}, Spec: decl},
	}
	acfg := agent.Config{
		SandboxID: decl.ID, SessionID: id, Generation: 1, KeyRing: string(ring),
		Listen: "unix:" + nsinit.AgentSocket, FilesRoot: "/",
		Workdir: r.workdir, Policy: r.policy, CodeUID: nsinit.CodeUID, CodeGID: nsinit.CodeGID,
	}
	acfgJSON, err := json.Marshal(acfg)
	if err != nil {
		return nil, err
	}
	agentCfg := filepath.Join(dir, "agent.json")
	if err := os.WriteFile(agentCfg, acfgJSON, 0o600); err != nil {
		return nil, err
	}
	image := ""
	if r.rootKind == nsinit.RootDir {
		image = r.rootSrc
	}
	rootPath, err := gvisor.Root(dir, image, r.workdir)
	if err != nil {
		return nil, err
	}
	js, err := json.MarshalIndent(gvisor.Spec(gvisor.Config{
		Dir: dir, Root: rootPath, HostImage: r.rootKind == nsinit.RootHost,
		AgentPath: b.agentPath, AgentArgs: b.agentArgs, AgentConfig: agentCfg,
		CgroupParent: b.opts.CgroupParent, Hostname: r.hostname, Workdir: r.workdir,
		CPUMillis: r.limits.CPUMillis, MemoryBytes: r.limits.MemoryBytes, DiskBytes: r.disk, MaxProcesses: r.limits.MaxProcesses,
	}), "", " ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "bundle", "config.json"), js, 0o600); err != nil {
		return nil, err
	}
	// gVisor writes a container's stdout at offset 0 of a regular file: give it its own file.
	logf, err := os.OpenFile(filepath.Join(dir, initLog), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	err = rs.Start(ctx, dir, id, logf)
	logf.Close()
	if err != nil {
		return s, fmt.Errorf("runsc run: %v%s", err, b.logTail(dir))
	}
	pid, err := rs.Pid(ctx, dir, id)
	if err != nil {
		return s, err
	}
	s.rec.InitPID = pid
	if s.rec.InitStart, err = startTime(pid); err != nil {
		return s, fmt.Errorf("runsc sandbox process %d: %w", pid, err)
	}
	// The agent listens once the Sentry has booted: poll its health until ctx ends.
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, startTimeout)
		defer cancel()
	}
	c := b.client(s)
	defer c.Close()
	for wait := backoff.New(5*time.Millisecond, 100*time.Millisecond); ; {
		hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		h, err := c.Health(hctx)
		cancel()
		if err == nil {
			if h.SandboxID != decl.ID {
				return s, fmt.Errorf("%w: agent of %s answered for sandbox %q", sandbox.ErrUnreachable, id, h.SandboxID)
			}
			break
		}
		if !alive(s.rec.InitPID, s.rec.InitStart) {
			return s, fmt.Errorf("gVisor sandbox exited before its agent answered: %v%s", err, b.logTail(dir))
		}
		if !wait.Wait(ctx) {
			return s, fmt.Errorf("%w: agent of %s did not answer: %v", sandbox.ErrDeadlineExceeded, id, err)
		}
	}
	if err := writeRecord(dir, &s.rec); err != nil {
		return s, err
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return s, err
	}
	b.mu.Lock()
	b.sessions[id] = s
	b.mu.Unlock()
	b.watchAdopted(s, pidfd)
	b.enforceLifetime(s)
	return s, nil
}

// enforceLifetime ends a gVisor session at its expiry: its agent has no deadline of its own
// (unlike the native init). A later New reaps one that expired while no process watched.
func (b *Backend) enforceLifetime(s *session) {
	d := time.Until(s.rec.ExpiresAt)
	// Held while arming: the callback's destroy takes the same lock and reads stopTimer.
	s.mu.Lock()
	defer s.mu.Unlock()
	timer := time.AfterFunc(d, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := b.destroy(ctx, s.rec.ID, s); err != nil {
			b.log.Error("end expired gVisor sandbox", "session", s.rec.ID, "err", err)
		}
	})
	s.stopTimer = func() { timer.Stop() }
}

// stopGVisor kills and deletes the runsc container; the caller then removes what remains.
func (b *Backend) stopGVisor(ctx context.Context, dir, id string) error {
	if _, err := os.Stat(filepath.Join(dir, "runsc")); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	rs, err := b.runsc()
	if err != nil {
		return err
	}
	return rs.Delete(ctx, dir, id)
}
