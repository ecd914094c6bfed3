package docker

import "github.com/airlock-sandbox/airlock/capability"

// Published is the set this backend publishes without an engine at hand (plan and
// 'airlock capabilities --platform docker' on a machine without one): what every engine is
// given. A running backend's Capabilities is the truth for its host.
func Published() capability.Set { return capabilities() }
