package sessions_test

import (
	"os"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// agentBin is the agent binary TestMain builds (as root), for the parked sandboxes the tests park.
var agentBin string

func TestMain(m *testing.M) { os.Exit(testutil.MainWithAgent(m, &agentBin)) }
