package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	agentclient "github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/server/api"
)

// execStreamer is what agent/client.Client offers beyond sandbox.Agent: the exec's stream
// itself, so the answer can start as soon as the agent accepted the command, and tty sizes.
type execStreamer interface {
	ExecStream(ctx context.Context, req sandbox.ExecRequest, opts ...agentclient.ExecOption) (*agentclient.Stream, error)
}

// processAgent is the agent client's background-process API; the process endpoints exist
// only for agents that offer it.
type processAgent interface {
	StartProcess(ctx context.Context, req agentclient.ProcessRequest, opts ...agentclient.ExecOption) (agentclient.Process, error)
	Processes(ctx context.Context) ([]agentclient.Process, error)
	Process(ctx context.Context, id string) (agentclient.Process, error)
	RemoveProcess(ctx context.Context, id string) error
	Attach(ctx context.Context, id string, fromStart bool) (*agentclient.Stream, error)
	WriteStdin(ctx context.Context, id string, r io.Reader, closeAfter bool) error
	Signal(ctx context.Context, id, signal string) error
	Wait(ctx context.Context, id string) (sandbox.ExecResult, error)
	Resize(ctx context.Context, id string, rows, cols int) error
}

// toExecRequest converts the API's request; stdin is attached by the caller.
func toExecRequest(req api.ExecRequest) (sandbox.ExecRequest, []agentclient.ExecOption, error) {
	timeout := time.Duration(req.TimeoutMs) * time.Millisecond
	switch {
	case req.TimeoutMs < 0:
		return sandbox.ExecRequest{}, nil, fmt.Errorf("%w: timeoutMs %d: must be positive (0 means %s)", sandbox.ErrInvalid, req.TimeoutMs, api.DefaultExecTimeout)
	case req.TimeoutMs == 0:
		timeout = api.DefaultExecTimeout
	}
	var opts []agentclient.ExecOption
	if req.Rows != 0 || req.Cols != 0 {
		if !req.TTY {
			return sandbox.ExecRequest{}, nil, fmt.Errorf("%w: rows/cols %d/%d: a terminal size needs tty: true", sandbox.ErrInvalid, req.Rows, req.Cols)
		}
		opts = append(opts, agentclient.WithTermSize(req.Rows, req.Cols))
	}
	return sandbox.ExecRequest{
		Argv: req.Argv, Shell: req.Shell, Cwd: req.Cwd, Env: req.Env, Timeout: timeout,
		MaxStdout: req.MaxStdout, MaxStderr: req.MaxStderr, TTY: req.TTY,
	}, opts, nil
}

// eventWriter writes an NDJSON event stream, flushing every event so output reaches the
// caller while the command still runs. The status line goes out with the first event.
type eventWriter struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	rc      *http.ResponseController
	cancel  context.CancelFunc // a caller that stops reading stops the command
	started bool
	seq     uint64
	err     error
}

func (e *eventWriter) begin() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.beginLocked()
}

func (e *eventWriter) beginLocked() {
	if e.started {
		return
	}
	e.started = true
	e.w.Header().Set("Content-Type", api.ContentTypeNDJSON)
	e.w.Header().Set("X-Content-Type-Options", "nosniff")
	e.w.WriteHeader(http.StatusOK)
	if err := e.rc.Flush(); err != nil {
		e.fail(err)
	}
}

func (e *eventWriter) fail(err error) {
	if e.err == nil {
		e.err = err
		e.cancel()
	}
}

func (e *eventWriter) write(ev api.Event) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.beginLocked()
	if e.err != nil {
		return e.err
	}
	b, err := json.Marshal(ev)
	if err != nil {
		e.fail(err)
		return err
	}
	if _, err := e.w.Write(append(b, '\n')); err != nil {
		e.fail(err)
		return err
	}
	if err := e.rc.Flush(); err != nil {
		e.fail(err)
		return err
	}
	return nil
}

type streamWriter struct {
	e  *eventWriter
	st sandbox.Stream
}

func (w streamWriter) Write(p []byte) (int, error) {
	w.e.mu.Lock()
	w.e.seq++
	seq := w.e.seq
	w.e.mu.Unlock()
	if err := w.e.write(api.Event{Seq: seq, Stream: w.st, Data: p}); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (e *eventWriter) output(st sandbox.Stream) io.Writer { return streamWriter{e: e, st: st} }

// finish ends a stream with its terminal event: the result, or the error (as an HTTP error
// when nothing was sent yet).
func (s *Server) finish(w http.ResponseWriter, r *http.Request, e *eventWriter, res sandbox.ExecResult, err error) {
	if err == nil {
		_ = e.write(api.Event{Exit: &res})
		return
	}
	e.mu.Lock()
	started := e.started
	e.mu.Unlock()
	if !started {
		s.writeError(w, r, err)
		return
	}
	rs := stateOf(r.Context())
	body, _ := errorBody(err, rs.id)
	rs.log.Info("stream failed", "code", body.Code, "err", err)
	_ = e.write(api.Event{Error: &body})
}

// execHeader reads the JSON header of an exec body and, when it asks for stdin, returns the
// rest of the body (after one '\n') as stdin.
func (s *Server) execHeader(r *http.Request) (api.ExecRequest, io.Reader, error) {
	limited := io.LimitReader(r.Body, s.opts.MaxBodyBytes)
	dec := json.NewDecoder(limited)
	dec.DisallowUnknownFields()
	var req api.ExecRequest
	if err := dec.Decode(&req); err != nil {
		return req, nil, fmt.Errorf("%w: exec request: %v", sandbox.ErrInvalid, err)
	}
	if !req.Stdin {
		return req, nil, nil
	}
	// What the decoder read ahead, what is left of the header budget, then the rest.
	rest := bufio.NewReader(io.MultiReader(dec.Buffered(), limited, r.Body))
	switch b, err := rest.ReadByte(); {
	case err == io.EOF:
		return req, strings.NewReader(""), nil
	case err != nil:
		return req, nil, fmt.Errorf("%w: exec request: read stdin: %v", sandbox.ErrInvalid, err)
	case b != '\n':
		return req, nil, fmt.Errorf("%w: exec request: with stdin: true the JSON header must be followed by one newline, then stdin (got %q)", sandbox.ErrInvalid, b)
	}
	return req, rest, nil
}

func (s *Server) exec(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	rc := http.NewResponseController(w)
	// Stdin keeps arriving while output goes out.
	_ = rc.EnableFullDuplex()
	req, stdin, err := s.execHeader(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sreq, opts, err := toExecRequest(req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sreq.Stdin = stdin
	agent, err := s.backend.Connect(ctx, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer agent.Close()
	e := &eventWriter{w: w, rc: rc, cancel: cancel}
	start := time.Now()
	var res sandbox.ExecResult
	if st, ok := agent.(execStreamer); ok {
		var stream *agentclient.Stream
		stream, err = st.ExecStream(ctx, sreq, opts...)
		if err == nil {
			w.Header().Set("X-Airlock-Exec-Id", stream.ID)
			e.begin() // the command runs: say so before its first output
			res, err = stream.Wait(e.output(sandbox.Stdout), e.output(sandbox.Stderr))
		}
	} else if len(opts) > 0 {
		err = fmt.Errorf("%w: this agent cannot set a terminal size", sandbox.ErrUnsupported)
	} else {
		res, err = agent.Exec(ctx, sreq, e.output(sandbox.Stdout), e.output(sandbox.Stderr))
	}
	s.metrics.observeExec(time.Since(start), res, err)
	stateOf(ctx).log.Debug("exec done", "exit", res.ExitCode, "timedOut", res.TimedOut, "err", err)
	s.finish(w, r, e, res, err)
}

// withProcesses runs fn with the session's agent, when it offers background processes.
func (s *Server) withProcesses(w http.ResponseWriter, r *http.Request, fn func(ctx context.Context, pa processAgent) error) {
	ctx := r.Context()
	agent, err := s.backend.Connect(ctx, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer agent.Close()
	pa, ok := agent.(processAgent)
	if !ok {
		s.writeError(w, r, fmt.Errorf("%w: this sandbox's agent has no background processes", sandbox.ErrUnsupported))
		return
	}
	if err := fn(ctx, pa); err != nil {
		s.writeError(w, r, err)
	}
}

func processOf(p agentclient.Process) api.Process {
	return api.Process{ID: p.ID, Argv: slices.Clone(p.Argv), TTY: p.TTY, Running: p.Running, StartedAt: p.StartedAt, Exit: p.Exit}
}

func (s *Server) startProcess(w http.ResponseWriter, r *http.Request) {
	var req api.ExecRequest
	if err := s.readJSON(r, &req, "process request"); err != nil {
		s.writeError(w, r, err)
		return
	}
	sreq, opts, err := toExecRequest(req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.withProcesses(w, r, func(ctx context.Context, pa processAgent) error {
		p, err := pa.StartProcess(ctx, agentclient.ProcessRequest{ExecRequest: sreq, OpenStdin: req.Stdin}, opts...)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusCreated, processOf(p))
		return nil
	})
}

func (s *Server) listProcesses(w http.ResponseWriter, r *http.Request) {
	s.withProcesses(w, r, func(ctx context.Context, pa processAgent) error {
		ps, err := pa.Processes(ctx)
		if err != nil {
			return err
		}
		out := api.ProcessList{Processes: make([]api.Process, len(ps))}
		for i, p := range ps {
			out.Processes[i] = processOf(p)
		}
		writeJSON(w, http.StatusOK, out)
		return nil
	})
}

func (s *Server) getProcess(w http.ResponseWriter, r *http.Request) {
	s.withProcesses(w, r, func(ctx context.Context, pa processAgent) error {
		p, err := pa.Process(ctx, r.PathValue("pid"))
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, processOf(p))
		return nil
	})
}

func (s *Server) removeProcess(w http.ResponseWriter, r *http.Request) {
	s.withProcesses(w, r, func(ctx context.Context, pa processAgent) error {
		if err := pa.RemoveProcess(ctx, r.PathValue("pid")); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	})
}

// attachProcess streams a process's output as exec does; the caller leaving does not stop it.
func (s *Server) attachProcess(w http.ResponseWriter, r *http.Request) {
	from := r.URL.Query().Get("from")
	if from != "" && from != "start" && from != "live" {
		s.writeError(w, r, fmt.Errorf("%w: from %q: allowed are start and live (default)", sandbox.ErrInvalid, from))
		return
	}
	s.withProcesses(w, r, func(ctx context.Context, pa processAgent) error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stream, err := pa.Attach(ctx, r.PathValue("pid"), from == "start")
		if err != nil {
			return err
		}
		e := &eventWriter{w: w, rc: http.NewResponseController(w), cancel: cancel}
		e.begin()
		res, err := stream.Wait(e.output(sandbox.Stdout), e.output(sandbox.Stderr))
		s.finish(w, r, e, res, err)
		return nil
	})
}

func (s *Server) processStdin(w http.ResponseWriter, r *http.Request) {
	closeAfter := false
	switch v := r.URL.Query().Get("close"); v {
	case "", "false":
	case "true":
		closeAfter = true
	default:
		s.writeError(w, r, fmt.Errorf("%w: close %q: allowed are true and false", sandbox.ErrInvalid, v))
		return
	}
	s.withProcesses(w, r, func(ctx context.Context, pa processAgent) error {
		if err := pa.WriteStdin(ctx, r.PathValue("pid"), r.Body, closeAfter); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	})
}

func (s *Server) signalProcess(w http.ResponseWriter, r *http.Request) {
	var req api.SignalRequest
	if err := s.readJSON(r, &req, "signal request"); err != nil {
		s.writeError(w, r, err)
		return
	}
	s.withProcesses(w, r, func(ctx context.Context, pa processAgent) error {
		if err := pa.Signal(ctx, r.PathValue("pid"), req.Signal); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	})
}

func (s *Server) waitProcess(w http.ResponseWriter, r *http.Request) {
	s.withProcesses(w, r, func(ctx context.Context, pa processAgent) error {
		res, err := pa.Wait(ctx, r.PathValue("pid"))
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, res)
		return nil
	})
}

func (s *Server) resizeProcess(w http.ResponseWriter, r *http.Request) {
	var req api.ResizeRequest
	if err := s.readJSON(r, &req, "resize request"); err != nil {
		s.writeError(w, r, err)
		return
	}
	s.withProcesses(w, r, func(ctx context.Context, pa processAgent) error {
		if err := pa.Resize(ctx, r.PathValue("pid"), req.Rows, req.Cols); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	})
}
