//go:build !linux

package platform

import (
	"context"
)

// openLocal refuses: the local runtime is Linux namespaces and cgroups, and this binary was
// built for another system without it.
func openLocal(context.Context, Config) (Backend, string, error) {
	return nil, "", ErrLocalNeedsLinux()
}
