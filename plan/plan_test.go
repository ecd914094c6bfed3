package plan

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// fullSet supports every capability and has no bounds: only what a test takes away is refused.
func fullSet(p capability.Platform) capability.Set {
	s := capability.Set{Platform: p, Entries: map[capability.Name]capability.Status{}}
	for _, n := range capability.Names {
		s.Entries[n] = capability.Status{Supported: true}
	}
	return s
}

// without takes capabilities away from s, each with the reason "no <name> here".
func without(s capability.Set, names ...capability.Name) capability.Set {
	e := make(map[capability.Name]capability.Status, len(s.Entries))
	for k, v := range s.Entries {
		e[k] = v
	}
	for _, n := range names {
		e[n] = capability.Status{Reason: "no " + string(n) + " here"}
	}
	s.Entries = e
	return s
}

func bounded(s capability.Set, b capability.Bounds) capability.Set { s.Bounds = b; return s }

func i64(v int64) *int64 { return &v }
func yes() *bool         { v := true; return &v }
func no() *bool          { v := false; return &v }

func stackOf(sbs ...spec.Sandbox) *spec.Stack {
	return &spec.Stack{APIVersion: spec.APIVersion, Sandboxes: sbs}
}

func hostSandbox(f func(*spec.Sandbox)) spec.Sandbox {
	sb := spec.Sandbox{ID: "py", Image: spec.Image{Host: true}}
	if f != nil {
		f(&sb)
	}
	return sb
}

// summary renders refusals as "field needs" lines, the shape the rule tests compare.
func summary(res Result) []string {
	out := []string{}
	for _, r := range res.Refusals {
		out = append(out, r.Field+" "+r.Needs())
	}
	return out
}

func TestCheckRules(t *testing.T) {
	local := capability.Local
	full := fullSet(local)
	tests := []struct {
		name     string
		stack    *spec.Stack
		platform capability.Platform
		set      capability.Set
		want     []string
	}{
		{name: "clean", stack: stackOf(hostSandbox(nil)), set: full, want: []string{}},

		// Validation errors become refusals under their spec rule.
		{name: "validation: quantity syntax", stack: stackOf(hostSandbox(func(s *spec.Sandbox) { s.Limits.CPU = "abc" })),
			set: full, want: []string{"sandboxes[0].limits.cpu quantity.syntax"}},
		{name: "validation: maxProcesses zero", stack: stackOf(hostSandbox(func(s *spec.Sandbox) { s.Limits.MaxProcesses = i64(0) })),
			set: full, want: []string{"sandboxes[0].limits.maxProcesses maxProcesses.positive"}},
		{name: "validation: empty allowDomains", stack: stackOf(hostSandbox(func(s *spec.Sandbox) { s.Egress.Mode = spec.EgressAllowDomains })),
			set: full, want: []string{"sandboxes[0].egress.domains egress.domainsEmpty"}},
		{name: "validation: IP literal domain", stack: stackOf(hostSandbox(func(s *spec.Sandbox) {
			s.Egress = spec.Egress{Mode: spec.EgressAllowDomains, Domains: []string{"10.0.0.1"}}
		})), set: full, want: []string{"sandboxes[0].egress.domains[0] domain.ipLiteral"}},
		{name: "validation: stack apiVersion", stack: &spec.Stack{APIVersion: "v0", Sandboxes: []spec.Sandbox{hostSandbox(nil)}},
			set: full, want: []string{"apiVersion apiVersion"}},

		{name: "platform unknown", stack: stackOf(hostSandbox(nil)), platform: "openstack", set: capability.Set{},
			want: []string{"platform platform.unknown"}},

		{name: "gcp without hostedBy", stack: stackOf(hostSandbox(nil)), platform: capability.GCP, set: fullSet(capability.GCP),
			want: []string{"sandboxes[0].hostedBy gcp.requiresHost"}},
		{name: "gcp with hostedBy", platform: capability.GCP, set: fullSet(capability.GCP), stack: &spec.Stack{
			APIVersion: spec.APIVersion,
			Sandboxes:  []spec.Sandbox{hostSandbox(func(s *spec.Sandbox) { s.HostedBy = "app" })},
			Workloads:  []spec.Workload{{ID: "app", Hosts: []string{"py"}}},
		}, want: []string{}},
		{name: "gcp hosted through a workload's hosts", platform: capability.GCP, set: fullSet(capability.GCP), stack: &spec.Stack{
			APIVersion: spec.APIVersion,
			Sandboxes:  []spec.Sandbox{hostSandbox(nil)},
			Workloads:  []spec.Workload{{ID: "app", Hosts: []string{"py"}}},
		}, want: []string{}},
		{name: "gcp: a workload hosting another sandbox does not host this one", platform: capability.GCP, set: fullSet(capability.GCP), stack: &spec.Stack{
			APIVersion: spec.APIVersion,
			Sandboxes:  []spec.Sandbox{hostSandbox(nil), hostSandbox(func(s *spec.Sandbox) { s.ID = "other" })},
			Workloads:  []spec.Workload{{ID: "app", Hosts: []string{"other"}}},
		}, want: []string{"sandboxes[0].hostedBy gcp.requiresHost"}},
		{name: "hostedBy is not needed off gcp", stack: stackOf(hostSandbox(nil)), platform: capability.AWS, set: fullSet(capability.AWS), want: []string{}},

		// Image sources.
		{name: "image host", stack: stackOf(hostSandbox(nil)), set: without(full, capability.ImageHost),
			want: []string{"sandboxes[0].image imageHost"}},
		{name: "image ref", stack: stackOf(hostSandbox(func(s *spec.Sandbox) { s.Image = spec.Image{Ref: "python:3.12"} })),
			set: without(full, capability.ImageRef), want: []string{"sandboxes[0].image imageRef"}},
		{name: "image oci layout", stack: stackOf(hostSandbox(func(s *spec.Sandbox) { s.Image = spec.Image{OCILayout: "/l"} })),
			set: without(full, capability.ImageOCI), want: []string{"sandboxes[0].image imageOCI"}},
		{name: "image tarball", stack: stackOf(hostSandbox(func(s *spec.Sandbox) { s.Image = spec.Image{Tarball: "/i.tar"} })),
			set: without(full, capability.ImageOCI), want: []string{"sandboxes[0].image imageOCI"}},
		{name: "image dir", stack: stackOf(hostSandbox(func(s *spec.Sandbox) { s.Image = spec.Image{Dir: "/rootfs"} })),
			set: without(full, capability.ImageDir), want: []string{"sandboxes[0].image imageDir"}},
		{name: "image snapshot", stack: stackOf(hostSandbox(func(s *spec.Sandbox) { s.Image = spec.Image{Snapshot: "warm"} })),
			set: without(full, capability.Snapshot), want: []string{"sandboxes[0].image snapshot"}},
		{name: "other image kinds unaffected", stack: stackOf(hostSandbox(nil)),
			set: without(full, capability.ImageRef, capability.ImageOCI, capability.ImageDir, capability.Snapshot), want: []string{}},

		// Limits, checked after defaults: the defaulted ceilings are refused too.
		{name: "cpu and memory ceilings", stack: stackOf(hostSandbox(nil)), set: without(full, capability.EnforcedLimits),
			want: []string{"sandboxes[0].limits.cpu enforcedLimits", "sandboxes[0].limits.memory enforcedLimits"}},
		{name: "process limit", stack: stackOf(hostSandbox(nil)), set: without(full, capability.ProcessLimit),
			want: []string{"sandboxes[0].limits.maxProcesses processLimit"}},
		{name: "disk limit", stack: stackOf(hostSandbox(nil)), set: without(full, capability.DiskLimit),
			want: []string{"sandboxes[0].limits.disk diskLimit"}},

		// Egress modes.
		{name: "egress deny (default)", stack: stackOf(hostSandbox(nil)), set: without(full, capability.EgressDeny),
			want: []string{"sandboxes[0].egress.mode egressDeny"}},
		{name: "egress allow", stack: stackOf(hostSandbox(func(s *spec.Sandbox) { s.Egress.Mode = spec.EgressAllow })),
			set:  without(full, capability.PublicOnlyEgress, capability.EgressDeny, capability.DomainEgressRules),
			want: []string{"sandboxes[0].egress.mode publicOnlyEgress"}},
		{name: "egress allowDomains", stack: stackOf(hostSandbox(func(s *spec.Sandbox) {
			s.Egress = spec.Egress{Mode: spec.EgressAllowDomains, Domains: []string{"pypi.org"}}
		})), set: without(full, capability.DomainEgressRules, capability.EgressDeny, capability.PublicOnlyEgress),
			want: []string{"sandboxes[0].egress.mode domainEgressRules"}},

		// Session.
		{name: "lifetime (default)", stack: stackOf(hostSandbox(nil)), set: without(full, capability.SessionLifetime),
			want: []string{"sandboxes[0].session.maxLifetimeSeconds sessionLifetime"}},
		{name: "idle timeout (default)", stack: stackOf(hostSandbox(nil)), set: without(full, capability.IdleTimeout),
			want: []string{"sandboxes[0].session.idleTimeoutSeconds idleTimeout"}},
		{name: "idle timeout equal to the lifetime is held by the lifetime", stack: stackOf(hostSandbox(func(s *spec.Sandbox) {
			s.Session.MaxLifetimeSeconds = i64(300)
		})), set: without(full, capability.IdleTimeout), want: []string{}},
		{name: "idle timeout equal to an unenforced lifetime", stack: stackOf(hostSandbox(func(s *spec.Sandbox) {
			s.Session.MaxLifetimeSeconds, s.Session.IdleTimeoutSeconds = i64(300), i64(300)
		})), set: without(full, capability.IdleTimeout, capability.SessionLifetime), want: []string{
			"sandboxes[0].session.maxLifetimeSeconds sessionLifetime", "sandboxes[0].session.idleTimeoutSeconds idleTimeout"}},
		{name: "idle timeout one second short of the lifetime", stack: stackOf(hostSandbox(func(s *spec.Sandbox) {
			s.Session.MaxLifetimeSeconds, s.Session.IdleTimeoutSeconds = i64(300), i64(299)
		})), set: without(full, capability.IdleTimeout), want: []string{"sandboxes[0].session.idleTimeoutSeconds idleTimeout"}},
		{name: "reconnect (default true)", stack: stackOf(hostSandbox(nil)), set: without(full, capability.Reconnect),
			want: []string{"sandboxes[0].session.reconnect reconnect"}},
		{name: "reconnect false needs nothing", stack: stackOf(hostSandbox(func(s *spec.Sandbox) { s.Session.Reconnect = no() })),
			set: without(full, capability.Reconnect), want: []string{}},

		// Optional fields: refused only when declared.
		{name: "labels", stack: stackOf(hostSandbox(func(s *spec.Sandbox) { s.Labels = map[string]string{"team": "ml"} })),
			set: without(full, capability.Labels), want: []string{"sandboxes[0].labels labels"}},
		{name: "no labels needs nothing", stack: stackOf(hostSandbox(nil)), set: without(full, capability.Labels, capability.Preview, capability.Env), want: []string{}},
		{name: "preview ports", stack: stackOf(hostSandbox(func(s *spec.Sandbox) { s.PreviewPorts = []int{8000} })),
			set: without(full, capability.Preview), want: []string{"sandboxes[0].previewPorts preview"}},
		{name: "env", stack: stackOf(hostSandbox(func(s *spec.Sandbox) { s.Env = map[string]string{"A": "secret"} })),
			set: without(full, capability.Env), want: []string{"sandboxes[0].env env"}},
		{name: "workdir (default)", stack: stackOf(hostSandbox(nil)), set: without(full, capability.Workdir),
			want: []string{"sandboxes[0].workdir workdir"}},
		{name: "runtime gvisor", stack: stackOf(hostSandbox(func(s *spec.Sandbox) { s.Runtime = spec.RuntimeGVisor })),
			set: without(full, capability.GVisor), want: []string{"sandboxes[0].runtime gvisor"}},
		{name: "runtime docker", stack: stackOf(hostSandbox(func(s *spec.Sandbox) { s.Runtime = spec.RuntimeDocker })),
			set: without(full, capability.DockerRuntime), want: []string{"sandboxes[0].runtime dockerRuntime"}},
		{name: "runtime native needs nothing", stack: stackOf(hostSandbox(func(s *spec.Sandbox) { s.Runtime = spec.RuntimeNative })),
			set: without(full, capability.GVisor, capability.DockerRuntime), want: []string{}},

		// The platform's own bounds.
		{name: "lifetime beyond the bound", stack: stackOf(hostSandbox(func(s *spec.Sandbox) { s.Session.MaxLifetimeSeconds = i64(7201) })),
			set: bounded(full, capability.Bounds{MaxLifetimeSeconds: 7200}), want: []string{"sandboxes[0].session.maxLifetimeSeconds bound.lifetime"}},
		{name: "lifetime at the bound", stack: stackOf(hostSandbox(func(s *spec.Sandbox) { s.Session.MaxLifetimeSeconds = i64(7200) })),
			set: bounded(full, capability.Bounds{MaxLifetimeSeconds: 7200}), want: []string{}},
		{name: "default lifetime beyond the bound", stack: stackOf(hostSandbox(nil)),
			set: bounded(full, capability.Bounds{MaxLifetimeSeconds: 1800}), want: []string{"sandboxes[0].session.maxLifetimeSeconds bound.lifetime"}},
		{name: "too many domains", stack: stackOf(hostSandbox(func(s *spec.Sandbox) {
			s.Egress = spec.Egress{Mode: spec.EgressAllowDomains, Domains: []string{"a.example", "b.example", "c.example"}}
		})), set: bounded(full, capability.Bounds{MaxDomains: 2}), want: []string{"sandboxes[0].egress.domains bound.domains"}},
		{name: "domains at the bound", stack: stackOf(hostSandbox(func(s *spec.Sandbox) {
			s.Egress = spec.Egress{Mode: spec.EgressAllowDomains, Domains: []string{"a.example", "b.example"}}
		})), set: bounded(full, capability.Bounds{MaxDomains: 2}), want: []string{}},
		{name: "cpu beyond the bound", stack: stackOf(hostSandbox(func(s *spec.Sandbox) { s.Limits.CPU = "1001m" })),
			set: bounded(full, capability.Bounds{MaxCPUMillis: 1000}), want: []string{"sandboxes[0].limits.cpu bound.cpu"}},
		{name: "memory beyond the bound", stack: stackOf(hostSandbox(func(s *spec.Sandbox) { s.Limits.Memory = "1Gi" })),
			set: bounded(full, capability.Bounds{MaxMemoryBytes: 512 << 20}), want: []string{"sandboxes[0].limits.memory bound.memory"}},
		{name: "processes beyond the bound", stack: stackOf(hostSandbox(func(s *spec.Sandbox) { s.Limits.MaxProcesses = i64(300) })),
			set: bounded(full, capability.Bounds{MaxProcesses: 256}), want: []string{"sandboxes[0].limits.maxProcesses bound.processes"}},
		{name: "defaults within every bound", stack: stackOf(hostSandbox(nil)), set: bounded(full, capability.Bounds{
			MaxLifetimeSeconds: 3600, MaxCPUMillis: 1000, MaxMemoryBytes: 512 << 20, MaxProcesses: 256, MaxDomains: 1, MinIdleTimeoutSeconds: 600,
		}), want: []string{}},
		{name: "idle timeout below the floor", stack: stackOf(hostSandbox(func(s *spec.Sandbox) { s.Session.IdleTimeoutSeconds = i64(59) })),
			set: bounded(full, capability.Bounds{MinIdleTimeoutSeconds: 60}), want: []string{"sandboxes[0].session.idleTimeoutSeconds bound.idleTimeout"}},
		{name: "idle timeout at the floor", stack: stackOf(hostSandbox(func(s *spec.Sandbox) { s.Session.IdleTimeoutSeconds = i64(60) })),
			set: bounded(full, capability.Bounds{MinIdleTimeoutSeconds: 60}), want: []string{}},
		{name: "a short lifetime holds a short idle timeout below the floor", stack: stackOf(hostSandbox(func(s *spec.Sandbox) {
			s.Session.MaxLifetimeSeconds = i64(30)
		})), set: bounded(full, capability.Bounds{MinIdleTimeoutSeconds: 60}), want: []string{}},

		// Egress open asks nothing of a platform.
		{name: "egress open", stack: stackOf(hostSandbox(func(s *spec.Sandbox) { s.Egress.Mode = spec.EgressOpen })),
			set:  without(full, capability.PublicOnlyEgress, capability.EgressDeny, capability.DomainEgressRules, capability.LiveEgress),
			want: []string{}},

		// Kubernetes: the operator's own rules beyond capabilities.
		{name: "kubernetes: hostedBy", platform: capability.Kubernetes, set: fullSet(capability.Kubernetes), stack: &spec.Stack{
			APIVersion: spec.APIVersion,
			Sandboxes:  []spec.Sandbox{hostSandbox(func(s *spec.Sandbox) { s.HostedBy = "app" })},
			Workloads:  []spec.Workload{{ID: "app"}},
		}, want: []string{"sandboxes[0].hostedBy kubernetes.hostedBy"}},
		{name: "kubernetes: the operator's labels", platform: capability.Kubernetes, set: fullSet(capability.Kubernetes),
			stack: stackOf(hostSandbox(func(s *spec.Sandbox) {
				s.Labels = map[string]string{"airlock.dev/client": "true", "team": "a", "app.kubernetes.io/managed-by": "me", "x.airlock.dev/y": "ok"}
			})), want: []string{"sandboxes[0].labels[airlock.dev/client] kubernetes.reservedLabel", "sandboxes[0].labels[app.kubernetes.io/managed-by] kubernetes.reservedLabel"}},
		{name: "off kubernetes the operator's labels are labels", set: full,
			stack: stackOf(hostSandbox(func(s *spec.Sandbox) { s.Labels = map[string]string{"airlock.dev/client": "true"} })), want: []string{}},

		{name: "a set without an entry refuses", stack: stackOf(hostSandbox(nil)),
			set: func() capability.Set {
				s := fullSet(local)
				delete(s.Entries, capability.DiskLimit)
				return s
			}(), want: []string{"sandboxes[0].limits.disk diskLimit"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := tt.platform
			if p == "" {
				p = local
			}
			res := Check(tt.stack, p, tt.set)
			if got := summary(res); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("refusals:\n got  %q\n want %q", got, tt.want)
			}
			for _, r := range res.Refusals {
				if r.Message == "" || r.Rule == "" || r.Field == "" {
					t.Errorf("incomplete refusal %+v", r)
				}
				if (r.Rule == RuleCapability) != (r.Capability != "") {
					t.Errorf("refusal %+v: a capability refusal has rule %q and names its capability", r, RuleCapability)
				}
			}
		})
	}
}

// Every refusal of a stack, in order: stack-level, then sandboxes in order with their fields
// in declaration order (validation and capability refusals interleaved), then workloads.
func TestCheckOrder(t *testing.T) {
	st := &spec.Stack{
		APIVersion: "v0",
		Sandboxes: []spec.Sandbox{
			{ID: "a", Image: spec.Image{Host: true}, Egress: spec.Egress{Mode: spec.EgressDeny, Domains: []string{"x.example"}},
				Labels: map[string]string{"k": "v"}, Workdir: "rel"},
			{ID: "b", Image: spec.Image{Dir: "/r"}, Limits: spec.Limits{Memory: "lots"}, Runtime: spec.RuntimeGVisor},
		},
		Workloads: []spec.Workload{{ID: "w", Hosts: []string{"nope"}}},
	}
	set := without(fullSet(capability.Local), capability.EnforcedLimits, capability.Labels, capability.GVisor, capability.ImageDir)
	got := summary(Check(st, capability.Local, set))
	want := []string{
		"apiVersion apiVersion",
		"sandboxes[0].limits.cpu enforcedLimits",
		"sandboxes[0].limits.memory enforcedLimits",
		"sandboxes[0].egress.domains egress.domainsWithoutAllowDomains",
		"sandboxes[0].labels labels",
		"sandboxes[0].workdir workdir.absolute",
		"sandboxes[1].image imageDir",
		"sandboxes[1].limits.cpu enforcedLimits",
		"sandboxes[1].limits.memory quantity.syntax",
		"sandboxes[1].limits.memory enforcedLimits",
		"sandboxes[1].runtime gvisor",
		"workloads[0].hosts[0] workload.hostsUnknown",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("order:\n got  %q\n want %q", got, want)
	}
	// Stable: the same input gives the same order every time.
	for range 20 {
		if again := summary(Check(st, capability.Local, set)); !reflect.DeepEqual(again, got) {
			t.Fatalf("order changed between runs:\n%q\n%q", got, again)
		}
	}
}

func TestRefusalIsATypedError(t *testing.T) {
	st := stackOf(hostSandbox(func(s *spec.Sandbox) { s.Env = map[string]string{"TOKEN": "s3cret"} }))
	res := Check(st, capability.Azure, without(fullSet(capability.Azure), capability.Env))
	if !res.Refused() {
		t.Fatal("nothing refused")
	}
	err := res.Err()
	if !errors.Is(err, sandbox.ErrRefused) {
		t.Errorf("errors.Is(err, ErrRefused) false for %v", err)
	}
	var r *Refusal
	if !errors.As(err, &r) || r.Capability != capability.Env || r.SandboxID != "py" || r.Field != "sandboxes[0].env" {
		t.Fatalf("errors.As gave %+v", r)
	}
	if r.Value != "TOKEN" || strings.Contains(r.Error(), "s3cret") || strings.Contains(r.Message, "s3cret") {
		t.Errorf("an env value leaked: value %q, error %q", r.Value, r.Error())
	}
	if want := "sandbox py: sandboxes[0].env: environment variables cannot be honoured on azure: no env here (needs env)"; r.Error() != want {
		t.Errorf("Error() = %q\nwant      %q", r.Error(), want)
	}
	if (Result{}).Err() != nil {
		t.Error("an empty result has an error")
	}
}

func TestDefaultedValuesAreMarked(t *testing.T) {
	set := without(fullSet(capability.Local), capability.EnforcedLimits)
	res := Check(stackOf(hostSandbox(func(s *spec.Sandbox) { s.Limits.CPU = "2" })), capability.Local, set)
	if len(res.Refusals) != 2 {
		t.Fatalf("refusals %q", summary(res))
	}
	cpu, mem := res.Refusals[0], res.Refusals[1]
	if cpu.Value != "2" || strings.Contains(cpu.Message, "(default)") {
		t.Errorf("declared cpu: %+v", cpu)
	}
	if mem.Value != string(spec.DefaultMemory) || !strings.Contains(mem.Message, "memory ceiling 512Mi (default)") {
		t.Errorf("defaulted memory: %+v", mem)
	}
}

func TestCheckDoesNotModifyTheStack(t *testing.T) {
	st := stackOf(hostSandbox(nil))
	before, _ := json.Marshal(st)
	Check(st, capability.Local, fullSet(capability.Local))
	after, _ := json.Marshal(st)
	if string(before) != string(after) {
		t.Errorf("stack changed:\n%s\n%s", before, after)
	}
}

func TestSandboxIndex(t *testing.T) {
	for field, want := range map[string]int{"sandboxes[3].limits.cpu": 3, "sandboxes[12]": 12, "workloads[0].id": -1, "apiVersion": -1, "platform": -1} {
		if got := (&Refusal{Field: field}).SandboxIndex(); got != want {
			t.Errorf("SandboxIndex(%q) = %d, want %d", field, got, want)
		}
	}
}

func TestNilStack(t *testing.T) {
	if got := summary(Check(nil, capability.Local, fullSet(capability.Local))); !reflect.DeepEqual(got, []string{"apiVersion apiVersion", "sandboxes sandboxes.required"}) {
		t.Errorf("nil stack: %q", got)
	}
}

func TestResultJSON(t *testing.T) {
	b, err := json.Marshal(Check(stackOf(hostSandbox(nil)), capability.Local, fullSet(capability.Local)))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"platform":"local","refusals":[],"sandboxes":[{"id":"py","undeclared":[` +
		`{"field":"limits.cpu","value":"1","source":"default"},{"field":"limits.memory","value":"512Mi","source":"default"},` +
		`{"field":"limits.disk","value":"1Gi","source":"default"},{"field":"limits.maxProcesses","value":"256","source":"default"},` +
		`{"field":"egress.mode","value":"deny","source":"default"},{"field":"session.maxLifetimeSeconds","value":"3600","source":"default"},` +
		`{"field":"session.idleTimeoutSeconds","value":"600","source":"default"},{"field":"session.reconnect","value":"true","source":"default"},` +
		`{"field":"workdir","value":"/workspace","source":"default"}]}]}`
	if string(b) != want {
		t.Errorf("clean result JSON %s", b)
	}
	res := Check(stackOf(hostSandbox(nil)), capability.Local, without(fullSet(capability.Local), capability.Workdir))
	b, _ = json.Marshal(res)
	var back Result
	if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back, res) {
		t.Errorf("round trip: %v\n%s", err, b)
	}
}

// Against the published sets: what the design documents promise a user.
func TestCheckAgainstPublishedSets(t *testing.T) {
	allow := stackOf(hostSandbox(func(s *spec.Sandbox) {
		s.Image = spec.Image{Ref: "python:3.12"}
		s.Egress = spec.Egress{Mode: spec.EgressAllowDomains, Domains: []string{"pypi.org"}}
	}))
	k8s, err := capability.For(capability.Kubernetes)
	if err != nil {
		t.Fatal(err)
	}
	var needs []string
	for _, r := range Check(allow, capability.Kubernetes, k8s).Refusals {
		needs = append(needs, r.Needs())
	}
	if !strings.Contains(strings.Join(needs, " "), string(capability.DomainEgressRules)) {
		t.Errorf("kubernetes did not refuse allowDomains: %q", needs)
	}
	aws, _ := capability.For(capability.AWS)
	long := stackOf(hostSandbox(func(s *spec.Sandbox) { s.Session.MaxLifetimeSeconds = i64(9 * 3600) }))
	var rules []string
	for _, r := range Check(long, capability.AWS, aws).Refusals {
		rules = append(rules, r.Rule)
	}
	if !strings.Contains(strings.Join(rules, " "), RuleBoundLifetime) {
		t.Errorf("aws did not refuse a 9h lifetime: %q", rules)
	}
}

// withValues publishes platform values for undeclared properties.
func withValues(s capability.Set, v map[capability.Property]string) capability.Set {
	s.PlatformValues = v
	return s
}

// An undeclared property the platform cannot hold takes the platform's value, reported; a
// declared one is still refused; the egress mode's default is never replaced.
func TestUndeclaredTakesThePlatformValue(t *testing.T) {
	values := map[capability.Property]string{
		capability.PropCPU: "platform cpu", capability.PropMemory: "platform memory", capability.PropDisk: "platform disk",
		capability.PropMaxProcesses: "platform procs", capability.PropEgressMode: "open network",
		capability.PropLifetime: "platform life", capability.PropIdleTimeout: "platform idle",
		capability.PropReconnect: "platform reconnect", capability.PropWorkdir: "the image's",
	}
	cannot := []capability.Name{capability.EnforcedLimits, capability.DiskLimit, capability.ProcessLimit, capability.EgressDeny,
		capability.SessionLifetime, capability.IdleTimeout, capability.Reconnect, capability.Workdir}
	set := bounded(withValues(without(fullSet(capability.AWS), cannot...), values),
		capability.Bounds{MaxCPUMillis: 1, MaxMemoryBytes: 1, MaxProcesses: 1, MaxLifetimeSeconds: 1, MinIdleTimeoutSeconds: 10000})

	res := Check(stackOf(hostSandbox(nil)), capability.AWS, set)
	// The egress default (deny) is a promise about reach: refused, never an open network.
	if got, want := summary(res), []string{"sandboxes[0].egress.mode egressDeny"}; !reflect.DeepEqual(got, want) {
		t.Errorf("undeclared refusals:\n got  %q\n want %q", got, want)
	}
	if !strings.Contains(res.Refusals[0].Message, "egress mode deny (default)") {
		t.Errorf("egress refusal %q", res.Refusals[0].Message)
	}
	want := []Value{
		{capability.PropCPU, "platform cpu", SourcePlatform}, {capability.PropMemory, "platform memory", SourcePlatform},
		{capability.PropDisk, "platform disk", SourcePlatform}, {capability.PropMaxProcesses, "platform procs", SourcePlatform},
		{capability.PropLifetime, "platform life", SourcePlatform}, {capability.PropIdleTimeout, "platform idle", SourcePlatform},
		{capability.PropReconnect, "platform reconnect", SourcePlatform}, {capability.PropWorkdir, "the image's", SourcePlatform},
	}
	if len(res.Sandboxes) != 1 || res.Sandboxes[0].ID != "py" || !reflect.DeepEqual(res.Sandboxes[0].Undeclared, want) {
		t.Errorf("undeclared values:\n got  %+v\n want %+v", res.Sandboxes, want)
	}

	declared := stackOf(hostSandbox(func(s *spec.Sandbox) {
		s.Limits = spec.Limits{CPU: "1", Memory: "1Gi", Disk: "1Gi", MaxProcesses: i64(10)}
		s.Egress.Mode = spec.EgressOpen
		s.Session = spec.Session{MaxLifetimeSeconds: i64(600), IdleTimeoutSeconds: i64(60), Reconnect: yes()}
		s.Workdir = "/w"
	}))
	res = Check(declared, capability.AWS, set)
	wantRefused := []string{
		"sandboxes[0].limits.cpu enforcedLimits", "sandboxes[0].limits.cpu bound.cpu",
		"sandboxes[0].limits.memory enforcedLimits", "sandboxes[0].limits.memory bound.memory",
		"sandboxes[0].limits.disk diskLimit",
		"sandboxes[0].limits.maxProcesses processLimit", "sandboxes[0].limits.maxProcesses bound.processes",
		"sandboxes[0].session.maxLifetimeSeconds sessionLifetime", "sandboxes[0].session.maxLifetimeSeconds bound.lifetime",
		"sandboxes[0].session.idleTimeoutSeconds idleTimeout", "sandboxes[0].session.idleTimeoutSeconds bound.idleTimeout",
		"sandboxes[0].session.reconnect reconnect",
		"sandboxes[0].workdir workdir",
	}
	if got := summary(res); !reflect.DeepEqual(got, wantRefused) {
		t.Errorf("declared refusals:\n got  %q\n want %q", got, wantRefused)
	}
	if len(res.Sandboxes) != 1 || len(res.Sandboxes[0].Undeclared) != 0 {
		t.Errorf("a fully declared sandbox lists undeclared values: %+v", res.Sandboxes)
	}

	// An empty value publishes nothing: the default is refused as before.
	res = Check(stackOf(hostSandbox(nil)), capability.AWS,
		withValues(without(fullSet(capability.AWS), capability.DiskLimit), map[capability.Property]string{capability.PropDisk: ""}))
	if got, want := summary(res), []string{"sandboxes[0].limits.disk diskLimit"}; !reflect.DeepEqual(got, want) {
		t.Errorf("empty platform value:\n got  %q\n want %q", got, want)
	}
}

// What held defaults and refused ones list: airlock's value where held, nothing where refused.
func TestUndeclaredDefaults(t *testing.T) {
	res := Check(stackOf(hostSandbox(func(s *spec.Sandbox) {
		s.Limits.CPU = "2"
		s.Session.MaxLifetimeSeconds = i64(300)
	})), capability.Local, without(fullSet(capability.Local), capability.DiskLimit, capability.IdleTimeout))
	if got, want := summary(res), []string{"sandboxes[0].limits.disk diskLimit"}; !reflect.DeepEqual(got, want) {
		t.Errorf("refusals %q, want %q", got, want)
	}
	var fields []string
	for _, v := range res.Sandboxes[0].Undeclared {
		if v.Source != SourceDefault {
			t.Errorf("%s: source %q", v.Field, v.Source)
		}
		fields = append(fields, string(v.Field)+"="+v.Value)
	}
	// cpu and the lifetime are declared; the disk default is refused; the idle timeout (300,
	// the lifetime) is held by the lifetime.
	want := []string{"limits.memory=512Mi", "limits.maxProcesses=256", "egress.mode=deny",
		"session.idleTimeoutSeconds=300", "session.reconnect=true", "workdir=/workspace"}
	if !reflect.DeepEqual(fields, want) {
		t.Errorf("undeclared:\n got  %q\n want %q", fields, want)
	}
	if got := Check(stackOf(hostSandbox(nil)), "openstack", capability.Set{}); len(got.Sandboxes) != 0 {
		t.Errorf("an unknown platform resolves values: %+v", got.Sandboxes)
	}
}

// The published sets plan the examples' shapes: every platform accepts an undeclared sandbox of
// an image kind it runs, and egress open, and refuses allow where it cannot keep private and
// metadata addresses out.
func TestEveryPublishedSetPlansAnUndeclaredSandbox(t *testing.T) {
	image := map[capability.Platform]spec.Image{
		capability.Local: {Host: true}, capability.Docker: {Ref: "python:3.12"}, capability.Kubernetes: {Ref: "python:3.12"},
		capability.AWS: {Ref: "python:3.12"}, capability.Azure: {Ref: "ubuntu"}, capability.GCP: {Host: true},
	}
	for _, p := range capability.Platforms {
		if p == capability.Local {
			continue // probed from this host; cmd/airlock's goldens plan local against a fixed host
		}
		set, err := capability.For(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, mode := range []spec.EgressMode{"", spec.EgressOpen} {
			st := &spec.Stack{APIVersion: spec.APIVersion, Sandboxes: []spec.Sandbox{{ID: "a", Image: image[p], Egress: spec.Egress{Mode: mode}}}}
			if p == capability.GCP {
				st.Sandboxes[0].HostedBy = "app"
				st.Workloads = []spec.Workload{{ID: "app"}}
			}
			if got := summary(Check(st, p, set)); len(got) != 0 {
				t.Errorf("%s, egress %q: refused %q", p, mode, got)
			}
		}
		allow := stackOf(spec.Sandbox{ID: "a", Image: image[p], Egress: spec.Egress{Mode: spec.EgressAllow}})
		refused := slices.Contains(summary(Check(allow, p, set)), "sandboxes[0].egress.mode publicOnlyEgress")
		if refused == set.Has(capability.PublicOnlyEgress) {
			t.Errorf("%s: egress allow refused %v, publicOnlyEgress %v", p, refused, set.Has(capability.PublicOnlyEgress))
		}
	}
}

// Defaults fills what the platform holds and leaves the platform's values unset; declared
// values stay as written.
func TestDefaults(t *testing.T) {
	aws, err := capability.For(capability.AWS)
	if err != nil {
		t.Fatal(err)
	}
	got := Defaults(capability.AWS, aws, hostSandbox(func(s *spec.Sandbox) { s.Limits.Memory = "1Gi" }))
	if got.Limits.CPU != "" || got.Limits.Disk != "" || got.Limits.MaxProcesses != nil {
		t.Errorf("aws platform-sized properties were filled: %+v", got.Limits)
	}
	if got.Limits.Memory != "1Gi" {
		t.Errorf("declared memory became %q", got.Limits.Memory)
	}
	if got.Egress.Mode != spec.EgressDeny || got.Session.Lifetime() != spec.DefaultMaxLifetimeSeconds ||
		got.Session.MaxLifetimeSeconds == nil || got.Session.IdleTimeoutSeconds != nil || got.Workdir != spec.DefaultWorkdir || got.Runtime != spec.RuntimeNative {
		t.Errorf("aws held defaults not filled (or its own idle timeout filled): %+v", got)
	}

	want := hostSandbox(nil)
	want.ApplyDefaults()
	if got := Defaults(capability.Local, fullSet(capability.Local), hostSandbox(nil)); !reflect.DeepEqual(got, want) {
		t.Errorf("a platform that holds every default:\n got  %+v\n want %+v", got, want)
	}
	// A default the platform neither holds nor replaces is filled (and Check refuses it).
	if got := Defaults(capability.Local, without(fullSet(capability.Local), capability.DiskLimit), hostSandbox(nil)); got.Limits.Disk != spec.DefaultDisk {
		t.Errorf("refused default disk = %q", got.Limits.Disk)
	}
}

// Azure's rules: a sandbox starts from a disk image named by reference (an OCI reference is
// not one), and the azure backend's own label keys are refused, as its Create refuses them.
func TestAzureRules(t *testing.T) {
	set, err := capability.For(capability.Azure)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		sb   spec.Sandbox
		want []string
	}{
		{spec.Sandbox{ID: "a", Image: spec.Image{Ref: "ubuntu"}}, nil},
		{spec.Sandbox{ID: "a", Image: spec.Image{Ref: "node-22"}, Labels: map[string]string{"team": "x"}}, nil},
		{spec.Sandbox{ID: "a", Image: spec.Image{Ref: "docker.io/library/python:3.12"}}, []string{"sandboxes[0].image azure.diskImage"}},
		{spec.Sandbox{ID: "a", Image: spec.Image{Ref: "python:3.12"}}, []string{"sandboxes[0].image azure.diskImage"}},
		{spec.Sandbox{ID: "a", Image: spec.Image{Ref: "ubuntu"}, Labels: map[string]string{"airlock-sandbox": "b"}}, []string{"sandboxes[0].labels[airlock-sandbox] azure.reservedLabel"}},
	} {
		if got := summary(Check(stackOf(tc.sb), capability.Azure, set)); !slices.Equal(got, tc.want) {
			t.Errorf("%+v: refused %q, want %q", tc.sb, got, tc.want)
		}
	}
}
