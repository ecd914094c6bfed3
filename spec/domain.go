package spec

import (
	"fmt"
	"net/netip"
	"strings"
)

const maxDomainLength = 253

// ValidateDomain checks an egress domain pattern: a DNS name of letters, digits and hyphens
// (labels 1–63 characters, at most 253 in all, case-insensitive, one trailing dot allowed) or a
// wildcard "*.<name>" with at least two labels after the "*.". IP literals, and names that a
// resolver would read as a numeric address ("127.1", "0x7f000001"), are refused.
func ValidateDomain(pattern string) error {
	if rule, msg := domainProblem(pattern); rule != "" {
		return &FieldError{Path: "domain", Value: pattern, Rule: rule, Message: msg}
	}
	return nil
}

// domainProblem returns the rule and message of the first problem of pattern, or "" if none.
func domainProblem(pattern string) (rule, msg string) {
	if pattern == "" {
		return RuleDomainSyntax, "empty domain; write a name such as \"api.example.com\" or \"*.example.com\""
	}
	if isIPLiteral(pattern) {
		return RuleDomainIPLiteral, fmt.Sprintf("%q is an IP address, and IP addresses are not allowed; name the host by its DNS name", pattern)
	}
	name := strings.TrimSuffix(strings.ToLower(pattern), ".")
	if strings.Contains(name, "*") {
		rest, ok := strings.CutPrefix(name, "*.")
		if !ok || strings.Contains(rest, "*") {
			return RuleDomainWildcard, "a wildcard is allowed only as a leading \"*.\", as in \"*.example.com\""
		}
		if strings.Count(rest, ".") < 1 {
			return RuleDomainWildcard, "a wildcard needs at least two labels after \"*.\", as in \"*.example.com\" (not \"*.com\")"
		}
		name = rest
	}
	if len(name) > maxDomainLength {
		return RuleDomainSyntax, fmt.Sprintf("a domain is at most %d characters", maxDomainLength)
	}
	labels := strings.Split(name, ".")
	for _, l := range labels {
		if m := labelProblem(l); m != "" {
			return RuleDomainSyntax, m
		}
	}
	if numericLabel(labels[len(labels)-1]) {
		return RuleDomainIPLiteral, fmt.Sprintf("the last label of %q is numeric, so resolvers read it as an IP address; name the host by its DNS name", pattern)
	}
	return "", ""
}

func labelProblem(l string) string {
	if l == "" {
		return "empty label (two dots in a row, or a leading dot); labels are 1 to 63 characters"
	}
	if len(l) > 63 {
		return "a label is at most 63 characters"
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Sprintf("character %q is not allowed; a domain holds letters, digits, hyphens and dots", rune(c))
		}
	}
	if l[0] == '-' || l[len(l)-1] == '-' {
		return "a label may not start or end with a hyphen"
	}
	return ""
}

func isIPLiteral(s string) bool {
	if inner, ok := strings.CutPrefix(s, "["); ok {
		s = strings.TrimSuffix(inner, "]")
	}
	_, err := netip.ParseAddr(s)
	return err == nil
}

// numericLabel reports whether an inet_aton-style parser would take the label as a number:
// decimal, octal or 0x hexadecimal.
func numericLabel(l string) bool {
	if hex, ok := strings.CutPrefix(l, "0x"); ok {
		l = hex
		if l == "" {
			return true
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return false
			}
		}
		return true
	}
	for i := 0; i < len(l); i++ {
		if l[i] < '0' || l[i] > '9' {
			return false
		}
	}
	return true
}

// MatchDomain reports whether host is allowed by pattern. An exact pattern matches the same name,
// case-insensitively and ignoring one trailing dot on either side. "*.example.com" matches names
// one or more labels below example.com, but neither example.com itself nor "evil-example.com".
// An invalid pattern or host never matches.
func MatchDomain(pattern, host string) bool {
	if rule, _ := domainProblem(pattern); rule != "" {
		return false
	}
	if strings.Contains(host, "*") {
		return false
	}
	if rule, _ := domainProblem(host); rule != "" {
		return false
	}
	p := strings.TrimSuffix(strings.ToLower(pattern), ".")
	h := strings.TrimSuffix(strings.ToLower(host), ".")
	if suffix, ok := strings.CutPrefix(p, "*"); ok {
		// suffix is ".example.com"; host must have at least one full label before it.
		return len(h) > len(suffix) && strings.HasSuffix(h, suffix)
	}
	return h == p
}
