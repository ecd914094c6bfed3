//go:build !unix

package gcp

import (
	"fmt"
	"os"
	"runtime"

	"github.com/airlock-sandbox/airlock/sandbox"
)

// socketpair refuses: the bridge to a sandbox's agent is a unix socket pair handed to the
// launcher as its stdin and stdout, which this system has not.
func socketpair() (ours, theirs *os.File, err error) {
	return nil, nil, fmt.Errorf("%w: the gcp backend reaches a sandbox's agent through a unix socket pair, which %s has not; run airlock on Linux or macOS", sandbox.ErrUnsupported, runtime.GOOS)
}
