package runcli

import (
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/runcode/core"
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

// TestCheckPoolMemory: a run refuses a pool memory its filler could not read, naming the flag
// or the variable, rather than leaving the filler to fail where nobody sees it; the flag, when
// given, is what counts.
func TestCheckPoolMemory(t *testing.T) {
	for _, tc := range []struct {
		flag string
		env  string
		want string // "" for accepted
	}{
		{"", "256Mi", ""},
		{"", "0", ""},
		{"", "lots", "$AIRLOCK_POOL_MEMORY: invalid: pool memory \"lots\""},
		{"", "-1", "allowed is a whole number of bytes"},
		{"1Gi", "", ""},
		{"lots", "", "--pool-memory: invalid: pool memory \"lots\""},
		{"1.5Gi", "256Mi", "--pool-memory: invalid"},
		{"64Mi", "lots", ""}, // the flag wins; the variable is not read
	} {
		t.Setenv(core.EnvPoolMemory, tc.env)
		f := Flags{MaxOutput: 1, Pool: 1, PoolMemory: tc.flag}
		err := f.Check(false)
		if tc.want == "" {
			if err != nil {
				t.Errorf("flag %q, env %q: %v", tc.flag, tc.env, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("flag %q, env %q: %v, want an error naming %q", tc.flag, tc.env, err, tc.want)
		}
	}
}
