package plan

import (
	"encoding/json"
	"errors"
	"reflect"
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
			MaxLifetimeSeconds: 3600, MaxCPUMillis: 1000, MaxMemoryBytes: 512 << 20, MaxProcesses: 256, MaxDomains: 1,
		}), want: []string{}},

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
	if string(b) != `{"platform":"local","refusals":[]}` {
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
