package server

import (
	"context"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// sizingFake is a platform that sizes its sandboxes itself (an aws-like set: no cpu, memory,
// disk or process ceiling, its own values for them) and whose Create checks what it is given
// against that set, as every backend's does.
type sizingFake struct {
	*fakeBackend
	set     capability.Set
	created []spec.Sandbox
}

func newSizingFake() *sizingFake {
	set := capability.Set{Platform: capability.AWS, Entries: map[capability.Name]capability.Status{},
		PlatformValues: map[capability.Property]string{
			capability.PropCPU:          "platform-sized (tier cpu)",
			capability.PropMemory:       "platform-sized (tier 2048 MiB)",
			capability.PropDisk:         "platform-sized (tier disk)",
			capability.PropMaxProcesses: "unbounded",
		}}
	for _, n := range capability.Names {
		set.Entries[n] = capability.Status{Supported: true}
	}
	for _, n := range []capability.Name{capability.EnforcedLimits, capability.ProcessLimit, capability.DiskLimit, capability.ImageHost} {
		set.Entries[n] = capability.Status{Reason: "the platform sizes its sandboxes"}
	}
	return &sizingFake{fakeBackend: newFake(), set: set}
}

func (f *sizingFake) Platform() capability.Platform               { return f.set.Platform }
func (f *sizingFake) Capabilities(context.Context) capability.Set { return f.set }
func (f *sizingFake) Create(ctx context.Context, d spec.Sandbox) (*sandbox.Session, error) {
	if err := plan.CheckSandbox(d, f.set); err != nil {
		return nil, err
	}
	f.created = append(f.created, d)
	return f.fakeBackend.Create(ctx, d)
}

// TestCreateTakesPlatformValues: through the HTTP API, properties left undeclared reach Create
// unset where the platform's own value applies and at airlock's default where the platform
// holds it; a declared value the platform cannot hold is still refused, naming the field and
// the capability, before Create.
func TestCreateTakesPlatformValues(t *testing.T) {
	f := newSizingFake()
	s, _ := newTestServer(t, f)
	h := s.Handler(Unix)

	w, e := serve(h, "POST", "/v1/sandboxes", "", strings.NewReader(`{"id":"x","image":"docker.io/library/python:3.12"}`))
	if w.Code != 201 {
		t.Fatalf("undeclared limits on a platform with its own values: %d %+v", w.Code, e)
	}
	if len(f.created) != 1 {
		t.Fatalf("created %d", len(f.created))
	}
	got := f.created[0]
	if got.Limits.CPU != "" || got.Limits.Memory != "" || got.Limits.Disk != "" || got.Limits.MaxProcesses != nil {
		t.Errorf("limits given to Create %+v: want each left to the platform", got.Limits)
	}
	if got.Workdir != spec.DefaultWorkdir || got.Egress.Mode != spec.DefaultEgressMode ||
		got.Session.Lifetime() != spec.DefaultMaxLifetimeSeconds || got.Session.MaxLifetimeSeconds == nil {
		t.Errorf("what the platform holds did not get airlock's default: %+v", got)
	}

	for _, tc := range []struct {
		body, field string
		cap         capability.Name
	}{
		{`{"id":"y","image":"docker.io/library/python:3.12","limits":{"memory":"256Mi"}}`, "limits.memory", capability.EnforcedLimits},
		{`{"id":"y","image":"docker.io/library/python:3.12","limits":{"maxProcesses":64}}`, "limits.maxProcesses", capability.ProcessLimit},
		{`{"id":"y","image":"docker.io/library/python:3.12","limits":{"disk":"1Gi"}}`, "limits.disk", capability.DiskLimit},
	} {
		w, e := serve(h, "POST", "/v1/sandboxes", "", strings.NewReader(tc.body))
		if w.Code != 422 || e.Code != "refused" || len(e.Problems) != 1 || e.Problems[0].Field != tc.field || e.Problems[0].Capability != tc.cap {
			t.Errorf("%s: %d %+v; want 422 naming %s and %s", tc.body, w.Code, e, tc.field, tc.cap)
		}
	}
	if len(f.created) != 1 {
		t.Errorf("a refused declaration reached Create: %d created", len(f.created))
	}
}
