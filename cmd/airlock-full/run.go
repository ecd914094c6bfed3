package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/internal/cli"
	"github.com/airlock-sandbox/airlock/internal/runcli"
	"github.com/airlock-sandbox/airlock/platform"
	"github.com/airlock-sandbox/airlock/runcode"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/token"
)

func init() { commands = append(commands, cli.Command{Names: []string{"run"}, New: newRunCmd}) }

// airlock run's own statuses (runcli's: the lean front exits with the same).
const (
	exitRunFailed   = runcli.ExitRunFailed
	exitInterrupted = runcli.ExitInterrupted
)

// runFlags are airlock run's flags.
type runFlags struct {
	runcli.Flags
	backend cli.BackendFlags
	// discarded are parked sandboxes the lean front claimed and could not use before it handed the run
	// to this binary: this process owns them (same pid), and its filler terminates them.
	discarded []string
}

func newRunCmd(g *cli.Globals) *cobra.Command {
	f := &runFlags{}
	cmd := &cobra.Command{
		Use:   "run [--lang L] [--timeout 30s] [--network] [--image host|PATH|REF] [--file LOCAL[:REMOTE]]... (-c CODE | FILE | -)",
		Short: "Run a snippet of python, node or bash in a fresh, disposable sandbox",
		Long: `Run code in a fresh sandbox (no daemon), stream its output, and exit with its status.
--platform chooses where (default $AIRLOCK_PLATFORM, else the config file's, else auto: the
local runtime where this host runs it, else a docker-compatible engine, said once on stderr);
off the local runtime give --image, since the host image is the local runtime's. The sandbox has 512Mi of memory, 1 cpu, 256 processes and no network unless
--network (public internet only: loopback and private addresses stay unreachable); it is
destroyed when the code ends.

Pool: a run also starts a background filler that parks one fresh sandbox (python already
started in it) for the next run with the same image and limits, which takes it instead of
creating one; each sandbox still serves one run only. A parked sandbox nobody claims is retired after
5 minutes by the next filler and ends by itself at its lifetime (11 minutes). --pool 0 (or
AIRLOCK_POOL=0) turns this off; the filler logs to <state-dir>/spares/fill.log.

The code comes from -c CODE, a FILE, or - (standard input). --lang is python, node or bash
(aliases py, python3, js, javascript, sh, shell); with a FILE it defaults from the extension
(.py, .js, .cjs, .sh, .bash). --file copies a local file into the sandbox, relative to the
working directory /workspace unless REMOTE is absolute. -i feeds standard input to the code.

Exit status: the code's own; 124 when it ran past --timeout (like coreutils timeout); 137 when
killed for exceeding memory; 125 when airlock itself failed (refused, no runtime, sandbox
error); 2 for usage errors.`,
		Example: `  airlock run -c 'print(2+2)'
  airlock run script.py
  echo 'console.log(1)' | airlock run --lang js -
  airlock run --timeout 5s --file data.csv -c 'print(open("data.csv").read())'
  airlock -o json run --lang bash -c 'uname -a'
  airlock run --platform docker --image python:3.12-slim -c 'print(2+2)'`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return runRun(cmd, g, f, args) },
	}
	f.Flags.Add(cmd.Flags())
	cmd.Flags().StringArrayVar(&f.discarded, "parked-discarded", nil, "a parked sandbox the lean front claimed and could not use, for this run's filler to terminate")
	_ = cmd.Flags().MarkHidden("parked-discarded")
	f.backend.Add(cmd)
	return cmd
}

// shortLivedGC is for a process that ends with its command (a run, a pool fill): its heap stays
// small, and with the default GOGC the libraries' inits plus one run cross the runtime's first
// 4 MiB goal, a collection of ~1 ms of CPU that frees nothing worth having (measured on a cold
// airlock run). Five times the live heap instead: still bounded by what the process holds.
func shortLivedGC() { debug.SetGCPercent(400) }

func runRun(cmd *cobra.Command, g *cli.Globals, f *runFlags, args []string) error {
	token.PrecomputeEd25519() // built while the flags are checked and the backend opens
	shortLivedGC()
	req, stdin, err := f.Request(args, cmd.InOrStdin())
	if err != nil {
		return err
	}
	if err := f.Check(cmd.Flags().Changed(runcli.PoolFlag)); err != nil {
		return err
	}
	// The front reads the flag and the variable only; here the config file counts too.
	poolMemory, _, err := platform.PoolMemory(f.PoolMemory, f.PoolMemory != "")
	if err != nil {
		return cli.UsageError("%v", err)
	}
	img, err := cli.ParseImage(f.Image)
	if err != nil {
		return cli.UsageError("--image: %v", err)
	}

	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	opts := runcode.Options{Image: img, Stdin: stdin, MaxOutputBytes: f.MaxOutput, Logger: log}
	if g.Output == cli.OutputText {
		opts.Stdout, opts.Stderr = cmd.OutOrStdout(), cmd.ErrOrStderr()
	}
	// pool_parked.go: with parked sandboxes, the run takes a parked sandbox when one fits (runcli.RunParked, the
	// lean front's own path), and a run that had to create its sandbox starts a filler that
	// parks the next. The filler does the state dir's upkeep (local.Options.OneShot):
	// reconcile, capability probe. Parked sandboxes are the local runtime's: a run the settings send
	// elsewhere has none.
	onLocal, other, err := f.backend.Local()
	if err != nil {
		return err
	}
	if !onLocal && cmd.Flags().Changed(runcli.PoolFlag) && f.Pool > 0 {
		return cli.UsageError("--pool: parked sandboxes are the local runtime's; the platform is %s", other)
	}
	if !onLocal && f.PoolMemory != "" {
		return cli.UsageError("--%s: parked sandboxes are the local runtime's; the platform is %s", runcode.PoolMemoryFlag, other)
	}
	useParked := onLocal && f.Pool > 0 && runcode.Fits(runcode.Declaration(req, opts), parkedTemplate(img))
	var filler runcli.Filler
	discarded := f.discarded
	if useParked {
		if filler, err = newFiller(&f.backend, img, f.Pool); err != nil {
			return &cli.ExitError{Code: exitRunFailed, Err: err}
		}
		filler.Memory = strconv.FormatInt(poolMemory, 10)
		out, err := runcli.RunParked(ctx, runcli.ParkedRun{StateDir: filler.StateDir, ImageKey: imageKey(img),
			Req: req, Opts: opts.Core(), Filler: filler, Log: log})
		if out.Ran {
			return report(ctx, cmd, g, out.Result, err)
		}
		discarded = append(discarded, out.Discarded...)
	}
	f.backend.OneShot = useParked
	b, ch, err := f.backend.Open(ctx, cmd.ErrOrStderr(), cmd.ErrOrStderr(), log)
	var usage *cli.ExitError
	if errors.As(err, &usage) {
		return err // the platform settings are wrong: a usage error
	}
	if err != nil {
		return &cli.ExitError{Code: exitRunFailed, Err: err}
	}
	defer b.Close()
	if ch.Platform != capability.Local {
		// Auto passed the local runtime over: no parked sandboxes, and the default image is not this
		// platform's.
		if cmd.Flags().Changed(runcli.PoolFlag) && f.Pool > 0 {
			return cli.UsageError("--pool: parked sandboxes are the local runtime's; the platform is %s (%s)", ch.Platform, ch.Why)
		}
		if f.PoolMemory != "" {
			return cli.UsageError("--%s: parked sandboxes are the local runtime's; the platform is %s (%s)", runcode.PoolMemoryFlag, ch.Platform, ch.Why)
		}
		useParked = false
		if err := cli.CheckImage(cmd.Flags(), "image", img, ch); err != nil {
			return err
		}
	}
	res, term, err := runcode.RunDetached(ctx, b, req, opts)
	if terr := term.Wait(); err == nil {
		err = terr
	} // else its error is logged; the run's error says more
	if useParked {
		// After the run (its sandbox gone): the filler's start would compete with it. This
		// run found nothing parked: the filler grows the parked count (pool memory permitting).
		filler.Missed = true
		if _, ferr := filler.Start(discarded, false); ferr != nil {
			log.Warn("parked sandboxes: starting the filler failed", "err", ferr)
			err = errors.Join(err, terminateAll(b, discarded))
		}
	}
	return report(ctx, cmd, g, res, err)
}

// report ends a run: its error with airlock's own status, else the result as -o asks.
func report(ctx context.Context, cmd *cobra.Command, g *cli.Globals, res runcode.Result, err error) error {
	if err != nil {
		if ctx.Err() != nil && cmd.Context().Err() == nil {
			// Interrupted: the sandbox is gone (Run terminates it); exit as a shell would.
			return &cli.ExitError{Code: exitInterrupted, Err: errors.New("interrupted: the sandbox was terminated")}
		}
		return &cli.ExitError{Code: exitRunFailed, Err: explainRunError(err)}
	}
	code, err := runcli.Report(cmd.OutOrStdout(), cmd.ErrOrStderr(), g.Output == cli.OutputJSON, res)
	if err != nil {
		return err
	}
	if code != 0 {
		return &cli.ExitError{Code: code}
	}
	return nil
}

// explainRunError adds what to do to the errors a person can act on.
func explainRunError(err error) error {
	var ref *runcode.RefusedError
	switch {
	case errors.As(err, &ref):
		return fmt.Errorf("%w\nsee 'airlock capabilities' for what this host enforces", err)
	case errors.Is(err, sandbox.ErrUnsupported):
		return fmt.Errorf("%w\nsee 'airlock capabilities' for what this host lacks and why", err)
	}
	return err
}
