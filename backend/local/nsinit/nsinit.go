// Package nsinit is the in-namespace first stage of a local sandbox: it builds the root and becomes the agent.
package nsinit

import (
	"fmt"
	"os"
)

// Main runs the init stage; the local backend starts the agent binary as "init" inside new
// namespaces. Replaced by the local runtime work.
func Main(args []string) int {
	fmt.Fprintln(os.Stderr, "airlock-agent init: local runtime not built yet")
	return 2
}
