package operator

import (
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/backend/kubernetes"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/operator/api/v1alpha1"
	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/spec"
)

// `airlock plan --platform kubernetes` and the operator give the same verdict on every
// declaration: what plan accepts the operator runs, and what the operator refuses plan refused
// first, naming the same field.
func TestPlanAgreesWithAccept(t *testing.T) {
	set := kubernetes.Published()
	if set.Platform != capability.Kubernetes {
		t.Fatalf("published set is for %q", set.Platform)
	}
	tests := []struct {
		name  string
		mut   func(*v1alpha1.SandboxSpec)
		field string // "" = both accept; else the field both refuse
	}{
		{"minimal", nil, ""},
		{"everything left to its default", func(s *v1alpha1.SandboxSpec) { s.Limits = spec.Limits{} }, ""},
		{"declared limits and session", func(s *v1alpha1.SandboxSpec) {
			s.Limits.MaxProcesses = i64(64)
			s.Session = spec.Session{MaxLifetimeSeconds: i64(36000), IdleTimeoutSeconds: i64(60)}
		}, ""},
		{"env, workdir, ordinary labels", func(s *v1alpha1.SandboxSpec) {
			s.Env = map[string]string{"A": "b"}
			s.Workdir = "/w"
			s.Labels = map[string]string{"team": "a", "x.airlock.dev/y": "z", "app.kubernetes.io/name": "n"}
		}, ""},
		{"egress deny", func(s *v1alpha1.SandboxSpec) { s.Egress.Mode = spec.EgressDeny }, ""},
		{"egress allow", func(s *v1alpha1.SandboxSpec) { s.Egress.Mode = spec.EgressAllow }, ""},
		{"egress open", func(s *v1alpha1.SandboxSpec) { s.Egress.Mode = spec.EgressOpen }, ""},
		{"runtime native", func(s *v1alpha1.SandboxSpec) { s.Runtime = spec.RuntimeNative }, ""},
		{"egress allowDomains", func(s *v1alpha1.SandboxSpec) {
			s.Egress = spec.Egress{Mode: spec.EgressAllowDomains, Domains: []string{"pypi.org"}}
		}, ""},
		{"preview ports", func(s *v1alpha1.SandboxSpec) { s.PreviewPorts = []int{8080} }, "previewPorts"},
		{"hostedBy", func(s *v1alpha1.SandboxSpec) { s.HostedBy = "app" }, "hostedBy"},
		{"label airlock.dev/client", func(s *v1alpha1.SandboxSpec) { s.Labels = map[string]string{"airlock.dev/client": "true"} }, "labels"},
		{"label airlock.dev/state", func(s *v1alpha1.SandboxSpec) { s.Labels = map[string]string{"airlock.dev/state": "idle"} }, "labels"},
		{"label managed-by", func(s *v1alpha1.SandboxSpec) {
			s.Labels = map[string]string{LabelManagedBy: "someone", "team": "a"}
		}, "labels"},
		{"runtime gvisor", func(s *v1alpha1.SandboxSpec) { s.Runtime = spec.RuntimeGVisor }, "runtime"},
		{"runtime docker", func(s *v1alpha1.SandboxSpec) { s.Runtime = spec.RuntimeDocker }, "runtime"},
		{"image host", func(s *v1alpha1.SandboxSpec) { s.Image = spec.Image{Host: true} }, "image"},
		{"image dir", func(s *v1alpha1.SandboxSpec) { s.Image = spec.Image{Dir: "/srv/root"} }, "image"},
		{"image OCI layout", func(s *v1alpha1.SandboxSpec) { s.Image = spec.Image{OCILayout: "/srv/layout"} }, "image"},
		{"image tarball", func(s *v1alpha1.SandboxSpec) { s.Image = spec.Image{Tarball: "/srv/i.tar"} }, "image"},
		{"image snapshot", func(s *v1alpha1.SandboxSpec) { s.Image = spec.Image{Snapshot: "warm"} }, "image"},
		{"invalid memory", func(s *v1alpha1.SandboxSpec) { s.Limits.Memory = "lots" }, "limits.memory"},
		{"memory + disk past 8 EiB", func(s *v1alpha1.SandboxSpec) { s.Limits.Memory, s.Limits.Disk = "5Ei", "4Ei" }, "limits.disk"},
		{"memory + disk just within 8 EiB", func(s *v1alpha1.SandboxSpec) { s.Limits.Memory, s.Limits.Disk = "4Ei", "3Ei" }, ""},
		{"zero processes", func(s *v1alpha1.SandboxSpec) { s.Limits.MaxProcesses = i64(0) }, "limits.maxProcesses"},
		{"idle beyond the lifetime", func(s *v1alpha1.SandboxSpec) {
			s.Session = spec.Session{MaxLifetimeSeconds: i64(60), IdleTimeoutSeconds: i64(61)}
		}, "session.idleTimeoutSeconds"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sb := sbx("box", tc.mut)
			_, acceptErr := Accept(sb)

			st := &spec.Stack{APIVersion: spec.APIVersion, Sandboxes: []spec.Sandbox{sb.Declaration()}}
			if h := sb.Spec.HostedBy; h != "" {
				// A stack names the workload, so that plan judges hostedBy itself rather than the
				// reference (the operator has no stack).
				st.Workloads = []spec.Workload{{ID: h, Hosts: []string{sb.Name}}}
			}
			res := plan.Check(st, capability.Kubernetes, set)

			if tc.field == "" {
				if acceptErr != nil || res.Refused() {
					t.Fatalf("want both to accept: operator %v; plan %v", acceptErr, res.Err())
				}
				return
			}
			if acceptErr == nil || !res.Refused() {
				t.Fatalf("want both to refuse %s: operator %v; plan %v", tc.field, acceptErr, res.Err())
			}
			if !strings.Contains(acceptErr.Error(), "spec."+tc.field) {
				t.Errorf("operator refusal does not name spec.%s: %v", tc.field, acceptErr)
			}
			named := false
			for _, r := range res.Refusals {
				named = named || strings.HasPrefix(r.Field, "sandboxes[0]."+tc.field)
			}
			if !named {
				t.Errorf("plan refusals do not name %s: %v", tc.field, res.Err())
			}
		})
	}
}
