package capability

// Set is what one platform publishes: every capability it knows, whether it holds, and why
// not when it does not.
type Set struct {
	Platform Platform        `json:"platform"`
	Entries  map[Name]Status `json:"capabilities"`
	// Bounds are the platform's own numeric limits (e.g. maximum session lifetime).
	Bounds Bounds `json:"bounds"`
}

// Status is one capability's value on a platform.
type Status struct {
	Supported bool   `json:"supported"`
	Reason    string `json:"reason,omitempty"` // why not, when Supported is false
}

// Bounds are a platform's own ceilings; zero means unbounded.
type Bounds struct {
	MaxLifetimeSeconds int64 `json:"maxLifetimeSeconds,omitempty"`
	MaxMemoryBytes     int64 `json:"maxMemoryBytes,omitempty"`
	MaxCPUMillis       int64 `json:"maxCpuMillis,omitempty"`
	MaxProcesses       int64 `json:"maxProcesses,omitempty"`
	MaxDomains         int   `json:"maxDomains,omitempty"`
}

// Has reports whether the capability is supported.
func (s Set) Has(n Name) bool { return s.Entries[n].Supported }
