package runcode

import "github.com/airlock-sandbox/airlock/runcode/core"

// The pool memory's names and parser (runcode/core/poolmemory.go).
const (
	EnvPoolMemory     = core.EnvPoolMemory
	PoolMemoryFlag    = core.PoolMemoryFlag
	PoolMemoryDefault = core.PoolMemoryDefault
)

// ParsePoolMemory reads a pool memory (core.ParsePoolMemory).
func ParsePoolMemory(s string) (int64, error) { return core.ParsePoolMemory(s) }
