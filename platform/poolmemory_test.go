package platform

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/runcode/core"
)

// TestPoolMemory: the pool memory comes from the flag, else $AIRLOCK_POOL_MEMORY, else the
// config file's pool.memory, else the default; a bad value is refused naming where it came from.
func TestPoolMemory(t *testing.T) {
	for _, tc := range []struct {
		name    string
		flag    string
		flagSet bool
		env     string // "-" for unset
		file    string // the config file's text
		want    int64
		from    string
		err     string
	}{
		{"default", "", false, "-", "", 256 << 20, "the default", ""},
		{"file", "", false, "-", "pool:\n  memory: 1Gi\n", 1 << 30, "pool.memory in ", ""},
		{"file without pool", "", false, "-", "platform: local\n", 256 << 20, "the default", ""},
		{"env over file", "", false, "64Mi", "pool:\n  memory: 1Gi\n", 64 << 20, "$AIRLOCK_POOL_MEMORY", ""},
		{"flag over env", "0", true, "64Mi", "pool:\n  memory: 1Gi\n", 0, "--pool-memory", ""},
		{"bad file", "", false, "-", "pool:\n  memory: lots\n", 0, "", `config.yaml: invalid: pool memory "lots"`},
		{"bad env", "", false, "-1", "", 0, "", "$AIRLOCK_POOL_MEMORY: invalid"},
		{"bad flag", "1.5Gi", true, "-", "", 0, "", "--pool-memory: invalid"},
		{"flag hides a bad env", "2Mi", true, "lots", "", 2 << 20, "--pool-memory", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(core.EnvPoolMemory, tc.env)
			if tc.env == "-" {
				os.Unsetenv(core.EnvPoolMemory)
			}
			// A config file of the test's own (empty: one that sets nothing), never the host's.
			path := filepath.Join(t.TempDir(), "config.yaml")
			if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
				t.Fatal(err)
			}
			t.Setenv(EnvConfig, path)
			got, from, err := PoolMemory(tc.flag, tc.flagSet)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want || !strings.HasPrefix(from, tc.from) {
				t.Errorf("= %d from %q, %v; want %d from %q", got, from, err, tc.want, tc.from)
			}
		})
	}
}
