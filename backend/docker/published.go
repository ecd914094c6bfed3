package docker

import "github.com/airlock-sandbox/airlock/capability"

// Published is the set this backend publishes without an engine at hand (plan and
// 'airlock capabilities --platform docker' on a machine without one): what an engine on this
// host is given (whether the host has a v1 freezer is read here). A running backend's
// Capabilities is the truth for its host.
func Published() capability.Set { return capabilities(freezerV1()) }
