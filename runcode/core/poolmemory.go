package core

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

// The pool memory (docs/pool.md#the-pool-memory) is one setting on every surface that keeps
// sandboxes ready: the flag --pool-memory (airlock mcp), the variable $AIRLOCK_POOL_MEMORY
// (every command, airlock run's parked sandboxes included), local.PoolOptions.Memory and
// local.ParkOptions.Memory. It is parsed here, in the lean front's leaf, so that every binary
// reads it alike.
const (
	// EnvPoolMemory sets the pool memory where no flag does.
	EnvPoolMemory = "AIRLOCK_POOL_MEMORY"
	// PoolMemoryFlag is the flag's name.
	PoolMemoryFlag = "pool-memory"
	// PoolMemoryDefault is the pool memory when nothing sets it: room for a burst of a few
	// dozen back-to-back calls' sandboxes (~10 MiB each with python waiting).
	PoolMemoryDefault = "256Mi"
)

var poolMemoryUnits = []struct {
	suffix string
	mult   int64
}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}, {"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}}

// ParsePoolMemory reads a pool memory: a whole number of bytes with an optional suffix (Ki,
// Mi, Gi, Ti, k, M, G, T: the quantities' suffixes), 0 for no bound.
func ParsePoolMemory(s string) (int64, error) {
	num, mult := s, int64(1)
	for _, u := range poolMemoryUnits {
		if strings.HasSuffix(s, u.suffix) {
			num, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || num == "" || num[0] == '+' || n > (1<<62)/mult {
		return 0, fmt.Errorf("%w: pool memory %q: allowed is a whole number of bytes, 0 (no bound) or more, with an optional suffix Ki, Mi, Gi, Ti, k, M, G, T (e.g. 256Mi)", sbtypes.ErrInvalid, s)
	}
	return n * mult, nil
}
