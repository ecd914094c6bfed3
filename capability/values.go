package capability

// Property is a declaration field that has a default (spec.ApplyDefaults), named by its path in
// a sandbox: "limits.cpu", "session.idleTimeoutSeconds".
type Property string

// The defaulted properties, in declaration order. The runtime is left out: its default,
// native, is each platform's own boundary, so there is nothing for a platform to replace.
const (
	PropCPU          Property = "limits.cpu"
	PropMemory       Property = "limits.memory"
	PropDisk         Property = "limits.disk"
	PropMaxProcesses Property = "limits.maxProcesses"
	PropEgressMode   Property = "egress.mode"
	PropLifetime     Property = "session.maxLifetimeSeconds"
	PropIdleTimeout  Property = "session.idleTimeoutSeconds"
	PropReconnect    Property = "session.reconnect"
	PropWorkdir      Property = "workdir"
)

// Properties lists every defaulted property in the order plan reports them.
var Properties = []Property{
	PropCPU, PropMemory, PropDisk, PropMaxProcesses, PropEgressMode,
	PropLifetime, PropIdleTimeout, PropReconnect, PropWorkdir,
}

// Replaceable reports whether a platform may publish its own value for p: every defaulted
// property but the egress mode, whose default (deny) is a promise about what the code can reach
// and is never traded for a platform's open network.
func (p Property) Replaceable() bool { return p != PropEgressMode }
