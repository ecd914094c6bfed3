package main

import (
	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/cli"
	"github.com/airlock-sandbox/airlock/platform"
)

// newSandboxCapabilitiesCmd prints the daemon's platform and capability set: sandbox commands
// run where the daemon's --platform put them, not where this command's settings would.
func newSandboxCapabilitiesCmd(g *cli.Globals, d *daemonFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "capabilities",
		Short: "Print the daemon's platform and what it enforces (GET /v1/capabilities)",
		Args:  cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := d.client()
			if err != nil {
				return err
			}
			defer c.Close()
			set, err := c.Capabilities(cmd.Context())
			if err != nil {
				return daemonError(err)
			}
			return printCapabilities(cmd.OutOrStdout(), g.Output, set, platform.Source{Instance: true, Text: "the daemon's"})
		},
	}
}
