package main

import (
	"io"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/cli"
)

// commands lists the constructors of the subcommands; each command's file appends its own in
// init, so commands are added without editing this file.
var commands []func(*cli.Globals) *cobra.Command

func newRootCmd() *cobra.Command { return cli.NewRoot("airlock", commands) }

// run executes the CLI with args and returns the exit status: 0 success, 1 refused or
// failed, 2 usage or input error.
func run(args []string, stdout, stderr io.Writer) int {
	return cli.Run(newRootCmd(), args, stdout, stderr)
}
