package operator

import (
	"errors"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlock-sandbox/airlock/operator/api/v1alpha1"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

func sbx(name string, mut func(*v1alpha1.SandboxSpec)) *v1alpha1.Sandbox {
	s := &v1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: "uid-" + "1"},
		Spec: v1alpha1.SandboxSpec{
			Sandbox:  spec.Sandbox{Image: spec.Image{Ref: "example.org/py:3"}, Limits: spec.Limits{CPU: "500m", Memory: "256Mi", Disk: "128Mi"}},
			PoolSize: 2,
		},
	}
	if mut != nil {
		mut(&s.Spec)
	}
	return s
}

func i64(v int64) *int64 { return &v }

func TestAccept(t *testing.T) {
	tests := []struct {
		name   string
		mut    func(*v1alpha1.SandboxSpec)
		reason string // "" = accepted
		class  error
		field  string // must appear in the message
	}{
		{"minimal", nil, "", nil, ""},
		{"id equal to the name", func(s *v1alpha1.SandboxSpec) { s.ID = "box" }, "", nil, ""},
		{"gvisor (RLIMIT_NPROC not enforced by the sentry)", func(s *v1alpha1.SandboxSpec) { s.Runtime = spec.RuntimeGVisor }, v1alpha1.ReasonUnsupported, sandbox.ErrRefused, "spec.runtime gvisor"},
		{"public-only egress", func(s *v1alpha1.SandboxSpec) { s.Egress.Mode = spec.EgressAllow }, "", nil, ""},
		{"open egress", func(s *v1alpha1.SandboxSpec) { s.Egress.Mode = spec.EgressOpen }, "", nil, ""},
		{"open egress with domains", func(s *v1alpha1.SandboxSpec) {
			s.Egress = spec.Egress{Mode: spec.EgressOpen, Domains: []string{"example.org"}}
		}, v1alpha1.ReasonInvalidDeclaration, sandbox.ErrInvalid, "egress.domains"},
		{"id differs from the name", func(s *v1alpha1.SandboxSpec) { s.ID = "other" }, v1alpha1.ReasonInvalidDeclaration, sandbox.ErrInvalid, "spec.id"},
		{"negative pool", func(s *v1alpha1.SandboxSpec) { s.PoolSize = -1 }, v1alpha1.ReasonInvalidDeclaration, sandbox.ErrInvalid, "spec.poolSize"},
		{"huge pool", func(s *v1alpha1.SandboxSpec) { s.PoolSize = MaxPoolSize + 1 }, v1alpha1.ReasonInvalidDeclaration, sandbox.ErrInvalid, "spec.poolSize"},
		{"bad memory", func(s *v1alpha1.SandboxSpec) { s.Limits.Memory = "lots" }, v1alpha1.ReasonInvalidDeclaration, sandbox.ErrInvalid, "memory"},
		{"label that opens agents", func(s *v1alpha1.SandboxSpec) { s.Labels = map[string]string{"airlock.dev/client": "true"} }, v1alpha1.ReasonInvalidDeclaration, sandbox.ErrRefused, "spec.labels"},
		{"label that fakes a state", func(s *v1alpha1.SandboxSpec) { s.Labels = map[string]string{"airlock.dev/state": "idle"} }, v1alpha1.ReasonInvalidDeclaration, sandbox.ErrRefused, "spec.labels"},
		{"managed-by label", func(s *v1alpha1.SandboxSpec) { s.Labels = map[string]string{"app.kubernetes.io/managed-by": "me"} }, v1alpha1.ReasonInvalidDeclaration, sandbox.ErrRefused, RuleReservedLabel},
		{"hostedBy", func(s *v1alpha1.SandboxSpec) { s.HostedBy = "web" }, v1alpha1.ReasonUnsupported, sandbox.ErrRefused, RuleHostedBy},
		{"ordinary label", func(s *v1alpha1.SandboxSpec) { s.Labels = map[string]string{"team": "a"} }, "", nil, ""},
		{"host image", func(s *v1alpha1.SandboxSpec) { s.Image = spec.Image{Host: true} }, v1alpha1.ReasonUnsupported, sandbox.ErrRefused, "spec.image"},
		{"dir image", func(s *v1alpha1.SandboxSpec) { s.Image = spec.Image{Dir: "/srv/root"} }, v1alpha1.ReasonUnsupported, sandbox.ErrRefused, "spec.image"},
		{"docker runtime", func(s *v1alpha1.SandboxSpec) { s.Runtime = spec.RuntimeDocker }, v1alpha1.ReasonUnsupported, sandbox.ErrRefused, "spec.runtime"},
		{"domain allowlist", func(s *v1alpha1.SandboxSpec) {
			s.Egress = spec.Egress{Mode: spec.EgressAllowDomains, Domains: []string{"example.org", "*.pypi.org"}}
		}, "", nil, ""},
		{"domain allowlist, a bad name", func(s *v1alpha1.SandboxSpec) {
			s.Egress = spec.Egress{Mode: spec.EgressAllowDomains, Domains: []string{"exa mple.org"}}
		}, v1alpha1.ReasonInvalidDeclaration, sandbox.ErrInvalid, "domains"},
		{"preview ports", func(s *v1alpha1.SandboxSpec) { s.PreviewPorts = []int{8080} }, v1alpha1.ReasonUnsupported, sandbox.ErrRefused, "spec.previewPorts"},
		{"declared process limit", func(s *v1alpha1.SandboxSpec) { s.Limits.MaxProcesses = i64(64) }, "", nil, ""},
		{"declared idle timeout", func(s *v1alpha1.SandboxSpec) { s.Session.IdleTimeoutSeconds = i64(60) }, "", nil, ""},
		{"zero process limit", func(s *v1alpha1.SandboxSpec) { s.Limits.MaxProcesses = i64(0) }, v1alpha1.ReasonInvalidDeclaration, sandbox.ErrInvalid, "maxProcesses"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Accept(sbx("box", tc.mut))
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("Accept: %v", err)
				}
				if d.ID != "box" || d.Workdir == "" || d.Session.MaxLifetimeSeconds == nil {
					t.Errorf("declaration not defaulted with the name as id: %+v", d)
				}
				return
			}
			var re *RefusalError
			if !errors.As(err, &re) || re.Reason != tc.reason || !errors.Is(err, tc.class) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("Accept: %v, want reason %s, class %v, naming %q", err, tc.reason, tc.class, tc.field)
			}
		})
	}
}
