package capability

// Set is what one platform publishes: every capability it knows, whether it holds, and why
// not when it does not.
type Set struct {
	Platform Platform        `json:"platform"`
	Entries  map[Name]Status `json:"capabilities"`
	// Bounds are the platform's own numeric limits (e.g. maximum session lifetime).
	Bounds Bounds `json:"bounds"`
	// PlatformValues is what a property left undeclared becomes on this platform when the
	// platform cannot hold airlock's default for it: the platform's own value, in words
	// ("platform-sized (aws tier 2048 MiB: up to 4 vCPU)"). plan takes it instead of refusing
	// the default, and prints it; a declared value the platform cannot hold is still refused. A
	// property not listed takes airlock's default, which the platform must then hold. Only
	// Replaceable properties may be listed.
	PlatformValues map[Property]string `json:"platformValues,omitempty"`
	// Notes say how the platform holds a property where a user would not guess it, in words
	// (local: the writable layer is memory, so the memory limit holds the disk too). plan
	// prints each for every sandbox.
	Notes map[Property]string `json:"notes,omitempty"`
}

// Status is one capability's value on a platform.
type Status struct {
	Supported bool   `json:"supported"`
	Reason    string `json:"reason,omitempty"` // why not, when Supported is false
}

// Bounds are a platform's own ceilings (and floors); zero means unbounded.
type Bounds struct {
	MaxLifetimeSeconds int64 `json:"maxLifetimeSeconds,omitempty"`
	MaxMemoryBytes     int64 `json:"maxMemoryBytes,omitempty"`
	MaxCPUMillis       int64 `json:"maxCpuMillis,omitempty"`
	MaxProcesses       int64 `json:"maxProcesses,omitempty"`
	MaxDomains         int   `json:"maxDomains,omitempty"`
	// MinIdleTimeoutSeconds is the shortest idle timeout the platform can hold.
	MinIdleTimeoutSeconds int64 `json:"minIdleTimeoutSeconds,omitempty"`
}

// Has reports whether the capability is supported.
func (s Set) Has(n Name) bool { return s.Entries[n].Supported }
