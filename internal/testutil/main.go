package testutil

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// MainWithAgent is the TestMain of a package whose root tests run sandboxes: as root it builds
// the agent (Agent) into *agentBin for the package's tests, runs them, and after a passing run
// fails on leaked goroutines (goleak, with opts). It returns the exit code for os.Exit.
func MainWithAgent(m *testing.M, agentBin *string, opts ...goleak.Option) int {
	if os.Geteuid() == 0 {
		bin, cleanup, err := Agent()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer cleanup()
		*agentBin = bin
	}
	if code := m.Run(); code != 0 {
		return code
	}
	if err := goleak.Find(opts...); err != nil {
		fmt.Fprintln(os.Stderr, "goleak:", err)
		return 1
	}
	return 0
}
