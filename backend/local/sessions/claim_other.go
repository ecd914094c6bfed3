//go:build !linux

package sessions

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

// Claim finds nothing parked: parked sandboxes are the local runtime's, which needs Linux, so
// none can exist on this host and the caller runs the code another way.
func Claim(ctx context.Context, stateDir, key string, minLeft time.Duration) (c *Claimed, discarded []string, err error) {
	return nil, nil, nil
}

// Kill refuses: Claim makes no Claimed off Linux.
func (c *Claimed) Kill(ctx context.Context) error { return errNotLinux() }

// Close refuses: Claim makes no Claimed off Linux.
func (c *Claimed) Close() error { return errNotLinux() }

func errNotLinux() error {
	return fmt.Errorf("%w: parked sandboxes are the local runtime's, which needs Linux; this host runs %s", sbtypes.ErrUnsupported, runtime.GOOS)
}
