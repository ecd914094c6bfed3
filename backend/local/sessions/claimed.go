package sessions

import (
	"encoding/json"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/agent/client"
)

// MaxParked bounds how many sandboxes of one template are kept parked (--pool and the
// runtime's fill both refuse more).
const MaxParked = 8

// HealthTimeout bounds a claim's wait for a parked sandbox's agent: a parked one answers in well under
// a millisecond, so one that does not within this is dead to the claimer.
const HealthTimeout = 2 * time.Second

// Claimed is a parked sandbox this process claimed and found usable: its init pinned by a pidfd, its
// agent answering. It serves one run; Kill ends it, and the full runtime (a filler, a
// reconcile) removes what is left.
type Claimed struct {
	// ID is the parked sandbox's session id.
	ID string
	// Record is its session.json as it was at the claim.
	Record *Record
	// Prestart is what the filler's prestart left for the claimer (Entry.Prestart).
	Prestart json.RawMessage
	// Agent is a client of its agent whose every request carries an execute token (Tokens).
	Agent *client.Client
	// Left is how many were still parked when it was taken (the pool ran dry at 0), and
	// BackToBack whether the claim before it came less than ParkQuiet earlier.
	Left       int
	BackToBack bool

	mu     sync.Mutex
	pidfd  int // init's; -1 once released
	killed bool
}
