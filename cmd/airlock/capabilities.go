package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/internal/cli"
)

func init() {
	commands = append(commands, cli.Command{Names: []string{"capabilities"}, New: newCapabilitiesCmd})
}

func newCapabilitiesCmd(g *cli.Globals) *cobra.Command {
	var platform string
	cmd := &cobra.Command{
		Use:   "capabilities [--platform P]",
		Short: "Print what a platform enforces, and why each missing capability is missing",
		Long: `Print a platform's capability set: each capability, whether the platform enforces it, and
the reason when it does not. The local set is probed from this host; the others are what
airlock's backends for those platforms are designed to enforce. Bounds are the platform's own
ceilings.`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			set, err := capability.For(capability.Platform(platform))
			if err != nil {
				return &cli.ExitError{Code: cli.ExitUsage, Err: err}
			}
			return printCapabilities(cmd.OutOrStdout(), g.Output, set)
		},
	}
	cmd.Flags().StringVar(&platform, "platform", string(capability.Local), "local, docker, kubernetes, aws, azure, gcp")
	return cmd
}

func printCapabilities(w io.Writer, output string, set capability.Set) error {
	if output == cli.OutputJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(set)
	}
	source := "as airlock's " + string(set.Platform) + " backend is designed"
	if set.Platform == capability.Local {
		source = "probed from this host"
	}
	if _, err := fmt.Fprintf(w, "%s capabilities (%s)\n", set.Platform, source); err != nil {
		return err
	}
	rows := [][]string{{"CAPABILITY", "ENFORCED", "REASON"}}
	for _, n := range capability.Names {
		st, ok := set.Entries[n]
		switch {
		case !ok:
			rows = append(rows, []string{string(n), "no", "not published"})
		case st.Supported:
			rows = append(rows, []string{string(n), "yes", ""})
		default:
			rows = append(rows, []string{string(n), "no", st.Reason})
		}
	}
	if err := writeTable(w, rows); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, "bounds: "+formatBounds(set.Bounds))
	return err
}

func formatBounds(b capability.Bounds) string {
	var parts []string
	add := func(name string, v int64, unit string) {
		if v > 0 {
			parts = append(parts, fmt.Sprintf("%s %d%s", name, v, unit))
		}
	}
	add("maxLifetime", b.MaxLifetimeSeconds, "s")
	add("cpu", b.MaxCPUMillis, "m")
	add("memory", b.MaxMemoryBytes, " bytes")
	add("maxProcesses", b.MaxProcesses, "")
	add("domains", int64(b.MaxDomains), "")
	add("minIdleTimeout", b.MinIdleTimeoutSeconds, "s")
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
