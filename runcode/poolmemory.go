package runcode

import (
	"fmt"
	"os"

	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// The pool memory (docs/pool.md#the-pool-memory) is one setting on every surface: the flag
// --pool-memory, the variable $AIRLOCK_POOL_MEMORY, local.PoolOptions.Memory and, for parked
// sandboxes, local.ParkOptions.Memory.
const (
	// EnvPoolMemory overrides --pool-memory's default.
	EnvPoolMemory = "AIRLOCK_POOL_MEMORY"
	// PoolMemoryFlag is the flag's name.
	PoolMemoryFlag = "pool-memory"
	// PoolMemoryDefault is the pool memory when neither the flag nor the variable sets it: room
	// for a burst of a few dozen back-to-back calls' sandboxes (~10 MiB each, python waiting).
	PoolMemoryDefault = "256Mi"
)

// DefaultPoolMemory is --pool-memory's default: $AIRLOCK_POOL_MEMORY, else PoolMemoryDefault.
func DefaultPoolMemory() string {
	if v, ok := os.LookupEnv(EnvPoolMemory); ok {
		return v
	}
	return PoolMemoryDefault
}

// ParsePoolMemory reads a pool memory: a quantity of bytes ("256Mi", "1G", "0" for none).
func ParsePoolMemory(s string) (int64, error) {
	n, err := spec.Quantity(s).Bytes()
	if err != nil {
		return 0, fmt.Errorf("%w: pool memory %q: %v; write bytes with an optional suffix (Ki, Mi, Gi), 0 for no bound", sandbox.ErrInvalid, s, err)
	}
	if n < 0 {
		return 0, fmt.Errorf("%w: pool memory %q must be 0 (no bound) or more", sandbox.ErrInvalid, s)
	}
	return n, nil
}
