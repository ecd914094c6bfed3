// Command airlock is airlock's lean front: it runs `airlock run` in a parked sandbox itself and hands everything else to the full CLI (airlock-full), which it execs with the same arguments.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/airlock-sandbox/airlock/internal/runcli"
	"github.com/airlock-sandbox/airlock/platform/setting"
	"github.com/airlock-sandbox/airlock/runcode/core"
)

// The front exists for start-up time (DESIGN.md, "Start-up is on the hot path"): the full
// CLI's libraries (cgroups, seccomp, images, Kubernetes quantities, YAML, cobra) cost ~2 ms of
// package inits and page faults before main, on every run. The front links only what a run in
// a parked sandbox needs; whatever it does not serve, it does not interpret either: the full CLI gets
// the same argv (and the same pid: a parked sandbox the front claimed is still this process's).

// envFull names the full CLI's executable (default: airlock-full next to this one, else on
// PATH).
const envFull = "AIRLOCK_FULL"

func main() {
	// No Ed25519 table is built here: a parked sandbox's entry carries the filler's token for
	// its claimer (sessions.Entry.Token), so a run in one signs nothing.
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// invocation is an `airlock run` the front serves.
type invocation struct {
	flags        runcli.Flags
	stateDir     string
	cgroupParent string
	json         bool
	image        runcli.Image
	args         []string // the code's source, if not -c
	runAt        int      // the index of "run" in argv
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	// Every path needs the full CLI: to hand the invocation over, or as the filler.
	full, err := fullPath()
	if err != nil {
		fmt.Fprintf(stderr, "airlock: %v\n", err)
		return runcli.ExitRunFailed
	}
	inv, ok := parse(args)
	if !ok {
		return execFull(full, args, -1, nil, stderr)
	}
	req, in, err := inv.flags.Request(inv.args, stdin)
	if err != nil {
		return execFull(full, args, -1, nil, stderr) // the full CLI says what is wrong, as it always has
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	opts := core.Options{Stdin: in, MaxOutputBytes: inv.flags.MaxOutput, Logger: log}
	if !inv.json {
		opts.Stdout, opts.Stderr = stdout, stderr
	}
	out, err := runcli.RunParked(ctx, runcli.ParkedRun{
		StateDir: inv.stateDir, ImageKey: inv.image.Key, Req: req, Opts: opts, Log: log,
		Filler: runcli.Filler{Exe: full, StateDir: inv.stateDir, CgroupParent: inv.cgroupParent,
			ImageJSON: inv.image.JSON, Count: inv.flags.Pool, Memory: inv.flags.PoolMemory},
	})
	if !out.Ran {
		return execFull(full, args, inv.runAt, out.Discarded, stderr)
	}
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(stderr, "airlock: interrupted: the sandbox was terminated")
			return runcli.ExitInterrupted
		}
		fmt.Fprintf(stderr, "airlock: %v\n", err)
		return runcli.ExitRunFailed
	}
	code, err := runcli.Report(stdout, stderr, inv.json, out.Result)
	if err != nil {
		fmt.Fprintf(stderr, "airlock: %v\n", err)
	}
	return code
}

// parse reads args as the full CLI would when they are an `airlock run` the front serves: on
// the local runtime (or auto) with parked sandboxes, no network, the host image or a directory, and the code from -c or a FILE. ok is
// false for anything else (another command, help, a flag it does not know, a value the full
// CLI refuses): the full CLI then reads args itself.
func parse(args []string) (inv invocation, ok bool) {
	output, i, ok := runcli.RootFlags(args)
	if !ok || i == len(args) || args[i] != "run" {
		return inv, false
	}
	if output == "" {
		output = runcli.OutputText
	}
	inv.runAt = i
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	inv.flags.Add(fs)
	runcli.AddBackend(fs, &inv.stateDir, &inv.cgroupParent)
	plat := fs.String(runcli.PlatformFlag, "auto", "")
	fs.StringVarP(&output, "output", "o", output, "")
	help := fs.BoolP("help", "h", false, "")
	if fs.Parse(args[i+1:]) != nil || *help || fs.NArg() > 1 || slices.Contains(fs.Args(), "-") {
		return inv, false
	}
	if output != runcli.OutputText && output != runcli.OutputJSON {
		return inv, false
	}
	// Parked sandboxes are the local runtime's: another platform is the full CLI's to open.
	if !setting.LocalOnly(*plat, fs.Changed(runcli.PlatformFlag)) {
		return inv, false
	}
	if inv.flags.Check(fs.Changed(runcli.PoolFlag)) != nil || inv.flags.Pool == 0 || inv.flags.Network {
		return inv, false
	}
	if inv.image, ok = runcli.LightImage(inv.flags.Image); !ok || inv.stateDir == "" {
		return inv, false
	}
	sd, err := filepath.Abs(inv.stateDir)
	if err != nil {
		return inv, false
	}
	inv.stateDir = sd
	inv.json = output == runcli.OutputJSON
	inv.args = fs.Args()
	return inv, true
}

// execFull replaces this process with the full CLI, argv unchanged but for the parked sandboxes this
// process claimed and could not use, which the full CLI terminates (--parked-discarded, after
// "run" at runAt).
func execFull(full string, args []string, runAt int, discarded []string, stderr io.Writer) int {
	err := syscall.Exec(full, fullArgv(full, args, runAt, discarded), os.Environ())
	fmt.Fprintf(stderr, "airlock: starting the full CLI %s: %v\n", full, err)
	return runcli.ExitRunFailed
}

// fullArgv is the full CLI's argv: args, with each discarded parked sandbox as --parked-discarded right
// after "run" (args[runAt]), before any "--" could end the flags.
func fullArgv(full string, args []string, runAt int, discarded []string) []string {
	argv := append([]string{full}, args...)
	if runAt < 0 || len(discarded) == 0 {
		return argv
	}
	extra := make([]string, 0, 2*len(discarded))
	for _, id := range discarded {
		extra = append(extra, "--parked-discarded", id)
	}
	return slices.Insert(argv, runAt+2, extra...)
}

// fullPath finds the full CLI: $AIRLOCK_FULL, airlock-full next to this executable, or on
// PATH.
func fullPath() (string, error) {
	if p := os.Getenv(envFull); p != "" {
		return p, nil
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), "airlock-full")
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	p, err := exec.LookPath("airlock-full")
	if err != nil {
		return "", errors.New("the full CLI, airlock-full, is neither next to this executable nor on PATH (or set $" + envFull + "): install them all: go install github.com/airlock-sandbox/airlock/cmd/...@latest")
	}
	return p, nil
}
