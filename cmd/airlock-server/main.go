// Command airlock-server runs airlock's daemons: serve (the HTTP API) and mcp (the MCP
// server). `airlock serve` and `airlock mcp` run it; it is a binary of its own so that the
// one-shot CLI does not link, nor initialise, the server side.
package main

import (
	"os"
	"path/filepath"

	"github.com/airlock-sandbox/airlock/internal/cli"
	"github.com/airlock-sandbox/airlock/internal/servercmd"
)

func main() {
	// Run as `airlock serve` (argv[0] "airlock"), messages name that command.
	name := "airlock-server"
	if len(os.Args) > 0 && filepath.Base(os.Args[0]) == "airlock" {
		name = "airlock"
	}
	os.Exit(cli.Run(cli.NewRoot(name, servercmd.Commands), os.Args[1:], os.Stdout, os.Stderr))
}
