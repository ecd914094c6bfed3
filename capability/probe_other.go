//go:build !linux

package capability

import (
	"os"
	"runtime"
)

// ProbeHost reports a non-Linux host, on which the local runtime makes no sandbox.
func ProbeHost() HostProbe {
	uid := os.Geteuid()
	return HostProbe{OS: runtime.GOOS, UID: uid, Root: uid == 0, UserNS: UserNSFacts{Max: -1}}
}
