package server

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/airlock-sandbox/airlock/egress"
	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/server/api"
	"github.com/airlock-sandbox/airlock/spec"
)

// EgressCounterSource is implemented by backends that count one sandbox's egress decisions;
// the server then serves GET /v1/sandboxes/{id}/egress/counters (otherwise 501 unsupported).
type EgressCounterSource interface {
	EgressCounters(ctx context.Context, sessionID string) (egress.Counters, error)
}

// setEgress replaces a live sandbox's egress policy. It is checked as a create would check
// it: the declaration in force with this egress must validate (400) and be enforceable on
// this platform (422), and only the egress fields are judged.
func (s *Server) setEgress(w http.ResponseWriter, r *http.Request) {
	es, err := sandbox.Feature[sandbox.EgressSetter](r.Context(), s.backend)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var e spec.Egress
	if err := s.readJSON(r, &e, "egress"); err != nil {
		s.writeError(w, r, err)
		return
	}
	ctx, id := r.Context(), r.PathValue("id")
	sess, err := s.backend.Get(ctx, id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	decl := sess.Spec
	decl.Egress = e
	var fes []*spec.FieldError
	for _, fe := range decl.Validate("") {
		if isEgressField(fe.Path) {
			fes = append(fes, fe)
		}
	}
	if len(fes) > 0 {
		msgs := make([]string, len(fes))
		for i, fe := range fes {
			msgs[i] = fe.Error()
		}
		s.writeError(w, r, &problemsError{class: sandbox.ErrInvalid, problems: problemsOfFields(fes),
			msg: "invalid egress: " + strings.Join(msgs, "; ")})
		return
	}
	platform := s.backend.Platform()
	res := plan.CheckCreate(decl, platform, s.backend.Capabilities(ctx))
	var refusals []*plan.Refusal
	for _, rf := range res.Refusals {
		if isEgressField(strings.TrimPrefix(rf.Field, "sandboxes[0].")) {
			refusals = append(refusals, rf)
		}
	}
	if len(refusals) > 0 {
		problems := problemsOfRefusals(refusals)
		msgs := make([]string, len(problems))
		for i, p := range problems {
			msgs[i] = fmt.Sprintf("%s: %s (needs %s)", p.Field, p.Message, refusals[i].Needs())
		}
		s.writeError(w, r, &problemsError{class: sandbox.ErrRefused, problems: problems,
			msg: fmt.Sprintf("refused on %s: %s", platform, strings.Join(msgs, "; "))})
		return
	}
	if err := es.SetEgress(ctx, id, e); err != nil {
		s.writeError(w, r, err)
		return
	}
	stateOf(ctx).log.Info("egress changed", "session", id, "mode", string(e.Mode), "domains", strings.Join(e.Domains, ","))
	writeJSON(w, http.StatusOK, api.EgressPolicy{Session: id, Egress: e})
}

func isEgressField(path string) bool { return path == "egress" || strings.HasPrefix(path, "egress.") }

func (s *Server) egressCounters(w http.ResponseWriter, r *http.Request) {
	src, ok := s.backend.(EgressCounterSource)
	if !ok {
		s.writeError(w, r, fmt.Errorf("%w: the %s backend does not count a sandbox's egress", sandbox.ErrUnsupported, s.backend.Platform()))
		return
	}
	c, err := src.EgressCounters(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.EgressCounters{
		ConnsAllowed: c.ConnsAllowed, ConnsDenied: c.ConnsDenied, DialFailures: c.DialFailures,
		BytesSent: c.BytesSent, BytesReceived: c.BytesReceived, DNSAllowed: c.DNSAllowed,
		DNSDenied: c.DNSDenied, PacketsDropped: c.PacketsDropped,
	})
}
