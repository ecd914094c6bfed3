package servercmd

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/internal/cli"
	"github.com/airlock-sandbox/airlock/mcp"
	"github.com/airlock-sandbox/airlock/platform"
	"github.com/airlock-sandbox/airlock/runcode"
)

type mcpFlags struct {
	http        string
	image       string
	maxSessions int
	maxRuns     int
	pool        int
	poolMax     int
	poolIdle    time.Duration
	poolMemory  string
	prestart    string
	logLevel    string
	outputView  int64
	backend     cli.BackendFlags
}

// NewMCPCmd is airlock mcp.
func NewMCPCmd(*cli.Globals) *cobra.Command {
	f := &mcpFlags{}
	cmd := &cobra.Command{
		Use:   "mcp [--http 127.0.0.1:PORT] [--image host|PATH|REF]",
		Short: cli.MCPShort,
		Long: `Serve the airlock MCP tools: run_code (python, node or bash in a fresh, disposable sandbox
per call) and, for multi-step agents, sandbox_create, sandbox_exec, sandbox_read_file,
sandbox_write_file, sandbox_list and sandbox_terminate.

By default the server speaks MCP over standard input and output, for a client that starts it
(stdout carries only the protocol; logs go to stderr). With --http it serves the streamable
HTTP transport at http://ADDR/mcp instead, on a loopback address only: the transport has no
authentication. Sandboxes created with sandbox_create are terminated when the server stops.

Sandboxes run on the platform --platform chooses (default auto: the local runtime where this
host runs it, else a docker-compatible engine, said once on stderr).

On the local runtime, with --pool N (default 1; 0 turns it off) the server keeps N run_code sandboxes created and
their agents ready, so a call claims one instead of creating it; each is still used by one call only and then terminated,
and the pool refills in the background (a call that finds it empty creates one as usual, and
raises the pool's count by one: the pool grows to the call rate it sees, as far as --pool-max and
the pool memory, --pool-memory, allow; a sandbox left unclaimed for --pool-idle lowers it again).
Each pooled sandbox also holds the interpreters named by --pool-prestart (default python)
started and waiting, under the same uid, seccomp, Landlock and limits as the code: a run_code
call in that language hands its code to the waiting interpreter and skips its start-up. Calls
in another language first end the waiting interpreters (pre-starting python and node together
makes every call pay for ending the other one: node's exit is slow).`,
		Example: `  airlock mcp
  airlock mcp --http 127.0.0.1:8765
  airlock mcp --pool 4            # run_code claims pooled sandboxes instead of creating them
  airlock mcp --pool-memory 1Gi   # let the pool grow further when calls come back to back
  airlock mcp --pool 4 --pool-prestart node   # ... with node waiting instead of python
  airlock mcp --platform docker --image python:3.12-slim

  # Claude Desktop, Cursor and other stdio clients:
  {"mcpServers": {"airlock": {"command": "sudo", "args": ["airlock", "mcp"]}}}`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return runMCP(cmd, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.http, "http", "", "serve streamable HTTP on this loopback address (host:port; port 0 picks one) instead of stdio")
	fl.StringVar(&f.image, "image", "host", `root filesystem of every sandbox: "host", a directory, an OCI layout ("oci:DIR"), a tarball, or an image reference`)
	fl.IntVar(&f.maxSessions, "max-sessions", mcp.DefaultMaxSessions, "most sandbox_create sessions alive at once")
	fl.IntVar(&f.maxRuns, "max-runs", mcp.DefaultMaxConcurrentRuns, "most run_code calls running at once (more wait)")
	fl.IntVar(&f.pool, "pool", 1, "local runtime: keep this many run_code sandboxes created and ready (the process pool; 0: create one per call)")
	fl.IntVar(&f.poolMax, "pool-max", 0, "most sandboxes the pool grows to when claims find it empty (default --pool)")
	fl.DurationVar(&f.poolIdle, "pool-idle", local.DefaultPoolIdleExpiry, "replace a pooled sandbox left unclaimed this long")
	fl.StringVar(&f.poolMemory, runcode.PoolMemoryFlag, "", "the pool memory: host memory the pool's waiting sandboxes may hold as it grows with the call rate (a quantity, e.g. 256Mi; 0: the pool stays at --pool, or grows to --pool-max; default $"+runcode.EnvPoolMemory+", else pool.memory in the config file, else "+runcode.PoolMemoryDefault+")")
	fl.StringVar(&f.prestart, "pool-prestart", "python", `interpreters started and waiting in each pooled sandbox: python, node, "python,node" or none`)
	fl.StringVar(&f.logLevel, "log-level", "warn", "log level on stderr: debug, info, warn, error")
	fl.Int64Var(&f.outputView, "output-view", mcp.DefaultOutputViewBytes, "bytes of each of stdout and stderr a tool result keeps for the model: the first and last half, the middle cut with a marker (0: all, up to the 1 MiB cap)")
	f.backend.Add(cmd)
	return cmd
}

func runMCP(cmd *cobra.Command, f *mcpFlags) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return cli.UsageError("--log-level %q: allowed are debug, info, warn, error", f.logLevel)
	}
	img, err := cli.ParseImage(f.image)
	if err != nil {
		return cli.UsageError("--image: %v", err)
	}
	if f.maxSessions < 1 {
		return cli.UsageError("--max-sessions %d must be at least 1", f.maxSessions)
	}
	if f.maxRuns < 1 {
		return cli.UsageError("--max-runs %d must be at least 1", f.maxRuns)
	}
	if f.outputView < 0 {
		return cli.UsageError("--output-view %d must be 0 (all the output) or a number of bytes", f.outputView)
	}
	outputView := f.outputView
	if outputView == 0 {
		outputView = -1 // mcp.Options: negative keeps everything
	}
	if f.pool < 0 || f.pool > local.MaxPoolSize {
		return cli.UsageError("--pool %d must be 0 (no pool) to %d", f.pool, local.MaxPoolSize)
	}
	if f.poolMax != 0 && (f.poolMax < f.pool || f.poolMax > local.MaxPoolSize) {
		return cli.UsageError("--pool-max %d must be --pool (%d) to %d", f.poolMax, f.pool, local.MaxPoolSize)
	}
	if f.poolIdle < time.Second {
		return cli.UsageError("--pool-idle %v must be at least 1s", f.poolIdle)
	}
	poolMemory, _, err := platform.PoolMemory(f.poolMemory, cmd.Flags().Changed(runcode.PoolMemoryFlag))
	if err != nil {
		return cli.UsageError("%v", err)
	}
	prestart, err := runcode.ParsePrestart(f.prestart)
	if err != nil {
		return cli.UsageError("--pool-prestart: %v", err)
	}
	if cmd.Flags().Changed("pool-prestart") && f.pool == 0 && len(prestart) > 0 {
		return cli.UsageError("--pool-prestart needs --pool: interpreters are pre-started in pooled sandboxes")
	}
	var ln net.Listener
	if f.http != "" {
		if err := cli.CheckLoopback(f.http); err != nil {
			return cli.UsageError("--http %v", err)
		}
		if ln, err = net.Listen("tcp", f.http); err != nil {
			return &cli.ExitError{Code: cli.ExitRefused, Err: fmt.Errorf("--http: %w", err)}
		}
		defer ln.Close()
	}

	log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	// Image unpack progress must not go near stdout, which carries the protocol.
	b, ch, err := f.backend.Open(ctx, cmd.ErrOrStderr(), cmd.ErrOrStderr(), log)
	if err != nil {
		return err
	}
	defer b.Close()
	if err := cli.CheckImage(cmd.Flags(), "image", img, ch); err != nil {
		return err
	}
	// The process pool is the local runtime's (local.Pool): elsewhere an explicit --pool is
	// refused and its default is none.
	lb, isLocal := b.(*local.Backend)
	if !isLocal {
		for _, fl := range []string{"pool", "pool-max", "pool-idle", "pool-memory", "pool-prestart"} {
			if cmd.Flags().Changed(fl) {
				return cli.UsageError("--%s: the process pool is the local runtime's; the platform is %s (%s)", fl, ch.Platform, ch.Why)
			}
		}
		f.pool = 0
	}
	opts := mcp.Options{Image: img, Version: mcpVersion(), MaxSessions: f.maxSessions, MaxConcurrentRuns: f.maxRuns, OutputViewBytes: outputView, Logger: log}
	if f.pool > 0 {
		tmpl := runcode.PoolTemplate(runcode.Options{Image: img}, f.poolIdle)
		popts := local.PoolOptions{Size: f.pool, Max: f.poolMax, Memory: poolMemory, IdleExpiry: f.poolIdle, Logger: log}
		if len(prestart) > 0 {
			if popts.Prestart, err = runcode.Prestart(runcode.PrestartOptions{Languages: prestart, Logger: log}); err != nil {
				return cli.UsageError("--pool-prestart: %v", err)
			}
		}
		pool, err := local.NewPool(ctx, lb, tmpl, popts)
		if err != nil {
			return fmt.Errorf("--pool: %w", err)
		}
		// Deferred after b.Close: runs before it, so the pool's sandboxes go first.
		defer func() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
			defer cancel()
			if err := pool.Close(cctx); err != nil {
				log.Error("closing the process pool", "err", err)
			}
		}()
		opts.Pool = pool
	}
	s := mcp.New(b, opts)

	if ln == nil {
		return s.ServeStdio(ctx, cmd.InOrStdin(), cmd.OutOrStdout())
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "airlock mcp: serving streamable HTTP on http://%s%s\n", ln.Addr(), mcp.HTTPPath)
	return s.ServeListener(ctx, ln)
}

// mcpVersion is this build's module version for the MCP handshake ("dev" from a work tree).
func mcpVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}
