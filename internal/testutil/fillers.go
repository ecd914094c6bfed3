package testutil

import (
	"os"
	"path/filepath"
	"strings"
)

// PoolFillers lists the pids of the running `airlock __pool-fill` processes (the filler a
// run starts, docs/pool.md#parked-sandboxes-airlock-run) working on stateDir.
func PoolFillers(stateDir string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) > 2 && args[1] == "__pool-fill" && strings.Contains(string(b), "\x00"+stateDir+"\x00") {
			out = append(out, e.Name())
		}
	}
	return out
}
