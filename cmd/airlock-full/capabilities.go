package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/internal/cli"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/platform"
)

func init() {
	commands = append(commands, cli.Command{Names: []string{"capabilities"}, New: newCapabilitiesCmd})
}

func newCapabilitiesCmd(g *cli.Globals) *cobra.Command {
	var plat string
	cmd := &cobra.Command{
		Use:   "capabilities [--platform P]",
		Short: "Print what a platform enforces, and why each missing capability is missing",
		Long: `Print a platform's capability set: each capability, whether the platform enforces it, and
the reason when it does not. Without --platform (or $AIRLOCK_PLATFORM, or the config file's)
it is the platform auto chooses on this machine, and why. Where the platform's backend can be
opened here (the local runtime, a container engine, a configured cluster broker) the set is
that backend's own, the one its Create checks; elsewhere it is the set airlock's backend for
the platform publishes (aws, azure, gcp: their designs, until their bindings are built).
Bounds are the platform's own ceilings.`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cli.PlatformSettings(cmd.Flags(), plat)
			if err != nil {
				return err
			}
			c.Local.StateDir = statedir.DefaultDirForUser()
			set, src, err := platform.Capabilities(cmd.Context(), c)
			if err != nil {
				return err
			}
			return printCapabilities(cmd.OutOrStdout(), g.Output, set, src)
		},
	}
	cli.AddPlatform(cmd.Flags(), &plat)
	return cmd
}

func printCapabilities(w io.Writer, output string, set capability.Set, src platform.Source) error {
	if output == cli.OutputJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(set)
	}
	if src.Choice.Auto {
		if _, err := fmt.Fprintf(w, "platform: %s (%s)\n", set.Platform, src.Choice.Why); err != nil {
			return err
		}
	}
	if _, err := fmt.Fprintf(w, "%s capabilities (%s)\n", set.Platform, src.Text); err != nil {
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
