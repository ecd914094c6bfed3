package spares_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/testutil"
	"go.uber.org/goleak"
)

// agentBin is the agent binary TestMain builds (as root), for the spares the tests park.
var agentBin string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		if os.Geteuid() == 0 {
			bin, cleanup, err := testutil.Agent()
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			defer cleanup()
			agentBin = bin
		}
		if code := m.Run(); code != 0 {
			return code
		}
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			return 1
		}
		return 0
	}())
}
