package docker

import (
	"os"

	"github.com/airlock-sandbox/airlock/capability"
)

// Published is the set this backend publishes without an engine at hand (plan and
// 'airlock capabilities --platform docker' on a machine without one): what an engine on this
// host is given (whether the host has a v1 freezer is read here). A running backend's
// Capabilities is the truth for its host.
func Published() capability.Set {
	asUser := os.Geteuid() != 0
	return capabilities(!asUser && freezerV1(), asUser)
}

// Capable is the set of a backend run by root on a host with a v1 freezer: the most this
// backend holds anywhere (docs/capabilities.md shows it). A host or user takes away what
// capabilities says (backgroundProcesses, diskLimit), naming why.
func Capable() capability.Set { return capabilities(true, false) }
