package egress

import (
	"errors"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

func TestPolicyValidate(t *testing.T) {
	good := []Policy{
		{Mode: spec.EgressDeny},
		{Mode: spec.EgressAllow},
		{Mode: spec.EgressOpen},
		{Mode: spec.EgressAllowDomains, Domains: []string{"example.com"}},
		{Mode: spec.EgressAllowDomains, Domains: []string{"*.example.com", "api.github.com", "xn--bcher-kva.example"}},
		{Mode: spec.EgressAllowDomains, Domains: []string{"Example.com", "example.org."}}, // spec: case-insensitive, one trailing dot
	}
	for _, p := range good {
		if err := p.Validate(); err != nil {
			t.Errorf("%+v: %v", p, err)
		}
	}
	bad := []struct {
		p    Policy
		want string // must appear in the error: the field and the value
	}{
		{Policy{Mode: ""}, `egress.mode ""`},
		{Policy{Mode: "wide"}, `egress.mode "wide": allowed are "deny", "allow", "allowDomains", "open"`},
		{Policy{Mode: "Open"}, `egress.mode "Open"`},
		{Policy{Mode: spec.EgressOpen, Domains: []string{"a.com"}}, "egress.domains"},
		{Policy{Mode: spec.EgressAllow, Domains: []string{"a.com"}}, "egress.domains"},
		{Policy{Mode: spec.EgressDeny, Domains: []string{"a.com"}}, "egress.domains"},
		{Policy{Mode: spec.EgressAllowDomains}, "egress.domains"},
		{Policy{Mode: spec.EgressAllowDomains, Domains: []string{"*"}}, `egress.domains[0] "*"`},
		{Policy{Mode: spec.EgressAllowDomains, Domains: []string{"*.com"}}, `"*.com"`},
		{Policy{Mode: spec.EgressAllowDomains, Domains: []string{"a.*.com"}}, `"a.*.com"`},
		{Policy{Mode: spec.EgressAllowDomains, Domains: []string{"ok.com", "1.2.3.4"}}, `egress.domains[1] "1.2.3.4"`},
		{Policy{Mode: spec.EgressAllowDomains, Domains: []string{"exa mple.com"}}, `"exa mple.com"`},
		{Policy{Mode: spec.EgressAllowDomains, Domains: []string{"127.1"}}, `"127.1"`},
		{Policy{Mode: spec.EgressAllowDomains, Domains: []string{"-a.com"}}, `"-a.com"`},
		{Policy{Mode: spec.EgressAllowDomains, Domains: []string{"bücher.example"}}, `"bücher.example"`},
		{Policy{Mode: spec.EgressAllowDomains, Domains: []string{strings.Repeat("a", 64) + ".com"}}, "63"},
	}
	for _, c := range bad {
		err := c.p.Validate()
		if !errors.Is(err, sandbox.ErrInvalid) {
			t.Errorf("%+v: want ErrInvalid, got %v", c.p, err)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %q does not mention %q", c.p, err, c.want)
		}
	}
}

func TestPolicyAllows(t *testing.T) {
	p := Policy{Mode: spec.EgressAllowDomains, Domains: []string{"*.example.com", "api.other.org"}}
	for name, want := range map[string]bool{
		"a.example.com": true, "a.b.example.com": true, "example.com": false, "evil-example.com": false,
		"aexample.com": false, "example.com.evil.org": false,
		"api.other.org": true, "x.api.other.org": false, "other.org": false,
	} {
		if got := p.allows(name); got != want {
			t.Errorf("allows(%q) = %v, want %v", name, got, want)
		}
	}
	if !(Policy{Mode: spec.EgressAllow}).allows("anything.test") {
		t.Error("allow mode must allow any name")
	}
	if !(Policy{Mode: spec.EgressOpen}).allows("anything.test") {
		t.Error("open mode must allow any name")
	}
	if (Policy{Mode: spec.EgressDeny}).allows("a.example.com") {
		t.Error("deny must allow nothing")
	}
}

func TestPolicyFromSpec(t *testing.T) {
	if p := PolicyFromSpec(spec.Egress{}); p.Mode != spec.EgressDeny {
		t.Fatalf("empty mode must mean deny, got %q", p.Mode)
	}
	p := PolicyFromSpec(spec.Egress{Mode: spec.EgressAllowDomains, Domains: []string{"a.com"}})
	if p.Mode != spec.EgressAllowDomains || len(p.Domains) != 1 || p.Domains[0] != "a.com" {
		t.Fatalf("got %+v", p)
	}
}
