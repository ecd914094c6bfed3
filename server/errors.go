package server

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"

	agentclient "github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/server/api"
	"github.com/airlock-sandbox/airlock/spec"
	"github.com/airlock-sandbox/airlock/token"
)

// problemsError is a refusal with field-level problems for the caller.
type problemsError struct {
	class    error
	msg      string
	problems []api.Problem
}

func (e *problemsError) Error() string { return e.msg }
func (e *problemsError) Unwrap() error { return e.class }

func problemsOfFields(fes []*spec.FieldError) []api.Problem {
	out := make([]api.Problem, len(fes))
	for i, fe := range fes {
		out[i] = api.Problem{SandboxID: fe.SandboxID, Field: fe.Path, Value: fe.Value, Rule: fe.Rule, Message: fe.Message}
	}
	return out
}

// problemsOfRefusals converts a one-sandbox plan, dropping the stack prefix of its paths so
// they name fields of the declaration the caller sent.
func problemsOfRefusals(rs []*plan.Refusal) []api.Problem {
	out := make([]api.Problem, len(rs))
	for i, r := range rs {
		out[i] = api.Problem{SandboxID: r.SandboxID, Field: strings.TrimPrefix(r.Field, "sandboxes[0]."), Value: r.Value,
			Capability: r.Capability, Rule: r.Rule, Message: r.Message}
	}
	return out
}

// errorBody is the API's answer for err: its code, and whatever refines it.
func errorBody(err error, requestID string) (api.Error, int) {
	code, status := api.CodeOf(err)
	body := api.Error{Code: code, Message: err.Error(), RequestID: requestID}
	var re *reasonError
	var te *token.Error
	var ae *agentclient.Error
	var pe *problemsError
	switch {
	case errors.As(err, &re):
		body.Reason = re.reason
	case errors.As(err, &te):
		body.Reason = string(te.Reason)
	case errors.As(err, &ae):
		body.Reason = ae.Reason
	}
	if errors.As(err, &pe) {
		body.Problems = pe.problems
	}
	return body, status
}

// writeError answers with err's status and JSON body; it is the only place errors become HTTP.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	rs := stateOf(r.Context())
	body, status := errorBody(err, rs.id)
	lvl := slog.LevelInfo
	if status >= 500 {
		lvl = slog.LevelError
	}
	rs.log.Log(r.Context(), lvl, "request failed", "code", body.Code, "reason", body.Reason, "err", err)
	writeJSON(w, status, body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b, _ = json.Marshal(api.Error{Code: api.CodeInternal, Message: "encode answer: " + err.Error()})
	}
	w.Header().Set("Content-Type", api.ContentTypeJSON)
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
