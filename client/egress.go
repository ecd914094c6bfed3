package client

import (
	"context"
	"net/http"

	"github.com/airlock-sandbox/airlock/server/api"
	"github.com/airlock-sandbox/airlock/spec"
)

// EgressCounters are a sandbox's egress decisions.
type EgressCounters = api.EgressCounters

// SetEgress replaces the live sandbox's egress policy, for new connections and DNS queries (a
// move to deny cuts established ones). Refusals are typed as for Create: sandbox.ErrInvalid
// with *spec.FieldError, sandbox.ErrRefused with *plan.Refusal, sandbox.ErrUnsupported where
// the daemon's backend cannot change egress live, sandbox.ErrForbidden for a delegated token.
func (sb *Sandbox) SetEgress(ctx context.Context, e spec.Egress) error {
	var out api.EgressPolicy
	return sb.c.doJSON(ctx, http.MethodPut, sb.path("/egress"), nil, e, &out, true)
}

// EgressCounters reads the sandbox's egress counters (sandbox.ErrUnsupported where the
// backend does not count them).
func (sb *Sandbox) EgressCounters(ctx context.Context) (EgressCounters, error) {
	var c EgressCounters
	err := sb.c.doJSON(ctx, http.MethodGet, sb.path("/egress/counters"), nil, nil, &c, false)
	return c, err
}
