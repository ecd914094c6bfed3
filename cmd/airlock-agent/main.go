// Command airlock-agent is the lean in-sandbox agent; see internal/agentcmd.
package main

import (
	"os"

	"github.com/airlock-sandbox/airlock/internal/agentcmd"
)

func main() { os.Exit(agentcmd.Main(os.Args[1:])) }
