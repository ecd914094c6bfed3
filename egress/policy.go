// Package egress enforces a sandbox's outbound network policy: deny, public-only, or a hostname allowlist.
package egress

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// Policy is what a sandbox may reach. It mirrors spec.Egress.
type Policy struct {
	Mode spec.EgressMode
	// Domains are exact names ("api.example.com") or wildcards ("*.example.com"); only
	// valid with spec.EgressAllowDomains.
	Domains []string
}

// PolicyFromSpec converts a declaration's egress block; the empty mode means deny.
func PolicyFromSpec(e spec.Egress) Policy {
	m := e.Mode
	if m == "" {
		m = spec.EgressDeny
	}
	return Policy{Mode: m, Domains: append([]string(nil), e.Domains...)}
}

// Validate reports the first problem with p, naming the field, the value and what is allowed.
func (p Policy) Validate() error {
	switch p.Mode {
	case spec.EgressDeny, spec.EgressAllow:
		if len(p.Domains) > 0 {
			return fmt.Errorf("%w: egress.domains is only valid with mode %q, got mode %q", sandbox.ErrInvalid, spec.EgressAllowDomains, p.Mode)
		}
	case spec.EgressAllowDomains:
		if len(p.Domains) == 0 {
			return fmt.Errorf("%w: egress.domains must name at least one domain with mode %q", sandbox.ErrInvalid, spec.EgressAllowDomains)
		}
		for i, d := range p.Domains {
			if err := validatePattern(d); err != nil {
				return fmt.Errorf("%w: egress.domains[%d] %q: %v", sandbox.ErrInvalid, i, d, err)
			}
		}
	default:
		return fmt.Errorf("%w: egress.mode %q: allowed are %q, %q, %q", sandbox.ErrInvalid, p.Mode, spec.EgressDeny, spec.EgressAllow, spec.EgressAllowDomains)
	}
	return nil
}

// validatePattern accepts "name" or "*.name" where name is a lower-case ASCII host name;
// a wildcard needs at least two labels after "*." so that "*.com" cannot be written.
func validatePattern(d string) error {
	if d != strings.ToLower(d) {
		return fmt.Errorf("must be lower case")
	}
	base, wild := strings.CutPrefix(d, "*.")
	if strings.Contains(base, "*") {
		return fmt.Errorf(`a wildcard is only allowed as a leading "*." label`)
	}
	if _, err := netip.ParseAddr(base); err == nil {
		return fmt.Errorf("IP addresses are not allowed; use mode %q for public addresses", spec.EgressAllow)
	}
	if err := checkHostname(base); err != nil {
		return err
	}
	if wild && !strings.Contains(base, ".") {
		return fmt.Errorf(`a wildcard must cover at least two labels (like "*.example.com")`)
	}
	return nil
}

// checkHostname accepts LDH host names (RFC 1123, A-labels for IDNs), without a trailing dot.
func checkHostname(s string) error {
	if s == "" {
		return fmt.Errorf("empty name")
	}
	if len(s) > 253 {
		return fmt.Errorf("longer than 253 characters")
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("each label must be 1 to 63 characters")
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("a label may not start or end with '-'")
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("only letters, digits, '-' and '_' are allowed in a label, got %q", c)
			}
		}
	}
	return nil
}

// normalizeName lower-cases a name from the wire and drops one trailing dot; it returns
// "" when the result is not a host name.
func normalizeName(s string) string {
	s = strings.ToLower(strings.TrimSuffix(s, "."))
	if checkHostname(s) != nil {
		return ""
	}
	return s
}

// MatchDomain reports whether host matches pattern. "*.example.com" matches any name below
// example.com at any depth but not example.com itself, and never "evil-example.com". Both are
// compared case-insensitively, ignoring one trailing dot on host.
// (spec/ had no MatchDomain when this was written; if it gains one, this should delegate.)
func MatchDomain(pattern, host string) bool {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	pattern = strings.ToLower(pattern)
	if host == "" || pattern == "" {
		return false
	}
	if base, ok := strings.CutPrefix(pattern, "*."); ok {
		return strings.HasSuffix(host, "."+base) && len(host) > len(base)+1
	}
	return host == pattern
}

// allows reports whether the compiled policy permits name (already normalized).
func (p Policy) allows(name string) bool {
	switch p.Mode {
	case spec.EgressAllow:
		return true
	case spec.EgressAllowDomains:
		for _, d := range p.Domains {
			if MatchDomain(d, name) {
				return true
			}
		}
	}
	return false
}
