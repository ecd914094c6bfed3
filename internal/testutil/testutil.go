// Package testutil holds helpers shared by tests.
package testutil

import (
	"os"
	"testing"
)

// RequireRoot skips a test that needs root, unless AIRLOCK_REQUIRE_ROOT=1 (set by CI), in
// which case not being root fails the test: root suites run in CI, they are never skipped there.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("AIRLOCK_REQUIRE_ROOT") == "1" {
		t.Fatal("this test needs root and AIRLOCK_REQUIRE_ROOT=1 forbids skipping it")
	}
	t.Skip("needs root (CI runs it as root)")
}
