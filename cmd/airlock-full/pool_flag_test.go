package main

import (
	"strings"
	"testing"
)

// TestPoolFlagRenamed: the warm-sandbox count is --pool (and $AIRLOCK_POOL) on every command;
// the old names are refused naming the new one, never ignored.
func TestPoolFlagRenamed(t *testing.T) {
	for _, tt := range []struct {
		name string
		env  string // AIRLOCK_SPARES's value, "" for unset
		args []string
		want string
	}{
		{"run flag", "", []string{"run", "--spares", "1", "-c", "1"}, "--spares is now --pool"},
		{"run env", "1", []string{"run", "-c", "1"}, "$AIRLOCK_SPARES is now $AIRLOCK_POOL"},
		{"run env with --pool", "1", []string{"run", "--pool", "0", "-c", "1"}, "$AIRLOCK_SPARES is now $AIRLOCK_POOL"},
		{"run pool out of range", "", []string{"run", "--pool", "9", "-c", "1"}, "--pool 9 must be 0 (none) to 8"},
		{"gc flag", "", []string{"gc", "--spares", "--dry-run"}, "--spares is now --pool"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.env != "" {
				t.Setenv("AIRLOCK_SPARES", tt.env)
			}
			code, out, errs := cliIn(t, "", tt.args...)
			if code != 2 || out != "" || !strings.Contains(errs, tt.want) {
				t.Errorf("airlock %s: exit %d, stdout %q, stderr %q; want exit 2 naming %q", strings.Join(tt.args, " "), code, out, errs, tt.want)
			}
		})
	}
}
