package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/cli"
	"github.com/airlock-sandbox/airlock/spec"
)

func init() { commands = append(commands, cli.Command{Names: []string{"egress"}, New: newEgressCmd}) }

// newEgressCmd shows a live sandbox's egress counters, or changes its egress policy.
func newEgressCmd(g *cli.Globals) *cobra.Command {
	d := &daemonFlags{}
	var mode string
	var domains []string
	cmd := &cobra.Command{
		Use:   "egress SESSION [--mode deny|allow|allowDomains] [--allow-domain NAME]...",
		Short: "Show a sandbox's egress counters, or change its egress policy while it runs",
		Long: `Without --mode or --allow-domain, print the sandbox's egress counters. With them, replace
its egress policy on the daemon: new connections and DNS queries follow at once; a move to
deny cuts established connections. --allow-domain alone means --mode allowDomains. Changing
egress needs daemon rights (the socket or an API key), not a delegated token.`,
		Example: `  airlock egress s-0123456789abcdef
  airlock egress s-0123456789abcdef --allow-domain api.example.com --allow-domain '*.pypi.org'
  airlock egress s-0123456789abcdef --mode deny`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return cli.UsageError("want one SESSION (s-…), got %d arguments\nsee '%s --help'", len(args), cmd.CommandPath())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			set := cmd.Flags().Changed("mode") || len(domains) > 0
			e := spec.Egress{Mode: spec.EgressMode(mode), Domains: domains}
			if set {
				if !cmd.Flags().Changed("mode") {
					e.Mode = spec.EgressAllowDomains
				}
				if !slices.Contains(spec.EgressModes, e.Mode) {
					return cli.UsageError("--mode %q: allowed are %s", mode, joinModes())
				}
				if len(domains) > 0 && e.Mode != spec.EgressAllowDomains {
					return cli.UsageError("--allow-domain needs --mode %s (got %s)", spec.EgressAllowDomains, e.Mode)
				}
				if e.Mode == spec.EgressAllowDomains && len(domains) == 0 {
					return cli.UsageError("--mode %s needs at least one --allow-domain", spec.EgressAllowDomains)
				}
			}
			c, err := d.client()
			if err != nil {
				return err
			}
			defer c.Close()
			sb := c.Sandbox(args[0])
			out := cmd.OutOrStdout()
			if set {
				if err := sb.SetEgress(cmd.Context(), e); err != nil {
					return daemonError(err)
				}
				if g.Output == cli.OutputJSON {
					return printJSON(out, map[string]any{"session": sb.ID, "egress": e})
				}
				line := fmt.Sprintf("%s: egress %s", sb.ID, e.Mode)
				if len(e.Domains) > 0 {
					line += " " + strings.Join(e.Domains, ", ")
				}
				_, err := fmt.Fprintln(out, line)
				return err
			}
			ct, err := sb.EgressCounters(cmd.Context())
			if err != nil {
				return daemonError(err)
			}
			if g.Output == cli.OutputJSON {
				return printJSON(out, ct)
			}
			u := func(v uint64) string { return strconv.FormatUint(v, 10) }
			return writeTable(out, [][]string{
				{"connections allowed", u(ct.ConnsAllowed)},
				{"connections denied", u(ct.ConnsDenied)},
				{"dial failures", u(ct.DialFailures)},
				{"bytes sent", u(ct.BytesSent)},
				{"bytes received", u(ct.BytesReceived)},
				{"dns answered", u(ct.DNSAllowed)},
				{"dns refused", u(ct.DNSDenied)},
				{"packets dropped", u(ct.PacketsDropped)},
			})
		},
	}
	d.add(cmd)
	cmd.Flags().StringVar(&mode, "mode", "", "new egress mode: "+joinModes())
	cmd.Flags().StringArrayVar(&domains, "allow-domain", nil, "a name (api.example.com) or wildcard (*.example.com) to allow; repeatable")
	return cmd
}

func joinModes() string {
	s := make([]string, len(spec.EgressModes))
	for i, m := range spec.EgressModes {
		s[i] = string(m)
	}
	return strings.Join(s, ", ")
}
