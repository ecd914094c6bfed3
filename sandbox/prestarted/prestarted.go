// Package prestarted names what a pool's prestart step leaves waiting in a sandbox for its run.
package prestarted

import (
	"context"

	"github.com/airlock-sandbox/airlock/sandbox"
)

// Interpreters is what a prestart step left waiting in one sandbox (runcode/core.Prestarted):
// the pool that made the sandbox holds it until a claim and hands it to the run
// (backend/local.Pool.ClaimForRun), without knowing more of it than this.
type Interpreters interface {
	// State encodes the waiting interpreters without the client, so that another process can
	// hand one its code (a parked sandbox is prestarted by its filler, run by its claimer).
	State() ([]byte, error)
	// Close releases the agent client the step kept open for the run, when no run will use it.
	Close() error
}

// Func starts interpreters in sess through agent. On success the result owns agent; on an
// error the caller still does and the sandbox is used without interpreters.
type Func func(ctx context.Context, sess *sandbox.Session, agent sandbox.Agent) (Interpreters, error)
