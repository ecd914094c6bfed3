package sandbox

// Stats is one sandbox's resource usage as its cgroups count it. Backends that can read it
// implement `Stats(ctx, sessionID) (Stats, error)` (see server.StatsSource).
type Stats struct {
	// CPUSeconds is the CPU time used so far (user + system), cumulative.
	CPUSeconds float64 `json:"cpuSeconds"`
	// MemoryBytes is the memory in use now.
	MemoryBytes int64 `json:"memoryBytes"`
	// MemoryPeakBytes is the most memory used at once, 0 when unknown.
	MemoryPeakBytes int64 `json:"memoryPeakBytes,omitempty"`
	// Processes is the number of processes and threads now, 0 when unknown.
	Processes int64 `json:"processes,omitempty"`
}
