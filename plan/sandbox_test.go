package plan_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// TestCheckSandbox: Create's check refuses exactly what its set says no to, each refusal
// naming the field (the sandbox's own path) and the capability, and ErrRefused holds.
func TestCheckSandbox(t *testing.T) {
	all := func(no ...capability.Name) capability.Set {
		s := capability.Set{Platform: capability.Docker, Entries: map[capability.Name]capability.Status{}}
		for _, n := range capability.Names {
			s.Entries[n] = capability.Status{Supported: true}
		}
		for _, n := range no {
			s.Entries[n] = capability.Status{Reason: "because " + string(n)}
		}
		return s
	}
	base := func() spec.Sandbox { return spec.Sandbox{ID: "sb", Image: spec.Image{Ref: "img:1"}} }
	tests := []struct {
		name   string
		set    capability.Set
		mod    func(*spec.Sandbox)
		fields []string // refused fields, in order; none: accepted
		caps   []capability.Name
	}{
		{"everything held", all(), nil, nil, nil},
		{"no limits", all(capability.EnforcedLimits), nil, []string{"limits.cpu", "limits.memory"}, []capability.Name{capability.EnforcedLimits, capability.EnforcedLimits}},
		{"no lifetime", all(capability.SessionLifetime), nil, []string{"session.maxLifetimeSeconds"}, []capability.Name{capability.SessionLifetime}},
		{"preview declared", all(capability.Preview), func(d *spec.Sandbox) { d.PreviewPorts = []int{8080} }, []string{"previewPorts"}, []capability.Name{capability.Preview}},
		{"preview not declared", all(capability.Preview), nil, nil, nil},
		{"egress allow", all(capability.PublicOnlyEgress), func(d *spec.Sandbox) { d.Egress.Mode = spec.EgressAllow }, []string{"egress.mode"}, []capability.Name{capability.PublicOnlyEgress}},
		{"egress open needs nothing", all(capability.PublicOnlyEgress, capability.DomainEgressRules, capability.EgressDeny), func(d *spec.Sandbox) { d.Egress.Mode = spec.EgressOpen }, nil, nil},
		{"gvisor", all(capability.GVisor), func(d *spec.Sandbox) { d.Runtime = spec.RuntimeGVisor }, []string{"runtime"}, []capability.Name{capability.GVisor}},
		{"host image", all(capability.ImageHost), func(d *spec.Sandbox) { d.Image = spec.Image{Host: true} }, []string{"image"}, []capability.Name{capability.ImageHost}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := base()
			if tc.mod != nil {
				tc.mod(&d)
			}
			d.ApplyDefaults()
			err := plan.CheckSandbox(d, tc.set)
			if len(tc.fields) == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, sandbox.ErrRefused) {
				t.Fatalf("err = %v, want ErrRefused", err)
			}
			var got []*plan.Refusal
			for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
				var r *plan.Refusal
				if !errors.As(e, &r) {
					t.Fatalf("%v is not a *plan.Refusal", e)
				}
				got = append(got, r)
			}
			if len(got) != len(tc.fields) {
				t.Fatalf("refusals %v, want fields %v", err, tc.fields)
			}
			for i, r := range got {
				if r.Field != tc.fields[i] || r.Capability != tc.caps[i] || r.SandboxID != "sb" {
					t.Errorf("refusal %d = %+v, want field %s capability %s", i, r, tc.fields[i], tc.caps[i])
				}
				if !strings.Contains(r.Error(), string(tc.caps[i])) || !strings.Contains(r.Error(), "because") {
					t.Errorf("refusal %q does not name the capability and the platform's reason", r.Error())
				}
			}
		})
	}
}

// TestCheckSandboxGCPHostedByCreator: one gcp sandbox alone (a backend's Create, inside the
// workload that runs it) is hosted by its creator; only a stack must say which workload hosts
// it (gcp.requiresHost is Check's).
func TestCheckSandboxGCPHostedByCreator(t *testing.T) {
	set, err := capability.For(capability.GCP)
	if err != nil {
		t.Fatal(err)
	}
	d := spec.Sandbox{ID: "sb", Image: spec.Image{Host: true}}
	if err := plan.CheckSandbox(d, set); err != nil {
		t.Fatalf("CheckSandbox without hostedBy: %v", err)
	}
	st := &spec.Stack{APIVersion: spec.APIVersion, Sandboxes: []spec.Sandbox{d}}
	res := plan.Check(st, capability.GCP, set)
	if len(res.Refusals) != 1 || res.Refusals[0].Rule != plan.RuleGCPRequiresHost {
		t.Fatalf("Check of the same sandbox in a stack: %v, want only %s", res.Refusals, plan.RuleGCPRequiresHost)
	}
}

// TestCheckCreateGCP: CheckCreate (a create by this process: run, the daemon, MCP) has no
// stack rule, while Check of the same sandbox as a stack file refuses it.
func TestCheckCreateGCP(t *testing.T) {
	set, err := capability.For(capability.GCP)
	if err != nil {
		t.Fatal(err)
	}
	d := spec.Sandbox{ID: "sb", Image: spec.Image{Host: true}}
	if res := plan.CheckCreate(d, capability.GCP, set); len(res.Refusals) != 0 {
		t.Fatalf("CheckCreate: %v", res.Refusals)
	}
	d.Limits.Memory = "1Gi"
	if res := plan.CheckCreate(d, capability.GCP, set); len(res.Refusals) != 1 || res.Refusals[0].Capability != capability.EnforcedLimits {
		t.Fatalf("CheckCreate of a declared memory ceiling: %v, want enforcedLimits", res.Refusals)
	}
}
