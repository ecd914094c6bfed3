package spec

import (
	"regexp"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

// TestGrammarsMatchPatterns: the hand-written checks accept exactly what the published
// patterns (IDPattern, EnvNamePattern: the JSON Schema's) accept.
func TestGrammarsMatchPatterns(t *testing.T) {
	tests := []struct {
		name    string
		pattern string
		check   func(string) bool
	}{
		{"id", IDPattern, IsValidID},
		{"env name", EnvNamePattern, sbtypes.IsEnvName},
	}
	inputs := []string{"", "a", "A", "0", "_", "-", "a-b_C9", "9abc", "_x", "-x", "x-", "a b", "a.b", "a/b",
		"é", "a\n", "\na", "a\x00", "ZZ", "z", "`", "@", "[", "{", ":", "/",
		strings.Repeat("a", 63), strings.Repeat("a", 64), strings.Repeat("a", 65), strings.Repeat("-", 64)}
	// Every single byte, and each after a valid first character.
	for c := 0; c < 256; c++ {
		inputs = append(inputs, string([]byte{byte(c)}), "a"+string([]byte{byte(c)}))
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			re := regexp.MustCompile(tt.pattern)
			for _, in := range inputs {
				if got, want := tt.check(in), re.MatchString(in); got != want {
					t.Errorf("%q: %v, the pattern %s says %v", in, got, tt.pattern, want)
				}
			}
		})
	}
}

func FuzzIsValidID(f *testing.F) {
	re := regexp.MustCompile(IDPattern)
	env := regexp.MustCompile(EnvNamePattern)
	for _, s := range []string{"", "a", "a-b", strings.Repeat("x", 64), "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if IsValidID(s) != re.MatchString(s) {
			t.Errorf("IsValidID(%q) = %v, pattern says %v", s, IsValidID(s), re.MatchString(s))
		}
		if sbtypes.IsEnvName(s) != env.MatchString(s) {
			t.Errorf("isEnvName(%q) = %v, pattern says %v", s, sbtypes.IsEnvName(s), env.MatchString(s))
		}
	})
}
