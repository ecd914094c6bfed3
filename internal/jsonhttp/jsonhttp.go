// Package jsonhttp holds what airlock's two HTTP clients (the daemon's, the agent's) share: a JSON request body and reading a JSON answer.
package jsonhttp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

// Body encodes in as a request body for path; nil in is no body.
func Body(path string, in any) (io.Reader, error) {
	if in == nil {
		return nil, nil
	}
	b, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("%w: encode %s body: %v", sbtypes.ErrInvalid, path, err)
	}
	return bytes.NewReader(b), nil
}

// Answer reads resp's body into out (nil: drains it) and closes it. An answer that does not
// decode leaves a mutating call's outcome unknown; any other call is taken as not reached.
func Answer(resp *http.Response, out any, method, path string, mutating bool) error {
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		class := sbtypes.ErrUnreachable
		if mutating {
			class = sbtypes.ErrOutcomeUnknown
		}
		return fmt.Errorf("%w: %s %s: decode answer: %v", class, method, path, err)
	}
	return nil
}
