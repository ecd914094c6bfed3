package local

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/backend/local/nsinit"
	"github.com/airlock-sandbox/airlock/spec"
)

// TestAgentPolicy: a local sandbox's agent (namespaces and gVisor alike: both take
// resolved.policy) gets its run policy from wire.NewPolicy: no copy of the defaults, the
// refused paths, the output cap or the idle rule here; the runtime's directory refused, the
// code's user named, the image's environment under the declaration's.
func TestAgentPolicy(t *testing.T) {
	i := func(v int64) *int64 { return &v }
	for _, tc := range []struct {
		name       string
		life, idle int64
		wantIdle   time.Duration
	}{{"idle shorter than the lifetime", 3600, 600, 600 * time.Second}, {"idle as long as the lifetime", 60, 60, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			d := spec.Sandbox{ID: "sb", Env: map[string]string{"A": "decl"}}
			d.Session.MaxLifetimeSeconds, d.Session.IdleTimeoutSeconds = i(tc.life), i(tc.idle)
			d.ApplyDefaults()
			imageEnv := []string{"A=image", "B=image"}
			life := time.Duration(tc.life) * time.Second
			got := agentPolicy(d, "/workspace", imageEnv, life)
			want := wire.NewPolicy(wire.PolicyFor{Workdir: "/workspace", User: nsinit.CodeUser, ImageEnv: imageEnv, Env: d.Env,
				Lifetime: life, IdleTimeout: time.Duration(tc.idle) * time.Second, RuntimePaths: []string{nsinit.AirlockDir}})
			if !reflect.DeepEqual(got, want) {
				t.Errorf("policy %+v, want the builder's %+v", got, want)
			}
			if got.IdleTimeout != tc.wantIdle || !slices.Contains(got.DenyPaths, nsinit.AirlockDir) || got.Env["A"] != "decl" || got.Env["B"] != "image" {
				t.Errorf("policy %+v", got)
			}
		})
	}
}
