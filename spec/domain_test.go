package spec

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

func TestValidateDomain(t *testing.T) {
	label63 := strings.Repeat("a", 63)
	name253 := strings.Join([]string{label63, label63, label63, strings.Repeat("b", 61)}, ".")
	cases := map[string]string{ // pattern → rule ("" valid)
		"example.com":                   "",
		"API.Example.COM":               "",
		"example.com.":                  "",
		"localhost":                     "",
		"a-b.c0.io":                     "",
		"xn--bcher-kva.example":         "",
		"*.example.com":                 "",
		"*.a.b.example.com":             "",
		label63 + ".com":                "",
		name253:                         "",
		name253 + "b":                   RuleDomainSyntax,
		strings.Repeat("a", 64):         RuleDomainSyntax,
		"":                              RuleDomainSyntax,
		"exa mple.com":                  RuleDomainSyntax,
		"under_score.com":               RuleDomainSyntax,
		"-lead.com":                     RuleDomainSyntax,
		"trail-.com":                    RuleDomainSyntax,
		"a..b":                          RuleDomainSyntax,
		".example.com":                  RuleDomainSyntax,
		"example.com..":                 RuleDomainSyntax,
		"example.com:443":               RuleDomainSyntax,
		"https://example.com":           RuleDomainSyntax,
		"exämple.com":                   RuleDomainSyntax,
		"10.0.0.1":                      RuleDomainIPLiteral,
		"::1":                           RuleDomainIPLiteral,
		"[::1]":                         RuleDomainIPLiteral,
		"[2001:db8::1]":                 RuleDomainIPLiteral,
		"fe80::1%eth0":                  RuleDomainIPLiteral,
		"::ffff:127.0.0.1":              RuleDomainIPLiteral,
		"127.1":                         RuleDomainIPLiteral,
		"2130706433":                    RuleDomainIPLiteral,
		"0x7f000001":                    RuleDomainIPLiteral,
		"0x7f.0x1":                      RuleDomainIPLiteral,
		"1.2.3.4.5":                     RuleDomainIPLiteral,
		"*.10.0.0":                      RuleDomainIPLiteral,
		"*":                             RuleDomainWildcard,
		"*.com":                         RuleDomainWildcard,
		"*.com.":                        RuleDomainWildcard,
		"**.example.com":                RuleDomainWildcard,
		"*example.com":                  RuleDomainWildcard,
		"a.*.example.com":               RuleDomainWildcard,
		"*.*.example.com":               RuleDomainWildcard,
		"example.*":                     RuleDomainWildcard,
		"*.example.com" + "\x00":        RuleDomainSyntax,
		strings.Repeat("a.", 127) + "a": RuleDomainSyntax,
		strings.Repeat("a.", 127):       "",
	}
	for pattern, rule := range cases {
		err := ValidateDomain(pattern)
		if rule == "" {
			if err != nil {
				t.Errorf("ValidateDomain(%q) = %v, want valid", pattern, err)
			}
			continue
		}
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Rule != rule || !errors.Is(err, ErrInvalid) {
			t.Errorf("ValidateDomain(%q) = %v, want rule %s", pattern, err, rule)
		}
		// The message alone (plan prints it) names the value, as every refusal does (issue 25).
		if rule == RuleDomainIPLiteral && fe != nil && !strings.Contains(fe.Message, strconv.Quote(pattern)) {
			t.Errorf("ValidateDomain(%q) message %q does not name the value", pattern, fe.Message)
		}
	}
}

func TestMatchDomain(t *testing.T) {
	cases := []struct {
		pattern, host string
		want          bool
	}{
		{"api.example.com", "api.example.com", true},
		{"api.example.com", "API.Example.Com", true},
		{"API.example.com", "api.example.com", true},
		{"api.example.com.", "api.example.com", true},
		{"api.example.com", "api.example.com.", true},
		{"api.example.com", "example.com", false},
		{"api.example.com", "x.api.example.com", false},
		{"api.example.com", "api.example.com.evil.org", false},
		{"example.com", "evil-example.com", false},
		{"*.example.com", "a.example.com", true},
		{"*.example.com", "a.b.example.com", true},
		{"*.example.com", "A.EXAMPLE.COM.", true},
		{"*.example.com", "example.com", false},
		{"*.example.com", "evil-example.com", false},
		{"*.example.com", "a.evil-example.com", false},
		{"*.example.com", "example.com.evil.org", false},
		{"*.example.com", ".example.com", false},
		{"*.example.com", "a..example.com", false},
		{"*.example.com", "*.example.com", false},
		{"*.example.com", "", false},
		{"*.com", "example.com", false},           // invalid pattern never matches
		{"10.0.0.1", "10.0.0.1", false},           // IP patterns are refused
		{"example.com", "example.com:443", false}, // host must be a bare name
		{"", "", false},
		{"a_b.com", "a_b.com", false},
	}
	for _, tc := range cases {
		if got := MatchDomain(tc.pattern, tc.host); got != tc.want {
			t.Errorf("MatchDomain(%q, %q) = %v, want %v", tc.pattern, tc.host, got, tc.want)
		}
	}
}
