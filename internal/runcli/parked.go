package runcli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/airlock-sandbox/airlock/backend/local/sessions"
	"github.com/airlock-sandbox/airlock/internal/sched"
	"github.com/airlock-sandbox/airlock/runcode/core"
)

// Parked sandboxes for airlock run (docs/pool.md#parked-sandboxes-airlock-run): a run claims a sandbox parked in the state dir by
// an earlier run's filler, and starts a filler that parks the next one.

const (
	// killTimeout bounds the kill of a used parked sandbox.
	killTimeout = 30 * time.Second
	// aliasPrefix names an image's alias among the parked sandboxes' index dirs.
	aliasPrefix = "image-"
)

// AliasPath is where the filler of an image's parked sandboxes links their index, so that a run finds
// them by its --image alone: the index is named by the template's pool key, which only the full
// runtime computes. imageKey is ImageKey's.
func AliasPath(stateDir, imageKey string) string {
	h := sha256.Sum256([]byte(imageKey))
	return filepath.Join(sessions.ParkedDir(stateDir), aliasPrefix+hex.EncodeToString(h[:8]))
}

// WriteAlias points imageKey's alias at the index of key (a filler does, before it parks).
func WriteAlias(stateDir, imageKey, key string) error {
	p := AliasPath(stateDir, imageKey)
	if cur, err := os.Readlink(p); err == nil && cur == key {
		return nil
	}
	tmp := fmt.Sprintf("%s.tmp-%d", p, os.Getpid())
	_ = os.Remove(tmp)
	if err := os.Symlink(key, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, p); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}

// Filler is how to start the filler: the full CLI's executable, which parks parked sandboxes for Image
// in StateDir.
type Filler struct {
	Exe          string
	StateDir     string
	CgroupParent string
	ImageJSON    string
	Count        int
	// Missed: the run found nothing parked; the filler grows the parked count by one, within
	// the pool memory.
	Missed bool
	// Memory is the pool memory to give the filler (--pool-memory); "": it reads
	// $AIRLOCK_POOL_MEMORY (inherited), else the config file, else the default.
	Memory string
}

// Start starts a detached airlock __pool-fill: its own session, no terminal, standard
// streams on /dev/null (a caller reading this process's output to its end must not wait for
// it). It outlives this process and first terminates the sandboxes named. With gated, it does
// nothing until the returned gate is closed (or this process exits, which closes it): the
// write end of a pipe whose read end is the filler's fd 3.
func (f Filler) Start(terminate []string, gated bool) (gate io.Closer, err error) {
	args := []string{"__pool-fill", "--state-dir", f.StateDir, "--image-json", f.ImageJSON, "--count", strconv.Itoa(f.Count)}
	if f.CgroupParent != "" {
		args = append(args, "--cgroup-parent", f.CgroupParent)
	}
	if f.Missed {
		args = append(args, "--missed")
	}
	if f.Memory != "" {
		args = append(args, "--"+core.PoolMemoryFlag, f.Memory)
	}
	for _, id := range terminate {
		args = append(args, "--terminate", id)
	}
	// A filler runs idle (SCHED_IDLE) for its whole life, so that refilling takes only the CPU
	// the runs leave idle and never delays the run it refills for (a caller's next call, back
	// to back): its own start (~6 ms of CPU: the runtime, package inits), the terminate of the
	// used sandbox, and every sandbox it makes, whose init, agent and pre-started python
	// inherit it while they start. Each parked sandbox is put back to normal scheduling at
	// nice 0 before it is parked (local.ParkOptions.Raise): the code that claims it runs at the
	// priority of a sandbox made for it. The filler is born idle: started from a thread of
	// this process switched to SCHED_IDLE for the start (internal/sched). Only for a run as
	// root under normal scheduling at nice 0 (one that may put the parked sandbox back to
	// where it was).
	normal, nice := sched.Normal()
	idle := sched.Supported() && normal && nice == 0
	if idle {
		args = append(args, "--idle")
	}
	cmd := exec.Command(f.Exe, args...)
	cmd.SysProcAttr = ownSession()
	var w *os.File
	if gated {
		r, pw, err := os.Pipe() // close-on-exec: no other child inherits the write end
		if err != nil {
			return nil, err
		}
		defer r.Close()
		w = pw
		cmd.ExtraFiles = []*os.File{r}
		cmd.Args = append(cmd.Args, "--gate-fd", "3")
	}
	start := cmd.Start
	if idle {
		start = func() error { return sched.StartIdle(cmd.Start) }
	}
	if err := start(); err != nil {
		if w != nil {
			w.Close()
		}
		return nil, err
	}
	if w == nil {
		return nil, cmd.Process.Release()
	}
	return w, cmd.Process.Release()
}

// ParkedRun is one run in a parked sandbox.
type ParkedRun struct {
	StateDir string
	// ImageKey is the run's image (ImageKey); its filler links the parked sandboxes' index to it.
	ImageKey string
	// Req is the normalized request; Opts its I/O.
	Req  core.Request
	Opts core.Options
	// Filler starts the filler once the parked sandbox is used (Exe empty: none is started, and the
	// used parked sandbox's remains are left to the next reconcile).
	Filler Filler
	Log    *slog.Logger
}

// Outcome is what RunParked did.
type Outcome struct {
	// Ran: the code ran in a parked sandbox (Result, or the error that ended the run). Otherwise no
	// parked sandbox could be used and nothing of the run happened: the caller creates a sandbox.
	Ran    bool
	Result core.Result
	// Discarded are parked sandboxes claimed but found unusable: this process owns them, and the
	// full runtime terminates them (the caller's filler).
	Discarded []string
}

// RunParked runs r.Req in a parked sandbox of r.ImageKey's when one is usable: claim, hand the
// code to the waiting interpreter (or run it cold in the parked sandbox), and once the result is known
// kill the sandbox, every process of it (nothing of the code outlives the run), while the
// filler starts and waits at its gate to remove the remains and park the next parked sandbox. The error
// is the run's (the code ran, or may have, in the parked sandbox) or the kill's.
func RunParked(ctx context.Context, r ParkedRun) (Outcome, error) {
	idx, err := os.Readlink(AliasPath(r.StateDir, r.ImageKey))
	if err != nil {
		return Outcome{}, nil // never filled for this image
	}
	c, discarded, err := sessions.Claim(ctx, r.StateDir, idx, time.Duration(r.Req.TimeoutSeconds)*time.Second+core.ClaimMargin)
	out := Outcome{Discarded: discarded}
	if err != nil {
		// The parked sandboxes are a speed-up: a run never fails for want of one.
		r.Log.Warn("parked sandboxes: claiming a parked sandbox failed; creating the sandbox", "err", err)
		return out, nil
	}
	if c == nil {
		return out, nil
	}
	out.Ran = true
	var pre *core.Prestarted
	if len(c.Prestart) > 0 {
		if pre, err = core.ResumePrestarted(c.Agent, c.Prestart); err != nil {
			r.Log.Warn("parked sandboxes: the parked sandbox's pre-started interpreters are unusable; running cold in it", "session", c.ID, "err", err)
		}
	}
	workdir := c.Record.Spec.Workdir
	out.Result, err = core.RunIn(ctx, c.Agent, pre, workdir, r.Req, r.Opts)
	out.Result.SandboxID = c.Record.SandboxID
	out.Result.Memory = c.Record.Spec.Limits.Memory
	return out, errors.Join(err, finish(c, r, idx, discarded))
}

// finish kills the used parked sandbox and has a filler remove its remains and park the next:
// the key's live filler, which finds them queued once the kill is confirmed (runs back to
// back start no filler each: sessions/filling.go), else a filler started while the kill runs,
// held at its gate until the kill is confirmed: it never sees the run's sandbox alive. A run
// that took the last parked sandbox right behind another counts as a miss: the pool grows to
// the rate of runs back to back.
func finish(c *sessions.Claimed, r ParkedRun, key string, discarded []string) error {
	killed := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
		defer cancel()
		killed <- c.Kill(ctx)
	}()
	used := append([]string{c.ID}, discarded...)
	r.Filler.Missed = r.Filler.Missed || (c.Left == 0 && c.BackToBack)
	var gate io.Closer
	queue := r.Filler.Exe != "" && sessions.FillerAlive(r.StateDir, key)
	if r.Filler.Exe != "" && !queue {
		var err error
		if gate, err = r.Filler.Start(used, true); err != nil {
			r.Log.Warn("parked sandboxes: starting the filler failed; the used parked sandbox's remains are left to the next reconcile", "err", err)
		}
	}
	err := <-killed
	if gate != nil {
		_ = gate.Close()
	}
	if err != nil {
		return fmt.Errorf("terminating sandbox %s: %w", c.ID, err)
	}
	if queue {
		qerr := sessions.QueueUsed(r.StateDir, key, used)
		if qerr == nil && r.Filler.Missed {
			qerr = sessions.RecordMiss(r.StateDir, key)
		}
		// A filler that ended meanwhile may not have seen the queue: start one for it.
		if qerr != nil || !sessions.FillerAlive(r.StateDir, key) {
			var terminate []string
			if qerr != nil {
				terminate = used
			}
			if _, err := r.Filler.Start(terminate, false); err != nil {
				r.Log.Warn("parked sandboxes: starting the filler failed; the used parked sandbox's remains are left to the next reconcile", "err", err)
			}
		}
	}
	return nil
}
