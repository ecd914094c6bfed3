package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/client"
	"github.com/airlock-sandbox/airlock/internal/cli"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// The optional features of the daemon's platform: stats, preview, snapshots, fork.

// argsUsage wants exactly the arguments use names; anything else is a usage error (exit 2).
func argsUsage(use ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != len(use) {
			return cli.UsageError("want %s, got %d arguments\nsee '%s --help'", strings.Join(use, " "), len(args), cmd.CommandPath())
		}
		return nil
	}
}

func newSandboxStatsCmd(g *cli.Globals, d *daemonFlags) *cobra.Command {
	return &cobra.Command{
		Use:     "stats SESSION",
		Short:   "Show a sandbox's resource usage (cpu, memory, processes)",
		Example: `  airlock sandbox stats s-0123456789abcdef -o json`,
		Args:    argsUsage("SESSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := d.client()
			if err != nil {
				return err
			}
			defer c.Close()
			st, err := c.Sandbox(args[0]).Stats(cmd.Context())
			if err != nil {
				return daemonError(err)
			}
			out := cmd.OutOrStdout()
			if g.Output == cli.OutputJSON {
				return printJSON(out, st)
			}
			unknown := func(v int64, f func(int64) string) string {
				if v == 0 {
					return "-"
				}
				return f(v)
			}
			return writeTable(out, [][]string{
				{"cpu", strconv.FormatFloat(st.CPUSeconds, 'f', 3, 64) + "s"},
				{"memory", humanBytes(st.MemoryBytes)},
				{"memory peak", unknown(st.MemoryPeakBytes, humanBytes)},
				{"processes", unknown(st.Processes, func(v int64) string { return strconv.FormatInt(v, 10) })},
			})
		},
	}
}

// humanBytes writes n in binary units, as Kubernetes quantities are written (512Mi).
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + "B"
	}
	v, i := float64(n), -1
	for v >= unit && i < 4 {
		v /= unit
		i++
	}
	return strconv.FormatFloat(v, 'f', 1, 64) + []string{"Ki", "Mi", "Gi", "Ti", "Pi"}[i]
}

func newSandboxPreviewCmd(g *cli.Globals, d *daemonFlags) *cobra.Command {
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "preview SESSION PORT [--ttl 1h]",
		Short: "Open a declared preview port of a sandbox and print its URL",
		Long: `Expose one of the sandbox's previewPorts behind the daemon's authenticated proxy and print
the URL to open (it carries a preview token for this session and port, valid --ttl, never past
the sandbox's end). On the local runtime the URL is on the daemon host's loopback. A port the
declaration does not list is refused. -o json prints the address and token too.`,
		Example: `  airlock sandbox preview s-0123456789abcdef 8080
  airlock sandbox preview s-0123456789abcdef 8080 --ttl 10m -o json`,
		Args: argsUsage("SESSION", "PORT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			port, err := strconv.Atoi(args[1])
			if err != nil || port < 1 || port > 65535 {
				return cli.UsageError("PORT %q: want a TCP port, 1 to 65535", args[1])
			}
			if ttl < 0 {
				return cli.UsageError("--ttl %s must be positive", ttl)
			}
			c, err := d.client()
			if err != nil {
				return err
			}
			defer c.Close()
			info, err := c.Sandbox(args[0]).Preview(cmd.Context(), port, ttl)
			if err != nil {
				return daemonError(err)
			}
			if g.Output == cli.OutputJSON {
				return printJSON(cmd.OutOrStdout(), info)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), info.URL)
			return err
		},
	}
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "lifetime of the preview token (default the platform's, 1h on local; at most 24h there)")
	return cmd
}

func newSandboxSnapshotCmd(g *cli.Globals, d *daemonFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "snapshot SESSION NAME",
		Short: "Capture a sandbox's files as a named snapshot",
		Long: `Capture the sandbox's files (its writable layer: the workdir and /tmp) as the snapshot NAME
(1 to 64 letters, digits, '_' and '-', unique on the daemon). The sandbox is frozen while its
files are read and runs on after. Start a sandbox from it with 'image: {snapshot: NAME}' in a
declaration file ('airlock sandbox create -f'); list with 'airlock sandbox snapshots', remove with
'airlock sandbox snapshots rm NAME'.`,
		Example: `  airlock sandbox snapshot s-0123456789abcdef before-migration`,
		Args:    argsUsage("SESSION", "NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := d.client()
			if err != nil {
				return err
			}
			defer c.Close()
			info, err := c.Sandbox(args[0]).Snapshot(cmd.Context(), args[1])
			if err != nil {
				return daemonError(err)
			}
			if g.Output == cli.OutputJSON {
				return printJSON(cmd.OutOrStdout(), info)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), info.Name)
			return err
		},
	}
}

func newSandboxSnapshotsCmd(g *cli.Globals, d *daemonFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "snapshots",
		Short: "List the daemon's snapshots (rm NAME... removes them)",
		Args:  cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := d.client()
			if err != nil {
				return err
			}
			defer c.Close()
			list, err := c.Snapshots(cmd.Context())
			if err != nil {
				return daemonError(err)
			}
			if g.Output == cli.OutputJSON {
				if list == nil {
					list = []sandbox.SnapshotInfo{}
				}
				return printJSON(cmd.OutOrStdout(), list)
			}
			rows := [][]string{{"NAME", "SESSION", "SANDBOX", "BASE", "FILES", "SIZE", "AGE"}}
			now := time.Now()
			for _, s := range list {
				rows = append(rows, []string{s.Name, s.SessionID, s.SandboxID, s.Base, strconv.Itoa(s.Files), humanBytes(s.Size), now.Sub(s.CreatedAt).Round(time.Second).String()})
			}
			return writeTable(cmd.OutOrStdout(), rows)
		},
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "rm NAME...",
		Short: "Remove snapshots (sandboxes made from them run on)",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cli.UsageError("want NAME...\nsee '%s --help'", cmd.CommandPath())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return d.each(cmd, "rm", args, true, func(ctx context.Context, c *client.Client, name string) error {
				return c.DeleteSnapshot(ctx, name)
			})
		},
	})
	return cmd
}

func newSandboxForkCmd(g *cli.Globals, d *daemonFlags) *cobra.Command {
	var n int
	cmd := &cobra.Command{
		Use:   "fork SESSION [--count N]",
		Short: "Start N new sandboxes from a running sandbox's files and print their session ids",
		Long: `Snapshot the sandbox and start N new sandboxes from it, all or none. Each has the
sandbox's files and declaration and none of its processes; a write in one is seen by no other.
The snapshot stays (each new session's spec.image.snapshot names it) until
'airlock sandbox snapshots rm'.`,
		Example: `  airlock sandbox fork s-0123456789abcdef --count 3`,
		Args:    argsUsage("SESSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if n < 1 {
				return cli.UsageError("-n %d: at least 1", n)
			}
			c, err := d.client()
			if err != nil {
				return err
			}
			defer c.Close()
			kids, err := c.Sandbox(args[0]).Fork(cmd.Context(), n)
			if err != nil {
				return daemonError(err)
			}
			if g.Output == cli.OutputJSON {
				return printJSON(cmd.OutOrStdout(), sessionsOf(kids))
			}
			for _, k := range kids {
				fmt.Fprintln(cmd.OutOrStdout(), k.ID)
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&n, "count", 1, "how many sandboxes to start (at most 64 on the local runtime)")
	return cmd
}
