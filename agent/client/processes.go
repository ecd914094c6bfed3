package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

// ProcessRequest starts a background process. Stdin in the embedded request must be nil: a
// process's stdin is fed later with WriteStdin when OpenStdin is set.
type ProcessRequest struct {
	sbtypes.ExecRequest
	OpenStdin bool
	// ExitFirst: the caller discards the sandbox after this process, and wants its exit as
	// soon as the process has exited and its output has ended, before whatever else it
	// started is confirmed gone (wire.ExecRequest.ExitFirst).
	ExitFirst bool
}

// Process describes a background process.
type Process struct {
	ID        string
	Argv      []string
	TTY       bool
	Running   bool
	StartedAt time.Time
	Exit      *sbtypes.ExecResult // set once it has exited
}

func processOf(p wire.Process) Process {
	out := Process{ID: p.ID, Argv: p.Argv, TTY: p.TTY, Running: p.State == wire.StateRunning}
	out.StartedAt, _ = time.Parse(time.RFC3339Nano, p.StartedAt)
	if p.Exit != nil {
		r := resultOf(*p.Exit)
		out.Exit = &r
	}
	return out
}

func procPath(id, suffix string) string { return "/v1/processes/" + url.PathEscape(id) + suffix }

// StartProcess starts a background process; its deadline still applies.
func (c *Client) StartProcess(ctx context.Context, req ProcessRequest, opts ...ExecOption) (Process, error) {
	if req.Stdin != nil {
		return Process{}, fmt.Errorf("%w: stdin: a background process takes stdin through WriteStdin (set OpenStdin)", sbtypes.ErrInvalid)
	}
	w, err := toWire(req.ExecRequest, opts)
	if err != nil {
		return Process{}, err
	}
	w.Stdin = req.OpenStdin
	w.ExitFirst = req.ExitFirst
	var p wire.Process
	if err := c.doJSON(ctx, http.MethodPost, "/v1/processes", nil, w, &p, http.StatusCreated, true); err != nil {
		return Process{}, err
	}
	return processOf(p), nil
}

// Processes lists the background processes the agent holds, oldest first.
func (c *Client) Processes(ctx context.Context) ([]Process, error) {
	var list []wire.Process
	if err := c.doJSON(ctx, http.MethodGet, "/v1/processes", nil, nil, &list, http.StatusOK, false); err != nil {
		return nil, err
	}
	out := make([]Process, len(list))
	for i, p := range list {
		out[i] = processOf(p)
	}
	return out, nil
}

// Process describes one background process.
func (c *Client) Process(ctx context.Context, id string) (Process, error) {
	var p wire.Process
	if err := c.doJSON(ctx, http.MethodGet, procPath(id, ""), nil, nil, &p, http.StatusOK, false); err != nil {
		return Process{}, err
	}
	return processOf(p), nil
}

// RemoveProcess kills a process if it still runs and forgets it.
func (c *Client) RemoveProcess(ctx context.Context, id string) error {
	return c.doJSON(ctx, http.MethodDelete, procPath(id, ""), nil, nil, nil, http.StatusNoContent, true)
}

// Attach streams a process's output: fromStart replays what the agent still holds (a gap in
// Seq shows what its bounded buffer dropped), otherwise only output produced from now on. The
// stream ends with the process's terminal event; closing it early leaves the process running.
func (c *Client) Attach(ctx context.Context, id string, fromStart bool) (*Stream, error) {
	from := "live"
	if fromStart {
		from = "start"
	}
	resp, err := c.do(ctx, http.MethodGet, procPath(id, "/output"), url.Values{"from": {from}}, nil, http.StatusOK, false)
	if err != nil {
		return nil, err
	}
	return newStream(resp), nil
}

// Output is what the agent holds of a process's output now, after sequence number after (0:
// all it holds), without waiting for more; exit is set once the process has exited (its
// output is then complete). A gap in the frames' sequence numbers is output the agent's
// buffer dropped before it was read.
func (c *Client) Output(ctx context.Context, id string, after uint64) (frames []sbtypes.OutputFrame, exit *sbtypes.ExecResult, err error) {
	resp, err := c.do(ctx, http.MethodGet, procPath(id, "/output"), url.Values{"from": {"start"}, "follow": {"false"}}, nil, http.StatusOK, false)
	if err != nil {
		return nil, nil, err
	}
	st := newStream(resp)
	defer st.Close()
	for {
		ev, err := st.Next()
		if err != nil {
			if st.endedClean() {
				return frames, nil, nil // the process runs on: the stream ends without an exit
			}
			return nil, nil, err
		}
		if ev.Result != nil {
			return frames, ev.Result, nil
		}
		if ev.Output.Seq > after {
			frames = append(frames, *ev.Output)
		}
	}
}

// WriteStdin sends r's bytes to the process's stdin; closeAfter then closes it (on a terminal:
// types ^D).
func (c *Client) WriteStdin(ctx context.Context, id string, r io.Reader, closeAfter bool) error {
	q := url.Values{}
	if closeAfter {
		q.Set("close", "true")
	}
	if r == nil {
		r = http.NoBody
	}
	resp, err := c.do(ctx, http.MethodPost, procPath(id, "/stdin"), q, r, http.StatusNoContent, true)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// HandoffRequest is work handed to a background process that waits for it on its stdin (a
// pre-started interpreter), with the deadline and output caps the agent keeps for it.
type HandoffRequest struct {
	// Timeout is the work's deadline from the handoff (required); it replaces the process's.
	Timeout time.Duration
	// MaxStdout and MaxStderr cap each stream from the handoff on; 0 = the agent's default.
	MaxStdout, MaxStderr int64
	// Input goes to the process's stdin with the request.
	Input []byte
	// More, when set, follows Input on stdin, sent only once the agent has taken the work (a
	// refused handoff leaves it unread, for a cold run to read instead). Stdin is closed after
	// Input and More.
	More io.Reader
}

// Handoff hands work to process id and returns its output from then on, ending with the
// process's exit, as an exec's stream does. A refusal before anything was handed over is an
// error of the agent's (ErrConflict: the process has exited, was handed work before or takes
// none; ErrNotFound: no such process, or an agent without handoffs). Closing the stream
// before its terminal event kills the process, as an exec's would.
func (c *Client) Handoff(ctx context.Context, id string, req HandoffRequest) (*Stream, error) {
	if req.Timeout <= 0 {
		return nil, fmt.Errorf("%w: timeout: %v: a deadline is required", sbtypes.ErrInvalid, req.Timeout)
	}
	hdr, err := json.Marshal(wire.HandoffRequest{TimeoutMs: ceilMs(req.Timeout), MaxStdout: req.MaxStdout, MaxStderr: req.MaxStderr, More: req.More != nil})
	if err != nil {
		return nil, fmt.Errorf("%w: encode handoff request: %v", sbtypes.ErrInvalid, err)
	}
	// The body is in memory: an agent that refuses the work answers at once, whatever it
	// does with a body it has not read.
	resp, err := c.do(ctx, http.MethodPost, procPath(id, "/handoff"), nil, bytes.NewReader(append(hdr, req.Input...)), http.StatusOK, true)
	if err != nil {
		return nil, err
	}
	st := newStream(resp)
	if req.More != nil {
		// The rest of stdin on a request of its own, alongside the output; it ends with the
		// stream (the program may be done without reading it all).
		sctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			// Errors here are the program's business (it may exit without reading).
			_ = c.WriteStdin(sctx, id, req.More, true)
		}()
		st.after = func() {
			cancel()
			<-done
		}
	}
	return st, nil
}

// Signal sends a signal ("SIGTERM", "INT", ...) to the process's main process.
func (c *Client) Signal(ctx context.Context, id, signal string) error {
	return c.doJSON(ctx, http.MethodPost, procPath(id, "/signal"), nil, wire.SignalRequest{Signal: signal}, nil, http.StatusNoContent, true)
}

// Wait blocks until the process has exited and everything it started is gone.
func (c *Client) Wait(ctx context.Context, id string) (sbtypes.ExecResult, error) {
	var ex wire.Exit
	if err := c.doJSON(ctx, http.MethodGet, procPath(id, "/wait"), nil, nil, &ex, http.StatusOK, false); err != nil {
		return sbtypes.ExecResult{}, err
	}
	return resultOf(ex), nil
}

// Resize sets a tty process's terminal size.
func (c *Client) Resize(ctx context.Context, id string, rows, cols int) error {
	return c.doJSON(ctx, http.MethodPost, procPath(id, "/resize"), nil, wire.ResizeRequest{Rows: rows, Cols: cols}, nil, http.StatusNoContent, true)
}
