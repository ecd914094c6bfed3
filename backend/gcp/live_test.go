package gcp

import (
	"context"
	"os"
	"testing"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/sandbox/conformance"
)

// TestLive runs the suite against the real launcher, from inside a launcher-enabled Cloud Run
// instance (deploy/gcp; docs/platforms/gcp.md says how): AIRLOCK_LIVE_GCP=1, the launcher at
// its default path or $AIRLOCK_GCP_LAUNCHER, the agent as the backend finds it
// ($AIRLOCK_AGENT, or airlock-agent next to the test binary or on PATH).
func TestLive(t *testing.T) {
	if os.Getenv("AIRLOCK_LIVE_GCP") != "1" {
		t.Skip("set AIRLOCK_LIVE_GCP=1 inside a launcher-enabled Cloud Run instance to run against the real launcher")
	}
	newLive := func(t *testing.T) sandbox.Backend {
		b, err := New(context.Background(), Options{})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	live := func(f func(*testing.T, *Backend)) func(*testing.T) {
		return func(t *testing.T) { f(t, newLive(t).(*Backend)) }
	}
	conformance.Run(t, newLive, conformance.Options{
		Decl:             decl,
		PlatformDefaults: true,
		Extra: []conformance.Subtest{
			{Name: "EveryExitStatus", Run: live(everyExitStatusOn)},
			{Name: "FiveMegabyteFile", Exercises: []capability.Name{capability.Files}, Run: live(bigFileOn)},
		},
	})
}
