//go:build linux

package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/agentcmd"
	"github.com/airlock-sandbox/airlock/internal/cli"
)

func init() { commands = append(commands, cli.Command{Names: []string{"__agent"}, New: newAgentCmd}) }

// newAgentCmd runs this binary as the in-sandbox agent: the fallback when the lean
// airlock-agent binary is not found (DESIGN.md, "Start-up is on the hot path").
func newAgentCmd(*cli.Globals) *cobra.Command {
	return &cobra.Command{
		Use:                "__agent",
		Hidden:             true,
		DisableFlagParsing: true,
		Run:                func(cmd *cobra.Command, args []string) { os.Exit(agentcmd.Main(args)) },
	}
}
