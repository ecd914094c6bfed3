package capability

import (
	"testing"

	"go.uber.org/goleak"
)

// The probe talks netlink and the root test switches namespaces on its own goroutine.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
