package gcp

import (
	"reflect"
	"slices"
	"testing"

	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/spec"
)

// TestAgentPolicy: a launcher sandbox's agent (and the no-agent path's environment) get their
// run policy from wire.NewPolicy: no copy of the defaults, the refused paths or the output cap
// here; the agent's directory refused, no USER (the launcher's one user has no name of ours),
// maxTimeout bounding deadlines, no idle timeout (the launcher has none).
func TestAgentPolicy(t *testing.T) {
	d := spec.Sandbox{ID: "sb", Env: map[string]string{"PATH": "/decl"}}
	d.ApplyDefaults()
	got := agentPolicy(d, "/work")
	want := wire.NewPolicy(wire.PolicyFor{Workdir: "/work", Env: d.Env, Lifetime: maxTimeout, RuntimePaths: runtimePaths})
	if !reflect.DeepEqual(got, want) {
		t.Errorf("policy %+v, want the builder's %+v", got, want)
	}
	if !slices.Contains(got.DenyPaths, agentDir) || got.Env["PATH"] != "/decl" || got.Env["USER"] != "" || got.IdleTimeout != 0 {
		t.Errorf("policy %+v", got)
	}
	// A workdir in a refused path is refused.
	d.Workdir = "/proc/x"
	if _, err := resolve(d); err == nil {
		t.Error("a workdir below /proc was accepted")
	}
}
