package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/server/api"
)

// ProcessRequest starts a background process. ExecRequest.Stdin must be nil: with OpenStdin
// the process's stdin stays open for WriteStdin.
type ProcessRequest struct {
	sandbox.ExecRequest
	OpenStdin bool
	ExecOptions
}

// Process is a background process in a sandbox; its deadline still applies.
type Process struct {
	api.Process
	sb *Sandbox
}

func (p *Process) path(suffix string) string {
	return p.sb.path("/processes/" + url.PathEscape(p.ID) + suffix)
}

// StartProcess starts a background process and returns once it runs.
func (sb *Sandbox) StartProcess(ctx context.Context, req ProcessRequest) (*Process, error) {
	if req.Stdin != nil {
		return nil, fmt.Errorf("%w: stdin: a background process takes stdin through WriteStdin (set OpenStdin)", sandbox.ErrInvalid)
	}
	body, err := toAPI(req.ExecRequest, req.ExecOptions)
	if err != nil {
		return nil, err
	}
	body.Stdin = req.OpenStdin
	p := &Process{sb: sb}
	if err := sb.c.doJSON(ctx, http.MethodPost, sb.path("/processes"), nil, body, &p.Process, true); err != nil {
		return nil, err
	}
	return p, nil
}

// Processes lists the sandbox's background processes, oldest first.
func (sb *Sandbox) Processes(ctx context.Context) ([]*Process, error) {
	var out api.ProcessList
	if err := sb.c.doJSON(ctx, http.MethodGet, sb.path("/processes"), nil, nil, &out, false); err != nil {
		return nil, err
	}
	ps := make([]*Process, len(out.Processes))
	for i, p := range out.Processes {
		ps[i] = &Process{Process: p, sb: sb}
	}
	return ps, nil
}

// Process returns a handle on background process id, as the daemon describes it now.
func (sb *Sandbox) Process(ctx context.Context, id string) (*Process, error) {
	p := &Process{Process: api.Process{ID: id}, sb: sb}
	if err := p.Refresh(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// Refresh reloads the process's description.
func (p *Process) Refresh(ctx context.Context) error {
	return p.sb.c.doJSON(ctx, http.MethodGet, p.path(""), nil, nil, &p.Process, false)
}

// Attach copies the process's output to stdout and stderr until it exits: fromStart replays
// what the agent still holds, otherwise only output from now on. Returning early (ctx ends)
// leaves the process running.
func (p *Process) Attach(ctx context.Context, fromStart bool, stdout, stderr io.Writer) (sandbox.ExecResult, error) {
	from := "live"
	if fromStart {
		from = "start"
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resp, err := p.sb.c.do(ctx, http.MethodGet, p.path("/output"), url.Values{"from": {from}}, nil, "", false)
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	defer resp.Body.Close()
	return readEvents(resp, stdout, stderr)
}

// WriteStdin sends r's bytes to the process's stdin; closeAfter then closes it.
func (p *Process) WriteStdin(ctx context.Context, r io.Reader, closeAfter bool) error {
	var q url.Values
	if closeAfter {
		q = url.Values{"close": {"true"}}
	}
	if r == nil {
		r = http.NoBody
	}
	resp, err := p.sb.c.do(ctx, http.MethodPost, p.path("/stdin"), q, r, api.ContentTypeBytes, true)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// Signal sends a signal ("TERM", "SIGINT", ...) to the process.
func (p *Process) Signal(ctx context.Context, signal string) error {
	return p.sb.c.doJSON(ctx, http.MethodPost, p.path("/signal"), nil, api.SignalRequest{Signal: signal}, nil, true)
}

// Wait blocks until the process has exited and everything it started is gone.
func (p *Process) Wait(ctx context.Context) (sandbox.ExecResult, error) {
	var res sandbox.ExecResult
	err := p.sb.c.doJSON(ctx, http.MethodGet, p.path("/wait"), nil, nil, &res, false)
	return res, err
}

// Resize sets a TTY process's terminal size.
func (p *Process) Resize(ctx context.Context, rows, cols int) error {
	return p.sb.c.doJSON(ctx, http.MethodPost, p.path("/resize"), nil, api.ResizeRequest{Rows: rows, Cols: cols}, nil, true)
}

// Remove kills the process if it still runs and forgets it.
func (p *Process) Remove(ctx context.Context) error {
	return p.sb.c.doJSON(ctx, http.MethodDelete, p.path(""), nil, nil, nil, true)
}
