package spares_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
)

// agentBin is the agent binary TestMain builds (as root), for the spares the tests park.
var agentBin string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		if os.Geteuid() == 0 {
			dir, err := os.MkdirTemp("", "airlock-agent-")
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			defer os.RemoveAll(dir)
			// The sandbox's mapped root runs the binary: it must be reachable by others.
			if err := os.Chmod(dir, 0o755); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			agentBin = filepath.Join(dir, "airlock-agent")
			if pre := os.Getenv("AIRLOCK_TEST_AGENT"); pre != "" {
				raw, err := os.ReadFile(pre)
				if err == nil {
					err = os.WriteFile(agentBin, raw, 0o755)
				}
				if err != nil {
					fmt.Fprintf(os.Stderr, "AIRLOCK_TEST_AGENT: %v\n", err)
					return 1
				}
			} else {
				build := exec.Command("go", "build", "-o", agentBin, "github.com/airlock-sandbox/airlock/cmd/airlock-agent")
				build.Env = append(os.Environ(), "CGO_ENABLED=0") // static, as shipped
				if out, err := build.CombinedOutput(); err != nil {
					fmt.Fprintf(os.Stderr, "build agent: %v\n%s", err, out)
					return 1
				}
			}
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
