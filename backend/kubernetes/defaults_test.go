package kubernetes

import (
	"reflect"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/spec"
)

// The facts a user relies on in the published set (the one copy: capability.For has none).
func TestPublishedFacts(t *testing.T) {
	set := Published()
	for _, tt := range []struct {
		n    capability.Name
		want bool
		why  string // substring of the reason when false
	}{
		{capability.DomainEgressRules, true, ""},
		{capability.EgressDeny, true, ""},
		{capability.PublicOnlyEgress, true, ""},
		{capability.ProcessLimit, true, ""},
		{capability.IdleTimeout, true, ""},
		{capability.ImageOCI, false, "push it to a registry"},
		{capability.GVisor, false, "RLIMIT_NPROC"},
		{capability.SuspendResume, false, "pods cannot be paused"},
		{capability.ImageRef, true, ""},
	} {
		st := set.Entries[tt.n]
		if st.Supported != tt.want || !strings.Contains(st.Reason, tt.why) {
			t.Errorf("%s = %+v, want supported %v with reason containing %q", tt.n, st, tt.want, tt.why)
		}
	}
	if set.Platform != capability.Kubernetes || set.Bounds != (capability.Bounds{}) {
		t.Errorf("platform %q, bounds %+v", set.Platform, set.Bounds)
	}
}

// TestEveryDefaultIsHeld: the operator (Accept, the broker's declaration check) and fits apply
// airlock's defaults (spec.ApplyDefaults) to what they compare, while the server, run_code and
// MCP give Create plan.Defaults. They agree only while the kubernetes set holds every default
// and publishes no platform value; a set that gains one must move the operator to plan.Defaults.
func TestEveryDefaultIsHeld(t *testing.T) {
	set := Published()
	if len(set.PlatformValues) != 0 {
		t.Fatalf("the kubernetes set publishes platform values %v: the operator's Accept applies airlock's defaults instead", set.PlatformValues)
	}
	two := int64(2)
	for _, decl := range []spec.Sandbox{
		{ID: "a", Image: spec.Image{Ref: "python:3.12"}},
		{ID: "b", Image: spec.Image{Ref: "python:3.12"}, Limits: spec.Limits{Memory: "1Gi"}, Session: spec.Session{MaxLifetimeSeconds: &two}},
	} {
		want := decl
		want.ApplyDefaults()
		if got := plan.Defaults(set.Platform, set, decl); !reflect.DeepEqual(got, want) {
			t.Errorf("plan.Defaults(%s) = %+v, spec defaults %+v", decl.ID, got, want)
		}
	}
}
