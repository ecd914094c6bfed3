//go:build !linux

package platform

import (
	"context"
	"fmt"
	"runtime"
	"strings"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// openLocal refuses: the local runtime is Linux namespaces and cgroups, and this binary was
// built for another system without it.
func openLocal(context.Context, Config) (Backend, string, error) {
	return nil, "", ErrLocalNeedsLinux()
}

// ErrLocalNeedsLinux is the refusal of everything only the local runtime does, naming this
// host's system and the platforms that run here.
func ErrLocalNeedsLinux() error {
	var others []string
	for _, p := range capability.Platforms {
		if p != capability.Local {
			others = append(others, string(p))
		}
	}
	return fmt.Errorf("%w: the local runtime needs Linux and this host runs %s; use --platform %s", sandbox.ErrUnsupported, runtime.GOOS, strings.Join(others, "|"))
}
