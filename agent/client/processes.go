package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
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
	return c.WriteStdinDeadline(ctx, id, r, closeAfter, 0)
}

// WriteStdinDeadline is WriteStdin that first makes the process's deadline d from now (0:
// unchanged), kept by the agent: the work r hands over gets its own deadline, which no death
// of this client stretches.
func (c *Client) WriteStdinDeadline(ctx context.Context, id string, r io.Reader, closeAfter bool, d time.Duration) error {
	q := url.Values{}
	if closeAfter {
		q.Set("close", "true")
	}
	if d > 0 {
		q.Set("deadlineMs", strconv.FormatInt(max(d.Milliseconds(), 1), 10))
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
