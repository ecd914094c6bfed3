package sbtypes

import (
	"regexp"
	"testing"
)

// TestEnvNameGrammar: IsEnvName accepts exactly what EnvNamePattern matches.
func TestEnvNameGrammar(t *testing.T) {
	re := regexp.MustCompile(EnvNamePattern)
	cases := []string{"", "A", "a", "_", "0", "A0", "0A", "_9", "PATH", "LC_ALL", "a-b", "a b", "a=b", "é", "A\x00", "ÄB", "\xff", "AB.", "Z_z9"}
	alphabet := "aZ_09-=. \x00\xc3"
	for _, a := range alphabet {
		for _, b := range alphabet {
			cases = append(cases, string(a), string(a)+string(b))
		}
	}
	for _, s := range cases {
		if got, want := IsEnvName(s), re.MatchString(s); got != want {
			t.Errorf("IsEnvName(%q) = %v, the pattern says %v", s, got, want)
		}
	}
}
