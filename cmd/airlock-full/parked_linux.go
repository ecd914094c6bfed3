//go:build linux

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/backend/local/sessions"
	"github.com/airlock-sandbox/airlock/internal/cli"
	"github.com/airlock-sandbox/airlock/internal/runcli"
	"github.com/airlock-sandbox/airlock/platform"
	"github.com/airlock-sandbox/airlock/runcode"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// The filler of airlock run's parked sandboxes (__pool-fill): the local runtime's, so Linux's.

const (
	// fillLog is the filler's log in the state dir's parked sandboxes directory (it has no terminal).
	fillLog     = "fill.log"
	fillLogSize = 1 << 20
	// fillTimeout bounds a filler's whole life.
	fillTimeout = 2 * time.Minute
)

func init() {
	commands = append(commands, cli.Command{Names: []string{"__pool-fill"}, New: newPoolFillCmd})
}

type poolFillFlags struct {
	imageJSON string
	count     int
	terminate []string
	gateFD    int
	idle      bool
	missed    bool
	memory    string
	backend   cli.BackendFlags
}

func newPoolFillCmd(g *cli.Globals) *cobra.Command {
	f := &poolFillFlags{}
	cmd := &cobra.Command{
		Use:    "__pool-fill --image-json JSON [--count N] [--terminate SESSION]...",
		Short:  "Park sandboxes in the state dir for airlock run's pool (started by airlock run itself)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE:   func(cmd *cobra.Command, _ []string) error { return runPoolFill(cmd, f) },
	}
	cmd.Flags().StringVar(&f.imageJSON, "image-json", "", "the runs' image, as JSON")
	cmd.Flags().IntVar(&f.count, "count", 1, "parked sandboxes to keep parked")
	cmd.Flags().StringArrayVar(&f.terminate, "terminate", nil, "a used parked sandbox airlock run killed, to terminate first; repeatable")
	cmd.Flags().BoolVar(&f.idle, "idle", false, "the starting run started this filler under SCHED_IDLE: it stays idle, and puts each parked sandbox back to normal scheduling at nice 0 before parking it")
	cmd.Flags().IntVar(&f.gateFD, "gate-fd", -1, "a pipe whose write end the starting run holds: wait for its end (the run's sandbox killed) before anything else")
	cmd.Flags().BoolVar(&f.missed, "missed", false, "the starting run found nothing parked: grow the parked count by one within the pool memory")
	cmd.Flags().StringVar(&f.memory, runcode.PoolMemoryFlag, "", "the pool memory: host memory the parked sandboxes may hold as their count grows (default $"+runcode.EnvPoolMemory+", else pool.memory in the config file, else "+runcode.PoolMemoryDefault+")")
	f.backend.Add(cmd)
	return cmd
}

func runPoolFill(cmd *cobra.Command, f *poolFillFlags) error {
	shortLivedGC()
	var img spec.Image
	if err := json.Unmarshal([]byte(f.imageJSON), &img); err != nil || img == (spec.Image{}) {
		return cli.UsageError("--image-json %q: give the image as JSON (%v)", f.imageJSON, err)
	}
	if f.count < 1 || f.count > sessions.MaxParked {
		return cli.UsageError("--count %d must be 1 to %d", f.count, sessions.MaxParked)
	}
	memory, _, err := platform.PoolMemory(f.memory, cmd.Flags().Changed(runcode.PoolMemoryFlag))
	if err != nil {
		return cli.UsageError("%v", err)
	}
	logw, err := openFillLog(f.backend.StateDir)
	if err != nil {
		return err
	}
	defer logw.Close()
	log := slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: slog.LevelWarn})).With("pid", os.Getpid())
	// Bounded: a filler stuck in a create would hold the key's lock, and every later run's
	// filler would leave at once.
	ctx, cancel := context.WithTimeout(cmd.Context(), fillTimeout)
	defer cancel()
	if f.gateFD >= 0 {
		if err := awaitGate(ctx, f.gateFD); err != nil {
			log.Error("parked sandboxes: waiting for the run failed", "err", err)
			return err
		}
	}
	b, err := platform.Local(ctx, platform.LocalConfig{StateDir: f.backend.StateDir, CgroupParent: f.backend.CgroupParent}, log)
	if err != nil {
		log.Error("parked sandboxes: starting the local runtime failed", "err", err)
		return err
	}
	defer b.Close()
	tmpl := parkedTemplate(img)
	// First the remains of the run that started this filler (its New may have reaped them
	// already: then they are absent, which Terminate accepts).
	for _, id := range f.terminate {
		if err := b.Terminate(ctx, id); err != nil {
			log.Error("parked sandboxes: terminating a used parked sandbox failed", "session", id, "err", err)
		}
	}
	// A run in a parked sandbox (runcli.RunParked) does not check its declaration against the
	// capabilities: it fits the template (the same image, limits and egress, a lifetime no
	// longer), which is checked here, before any parked sandbox of it is parked.
	if err := runcode.Check(ctx, b, tmpl, false); err != nil {
		log.Error("parked sandboxes: the runs' sandbox is refused here; parking none", "err", err)
		return err
	}
	key, err := local.PoolKey(tmpl)
	if err != nil {
		return err
	}
	if err := runcli.WriteAlias(f.backend.StateDir, imageKey(img), key); err != nil {
		log.Error("parked sandboxes: linking the image's parked sandboxes failed", "err", err)
		return err
	}
	pf, err := runcode.Prestart(runcode.PrestartOptions{Languages: []runcode.Language{runcode.Python}, Logger: log})
	if err != nil {
		return err
	}
	opts := local.ParkOptions{Count: f.count, MaxAge: parkedMaxAge, Memory: memory, Missed: f.missed, Raise: f.idle,
		Prestart: func(ctx context.Context, sess *sandbox.Session, a sandbox.Agent) ([]byte, error) {
			pre, err := pf(ctx, sess, a)
			if err != nil {
				return nil, err
			}
			return pre.State() // the client is closed by the caller
		}}
	if err := b.FillParked(ctx, tmpl, opts); err != nil {
		log.Error("parked sandboxes: filling failed", "err", err)
		return err
	}
	return nil
}

// awaitGate returns once the pipe on fd reads EOF: the run that started this filler closed
// its write end, or exited.
func awaitGate(ctx context.Context, fd int) error {
	f := os.NewFile(uintptr(fd), "gate")
	if f == nil {
		return fmt.Errorf("--gate-fd %d: not an open file", fd)
	}
	defer f.Close()
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, f)
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("the run that started this filler did not open its gate: %w", context.Cause(ctx))
	}
}

// openFillLog opens the filler's log for appending, starting it over past fillLogSize.
func openFillLog(stateDir string) (*os.File, error) {
	dir := local.ParkedDir(stateDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := filepath.Join(dir, fillLog)
	flags := os.O_CREATE | os.O_WRONLY | os.O_APPEND
	if fi, err := os.Stat(p); err == nil && fi.Size() > fillLogSize {
		flags |= os.O_TRUNC
	}
	return os.OpenFile(p, flags, 0o600)
}
