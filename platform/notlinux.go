package platform

import (
	"fmt"
	"runtime"
	"strings"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// ErrLocalNeedsLinux is the refusal, off Linux, of everything only the local runtime does: it
// names this host's system and the platforms that run here.
func ErrLocalNeedsLinux() error {
	var others []string
	for _, p := range capability.Platforms {
		if p != capability.Local {
			others = append(others, string(p))
		}
	}
	return fmt.Errorf("%w: the local runtime needs Linux and this host runs %s; use --platform %s", sandbox.ErrUnsupported, runtime.GOOS, strings.Join(others, "|"))
}
