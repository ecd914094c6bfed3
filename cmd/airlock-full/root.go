package main

import (
	"io"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/cli"
)

// commands lists the subcommands; each command's file appends its own in init, so commands
// are added without editing this file.
var commands []cli.Command

// newRootCmd builds the root with every command.
func newRootCmd() *cobra.Command { return cli.NewRoot("airlock", cli.Constructors(commands, nil)) }

// run executes the CLI with args and returns the exit status: 0 success, 1 refused or
// failed, 2 usage or input error. It builds only the command args name (cli.Constructors):
// airlock run is on the hot path (DESIGN.md, "Start-up is on the hot path").
func run(args []string, stdout, stderr io.Writer) int {
	return cli.Run(cli.NewRoot("airlock", cli.Constructors(commands, args)), args, stdout, stderr)
}
