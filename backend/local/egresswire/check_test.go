package egresswire

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

func TestCheckEgress(t *testing.T) {
	lacks := fmt.Errorf("%w: egress: veth pairs: operation not supported", sandbox.ErrUnsupported)
	for _, tc := range []struct {
		name     string
		e        spec.Egress
		gvisor   bool
		lacking  error           // what the capability check answers
		want     error           // class of Check's error
		wantName capability.Name // the capability asked for ("" none)
	}{
		{"deny", spec.Egress{}, false, lacks, nil, ""},
		{"deny under gvisor", spec.Egress{Mode: spec.EgressDeny}, true, lacks, nil, ""},
		{"allow under gvisor", spec.Egress{Mode: spec.EgressAllow}, true, nil, sandbox.ErrUnsupported, ""},
		{"unknown mode", spec.Egress{Mode: "wide"}, false, nil, sandbox.ErrInvalid, ""},
		{"domains with allow", spec.Egress{Mode: spec.EgressAllow, Domains: []string{"a.example.com"}}, false, nil, sandbox.ErrInvalid, ""},
		{"allowDomains without domains", spec.Egress{Mode: spec.EgressAllowDomains}, false, nil, sandbox.ErrInvalid, ""},
		{"bad domain", spec.Egress{Mode: spec.EgressAllowDomains, Domains: []string{"*"}}, false, nil, sandbox.ErrInvalid, ""},
		{"allow, enforceable", spec.Egress{Mode: spec.EgressAllow}, false, nil, nil, capability.PublicOnlyEgress},
		{"allow, not enforceable", spec.Egress{Mode: spec.EgressAllow}, false, lacks, sandbox.ErrUnsupported, capability.PublicOnlyEgress},
		{"open under gvisor", spec.Egress{Mode: spec.EgressOpen}, true, nil, sandbox.ErrUnsupported, ""},
		{"domains with open", spec.Egress{Mode: spec.EgressOpen, Domains: []string{"a.example.com"}}, false, nil, sandbox.ErrInvalid, ""},
		{"open, enforceable", spec.Egress{Mode: spec.EgressOpen}, false, nil, nil, capability.PublicOnlyEgress},
		{"open, no gateway", spec.Egress{Mode: spec.EgressOpen}, false, lacks, sandbox.ErrUnsupported, capability.PublicOnlyEgress},
		{"allowDomains, not enforceable", spec.Egress{Mode: spec.EgressAllowDomains, Domains: []string{"a.example.com"}}, false, lacks, sandbox.ErrUnsupported, capability.DomainEgressRules},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var asked capability.Name
			err := Check(tc.e, tc.gvisor, func(n capability.Name) error { asked = n; return tc.lacking })
			if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Errorf("Check: %v, want %v", err, tc.want)
			}
			if asked != tc.wantName {
				t.Errorf("asked for capability %q, want %q", asked, tc.wantName)
			}
			if tc.wantName != "" && err != nil && !strings.Contains(err.Error(), string(tc.wantName)) {
				t.Errorf("refusal %q does not name %s", err, tc.wantName)
			}
		})
	}
}

// TestEgressEnforceable: a published set that holds the capability is enough (no probe); one
// that does not, or none yet, leaves the answer, and the reason, to the probe.
func TestEgressEnforceable(t *testing.T) {
	lacks := errors.New("no veth")
	set := func(supported bool) func() capability.Set {
		return func() capability.Set {
			return capability.Set{Entries: map[capability.Name]capability.Status{capability.PublicOnlyEgress: {Supported: supported, Reason: "r"}}}
		}
	}
	for _, tc := range []struct {
		name       string
		published  func() capability.Set
		probe      error
		want       error
		wantProbed bool
	}{
		{"published holds it", set(true), lacks, nil, false},
		{"published lacks it", set(false), lacks, lacks, true},
		{"published lacks it, probe passes", set(false), nil, nil, true},
		{"no published set", nil, lacks, lacks, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			probed := false
			err := Enforceable(tc.published, func() error { probed = true; return tc.probe })(capability.PublicOnlyEgress)
			if !errors.Is(err, tc.want) || (err == nil) != (tc.want == nil) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
			if probed != tc.wantProbed {
				t.Errorf("probed = %v, want %v", probed, tc.wantProbed)
			}
		})
	}
}
