// Package brokerapi is the session broker's HTTP wire format, shared by the operator and its clients (stdlib only).
package brokerapi

import (
	"time"

	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
	"github.com/airlock-sandbox/airlock/spec"
)

// Paths. Every request carries "Authorization: Bearer <ServiceAccount token>" whose audience is
// the broker's (default DefaultAudience), or, through the API server's service proxy (which
// consumes Authorization), "HeaderAuthorization: Bearer <token>".
const (
	// PathClaim: POST ClaimRequest → 200 Grant; 503 + Retry-After when the pool is empty.
	PathClaim = "/v1/claim"
	// PathSessions: GET ?namespace= → 200 []Session (the caller's sessions);
	// GET {PathSessions}{namespace}/{session} → 200 Grant (reconnect: fresh tokens);
	// DELETE {PathSessions}{namespace}/{session} → 204 once the pod is gone.
	PathSessions = "/v1/sessions/"
	// DefaultAudience is the token audience the broker's TokenReview asks for.
	DefaultAudience = "airlock-broker"
	// HeaderAuthorization is read when Authorization is absent (the agent reads it too).
	HeaderAuthorization = wire.HeaderAuthorization
)

// ClaimRequest asks for one idle pod of the Sandbox Namespace/Sandbox. Declaration, when set,
// must equal the Sandbox's declaration after defaults: a caller never gets a sandbox other than
// the one it asked for.
type ClaimRequest struct {
	Namespace   string        `json:"namespace"`
	Sandbox     string        `json:"sandbox"`
	Declaration *spec.Sandbox `json:"declaration,omitempty"`
}

// Session describes one claimed pod.
type Session struct {
	ID         string       `json:"id"`
	Namespace  string       `json:"namespace"`
	Sandbox    string       `json:"sandbox"`
	Generation uint64       `json:"generation"`
	CreatedAt  time.Time    `json:"createdAt"`
	ExpiresAt  time.Time    `json:"expiresAt"`
	Owner      string       `json:"owner"`
	Spec       spec.Sandbox `json:"spec"`
}

// Grant is a session plus what reaches it: the agent endpoint ("tcp:ip:port"), the pod (in the
// session's namespace; for callers whose pod addresses do not route, through the API server's
// pod proxy) and capability tokens (execute; manage too, for the owner). Tokens expire at
// TokenExpiresAt; ask again (reconnect) for fresh ones.
type Grant struct {
	Session        Session   `json:"session"`
	Endpoint       string    `json:"endpoint"`
	Pod            string    `json:"pod"`
	ExecuteToken   string    `json:"executeToken"`
	ManageToken    string    `json:"manageToken,omitempty"`
	TokenExpiresAt time.Time `json:"tokenExpiresAt"`
}

// Error is every non-2xx body. Code is one of the sandbox error classes' wire names.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Error codes: the sandbox classes' (sbtypes.Codes, the one table every wire answers from),
// and unavailable, the broker's own.
const (
	CodeInvalid         = "invalid"
	CodeUnauthenticated = "unauthenticated"
	CodeForbidden       = "forbidden"
	CodeNotFound        = "not_found"
	CodeConflict        = "conflict"
	CodeRefused         = "refused"
	CodeOutcomeUnknown  = "outcome_unknown"
	CodeInternal        = sbtypes.CodeInternal
	// CodeUnavailable (503, with Retry-After): the apiserver, or a ready pod of the pool, is not there yet;
	// to a client it is sandbox.ErrUnreachable.
	CodeUnavailable = "unavailable"
)

// CodeOf is the code and HTTP status the broker answers err with: its class's.
func CodeOf(err error) (string, int) { return sbtypes.CodeOf(err) }

// ClassOf is the sandbox error class of a broker code, nil for internal or an unknown one.
func ClassOf(code string) error {
	if code == CodeUnavailable {
		return sbtypes.ErrUnreachable
	}
	return sbtypes.ClassOf(code)
}
