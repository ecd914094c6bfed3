package kubernetes

import (
	"reflect"
	"testing"

	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/spec"
)

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
