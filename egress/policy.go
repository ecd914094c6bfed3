// Package egress enforces a sandbox's outbound network policy: deny, public-only, a hostname allowlist, or open.
package egress

import (
	"errors"
	"fmt"
	"strconv"
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
	case spec.EgressDeny, spec.EgressAllow, spec.EgressOpen:
		if len(p.Domains) > 0 {
			return fmt.Errorf("%w: egress.domains is only valid with mode %q, got mode %q", sandbox.ErrInvalid, spec.EgressAllowDomains, p.Mode)
		}
	case spec.EgressAllowDomains:
		if len(p.Domains) == 0 {
			return fmt.Errorf("%w: egress.domains must name at least one domain with mode %q", sandbox.ErrInvalid, spec.EgressAllowDomains)
		}
		for i, d := range p.Domains {
			if err := spec.ValidateDomain(d); err != nil {
				var fe *spec.FieldError
				if errors.As(err, &fe) {
					return fmt.Errorf("%w: egress.domains[%d] %q: %s", sandbox.ErrInvalid, i, d, fe.Message)
				}
				return fmt.Errorf("%w: egress.domains[%d] %q: %v", sandbox.ErrInvalid, i, d, err)
			}
		}
	default:
		allowed := make([]string, len(spec.EgressModes))
		for i, m := range spec.EgressModes {
			allowed[i] = strconv.Quote(string(m))
		}
		return fmt.Errorf("%w: egress.mode %q: allowed are %s", sandbox.ErrInvalid, p.Mode, strings.Join(allowed, ", "))
	}
	return nil
}

// checkHostname accepts the host names that can appear on the wire (SNI, Host, DNS question):
// letters, digits, '-' and '_' in labels of 1 to 63, without a trailing dot. Whether a name is
// allowed is spec.MatchDomain's business; this only keeps garbage out of logs and lookups.
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

// allows reports whether the compiled policy permits name (already normalized).
func (p Policy) allows(name string) bool {
	switch p.Mode {
	case spec.EgressAllow, spec.EgressOpen:
		return true
	case spec.EgressAllowDomains:
		for _, d := range p.Domains {
			if spec.MatchDomain(d, name) {
				return true
			}
		}
	}
	return false
}
