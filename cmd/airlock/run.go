package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/internal/cli"
	"github.com/airlock-sandbox/airlock/runcode"
	"github.com/airlock-sandbox/airlock/sandbox"
)

func init() { commands = append(commands, cli.Command{Names: []string{"run"}, New: newRunCmd}) }

// exitRunFailed is airlock run's own failure (refused, no runtime, sandbox error), kept apart
// from the program's statuses as docker run and coreutils timeout do.
const exitRunFailed = 125

// exitInterrupted is a shell's status for SIGINT.
const exitInterrupted = 130

// runFlags are airlock run's flags.
type runFlags struct {
	lang        string
	timeout     time.Duration
	network     bool
	image       string
	files       []string
	code        string
	interactive bool
	maxOutput   int64
	spares      int
	backend     cli.BackendFlags
}

func newRunCmd(g *cli.Globals) *cobra.Command {
	f := &runFlags{}
	cmd := &cobra.Command{
		Use:   "run [--lang L] [--timeout 30s] [--network] [--image host|PATH|REF] [--file LOCAL[:REMOTE]]... (-c CODE | FILE | -)",
		Short: "Run a snippet of python, node or bash in a fresh, disposable sandbox",
		Long: `Run code in a fresh sandbox on this machine (no daemon), stream its output, and exit with
its status. The sandbox has 512Mi of memory, 1 cpu, 256 processes and no network unless
--network (public internet only: loopback and private addresses stay unreachable); it is
destroyed when the code ends.

Spares: a run also starts a background filler that parks one fresh sandbox (python already
started in it) for the next run with the same image and limits, which takes it instead of
creating one; each sandbox still serves one run only. A spare nobody claims is retired after
5 minutes by the next filler and ends by itself at its lifetime (11 minutes). --spares 0 (or
AIRLOCK_SPARES=0) turns this off; the filler logs to <state-dir>/spares/fill.log.

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
  airlock -o json run --lang bash -c 'uname -a'`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return runRun(cmd, g, f, args) },
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.lang, "lang", "l", "", "language: python, node, bash (aliases py, python3, js, javascript, sh, shell); default python, or from FILE's extension")
	fl.DurationVarP(&f.timeout, "timeout", "t", time.Duration(runcode.DefaultTimeoutSeconds)*time.Second, "wall-clock limit, whole seconds from 1s to 300s")
	fl.BoolVarP(&f.network, "network", "n", false, "allow connections to the public internet")
	fl.StringVar(&f.image, "image", "host", `root filesystem: "host", a directory, an OCI layout ("oci:DIR"), a tarball, or an image reference`)
	fl.StringArrayVarP(&f.files, "file", "f", nil, "copy LOCAL into the sandbox as REMOTE (default: its base name in /workspace); repeatable")
	fl.StringVarP(&f.code, "code", "c", "", "the code to run")
	fl.BoolVarP(&f.interactive, "interactive", "i", false, "feed standard input to the code")
	fl.Int64Var(&f.maxOutput, "max-output", spareOutputCap, "cap on each of stdout and stderr, in bytes")
	fl.IntVar(&f.spares, "spares", defaultSpares(), "sandboxes to keep parked for the next runs (0: none; default $"+envSpares+", else 1)")
	f.backend.Add(cmd)
	return cmd
}

func runRun(cmd *cobra.Command, g *cli.Globals, f *runFlags, args []string) error {
	local.WarmSigning() // built while the flags are checked and the backend opens
	req, stdin, err := f.request(cmd, args)
	if err != nil {
		return err
	}
	if f.maxOutput < 1 {
		return cli.UsageError("--max-output %d must be at least 1 byte", f.maxOutput)
	}
	if f.spares < 0 || f.spares > local.MaxSpares {
		if !cmd.Flags().Changed("spares") {
			return cli.UsageError("$%s=%q: give 0 (no spares) to %d", envSpares, os.Getenv(envSpares), local.MaxSpares)
		}
		return cli.UsageError("--spares %d must be 0 (none) to %d", f.spares, local.MaxSpares)
	}
	img, err := cli.ParseImage(f.image)
	if err != nil {
		return cli.UsageError("--image: %v", err)
	}
	if req, err = runcode.Normalize(req); err != nil {
		return cli.UsageError("%v", err)
	}

	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	opts := runcode.Options{Image: img, Stdin: stdin, MaxOutputBytes: f.maxOutput, Logger: log}
	if g.Output == cli.OutputText {
		opts.Stdout, opts.Stderr = cmd.OutOrStdout(), cmd.ErrOrStderr()
	}
	// spare.go: with spares, the run takes a parked sandbox when one fits, and starts a filler
	// that parks the next (a run refused before its claim fills nothing). The filler does the
	// state dir's upkeep (local.Options.OneShot): reconcile, capability probe.
	useSpares := f.spares > 0 && runcode.Fits(runcode.Declaration(req, opts), spareTemplate(img))
	f.backend.OneShot = useSpares
	b, err := f.backend.Open(ctx, cmd.ErrOrStderr(), log)
	if err != nil {
		return &cli.ExitError{Code: exitRunFailed, Err: err}
	}
	defer b.Close()

	var spares *spareRun
	if useSpares {
		if spares, err = newSpareRun(b, img, f.timeout, log); err != nil {
			return &cli.ExitError{Code: exitRunFailed, Err: err}
		}
		spares.fill = func(terminate []string) (io.Closer, error) {
			return startFiller(&f.backend, img, f.spares, terminate, true)
		}
		opts.Pool = spares
	}
	res, term, err := runcode.RunDetached(ctx, b, req, opts)
	if err == nil {
		err = errors.Join(term.Wait(), spareWait(spares))
	} else if term != nil {
		_ = term.Wait() // its error is logged; the run's error says more
		_ = spareWait(spares)
	}
	if err != nil {
		if ctx.Err() != nil && cmd.Context().Err() == nil {
			// Interrupted: the sandbox is gone (Run terminates it); exit as a shell would.
			return &cli.ExitError{Code: exitInterrupted, Err: errors.New("interrupted: the sandbox was terminated")}
		}
		return &cli.ExitError{Code: exitRunFailed, Err: explainRunError(err)}
	}
	if g.Output == cli.OutputJSON {
		enc := json.NewEncoder(cmd.OutOrStdout())
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			return err
		}
	} else {
		notes(cmd.ErrOrStderr(), res)
	}
	if s := res.ExitStatus(); s != 0 {
		return &cli.ExitError{Code: s}
	}
	return nil
}

// request builds the run request from the flags and the argument; stdin is what the code
// reads (nil: closed).
func (f *runFlags) request(cmd *cobra.Command, args []string) (runcode.Request, io.Reader, error) {
	req := runcode.Request{Language: f.lang, Network: f.network}
	var src string
	if len(args) == 1 {
		src = args[0]
	}
	switch {
	case f.code != "" && src != "":
		return req, nil, cli.UsageError("give the code once: -c CODE or a FILE (or - for standard input), not both")
	case f.code != "":
		req.Code = f.code
	case src == "-":
		if f.interactive {
			return req, nil, cli.UsageError("-i feeds standard input to the code, but - reads the code itself from it: use -c CODE or a FILE with -i")
		}
		data, err := io.ReadAll(cmd.InOrStdin())
		if err != nil {
			return req, nil, fmt.Errorf("reading the code from standard input: %w", err)
		}
		req.Code = string(data)
	case src != "":
		data, err := os.ReadFile(src)
		if err != nil {
			return req, nil, &cli.ExitError{Code: cli.ExitUsage, Err: fmt.Errorf("reading the code: %w", err)}
		}
		req.Code = string(data)
		if req.Language == "" {
			req.Language = languageFromExt(src)
			if req.Language == "" {
				return req, nil, cli.UsageError("cannot tell the language of %s from its extension: give --lang (%s)", src, strings.Join(runcode.LanguageNames(), ", "))
			}
		}
	default:
		return req, nil, cli.UsageError("no code to run: give -c CODE, a FILE, or - to read it from standard input")
	}
	if req.Language == "" {
		req.Language = string(runcode.Python)
	}
	if f.timeout%time.Second != 0 || f.timeout < time.Second {
		return req, nil, cli.UsageError("--timeout %v: give whole seconds from 1s to %ds", f.timeout, runcode.MaxTimeoutSeconds)
	}
	req.TimeoutSeconds = int(f.timeout / time.Second)
	if len(f.files) > 0 {
		req.Files = map[string][]byte{}
	}
	for _, fs := range f.files {
		localPath, remote, ok := strings.Cut(fs, ":")
		if !ok || remote == "" {
			remote = filepath.Base(localPath)
		}
		if localPath == "" {
			return req, nil, cli.UsageError("--file %q: give LOCAL[:REMOTE]", fs)
		}
		if _, dup := req.Files[remote]; dup {
			return req, nil, cli.UsageError("--file %q: %s is already the target of another --file", fs, remote)
		}
		data, err := os.ReadFile(localPath)
		if err != nil {
			return req, nil, &cli.ExitError{Code: cli.ExitUsage, Err: fmt.Errorf("--file %q: %w", fs, err)}
		}
		req.Files[remote] = data
	}
	var stdin io.Reader
	if f.interactive {
		stdin = cmd.InOrStdin()
	}
	return req, stdin, nil
}

func languageFromExt(p string) string {
	switch strings.ToLower(filepath.Ext(p)) {
	case ".py":
		return string(runcode.Python)
	case ".js", ".cjs":
		return string(runcode.Node)
	case ".sh", ".bash":
		return string(runcode.Bash)
	}
	return ""
}

func spareWait(s *spareRun) error {
	if s == nil {
		return nil
	}
	return s.wait()
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

// notes tells the person why the code ended, when its output cannot.
func notes(w io.Writer, res runcode.Result) {
	switch {
	case res.TimedOut:
		fmt.Fprintf(w, "airlock: timed out after %ds: the code and everything it started were killed\n", res.TimeoutSeconds)
	case res.OOMKilled:
		fmt.Fprintf(w, "airlock: killed: out of memory (limit %s)\n", res.Memory)
	case res.Signal != "":
		fmt.Fprintf(w, "airlock: killed by signal %s\n", res.Signal)
	}
	if res.Truncated {
		fmt.Fprintf(w, "airlock: output truncated at %d bytes per stream (--max-output)\n", res.OutputCapBytes)
	}
}
