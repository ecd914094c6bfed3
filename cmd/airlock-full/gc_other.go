//go:build !linux

package main

import (
	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/cli"
	"github.com/airlock-sandbox/airlock/platform"
)

func init() { commands = append(commands, cli.Command{Names: []string{"gc"}, New: newGCCmd}) }

// newGCCmd refuses: gc reaps what the local runtime's killed runs leave (session records,
// cgroups), and the local runtime needs Linux.
func newGCCmd(*cli.Globals) *cobra.Command {
	return &cobra.Command{
		Use:                "gc",
		Short:              "Remove what killed airlock processes left (local runtime; Linux only)",
		DisableFlagParsing: true,
		RunE:               func(*cobra.Command, []string) error { return platform.ErrLocalNeedsLinux() },
	}
}
