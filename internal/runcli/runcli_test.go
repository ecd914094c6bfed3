package runcli

import (
	"testing"
)

// TestRootFlags: the root's -o/--output is read in every spelling cobra takes, and the first
// other argument is found after it; a last -o without its value is not ok.
func TestRootFlags(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		output string
		at     int
		ok     bool
	}{
		{[]string{"run", "-c", "1"}, "", 0, true},
		{[]string{"-o", "json", "run"}, "json", 2, true},
		{[]string{"--output", "json", "run"}, "json", 2, true},
		{[]string{"--output=json", "run"}, "json", 1, true},
		{[]string{"-ojson", "run"}, "json", 1, true},
		{[]string{"-o=json", "run"}, "json", 1, true},
		{[]string{"-o", "json", "-o", "text", "sandbox", "list"}, "text", 4, true},
		{[]string{"-o", "json"}, "json", 2, true},
		{[]string{"--help"}, "", 0, true},
		{[]string{"-o"}, "", 0, false},
		{[]string{"-o", "json", "--output"}, "json", 2, false},
		{nil, "", 0, true},
	} {
		output, at, ok := RootFlags(tc.args)
		if output != tc.output || at != tc.at || ok != tc.ok {
			t.Errorf("%q: %q %d %v, want %q %d %v", tc.args, output, at, ok, tc.output, tc.at, tc.ok)
		}
	}
}
