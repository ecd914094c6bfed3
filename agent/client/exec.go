package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

// ExecOption adjusts an exec or process request beyond sbtypes.ExecRequest.
type ExecOption func(*wire.ExecRequest)

// WithTermSize sets the terminal size of a tty exec or process.
func WithTermSize(rows, cols int) ExecOption {
	return func(r *wire.ExecRequest) { r.Rows, r.Cols = rows, cols }
}

func toWire(req sbtypes.ExecRequest, opts []ExecOption) (wire.ExecRequest, error) {
	if req.Timeout <= 0 {
		return wire.ExecRequest{}, fmt.Errorf("%w: timeout: %v: a deadline is required", sbtypes.ErrInvalid, req.Timeout)
	}
	w := wire.ExecRequest{
		Argv: req.Argv, Shell: req.Shell, Cwd: req.Cwd, Env: req.Env, TimeoutMs: ceilMs(req.Timeout),
		Stdin: req.Stdin != nil, MaxStdout: req.MaxStdout, MaxStderr: req.MaxStderr, TTY: req.TTY,
	}
	for _, o := range opts {
		o(&w)
	}
	return w, nil
}

// ceilMs is d in milliseconds, rounded up: a deadline is never shortened by rounding.
func ceilMs(d time.Duration) int64 {
	ms := d.Milliseconds()
	if time.Duration(ms)*time.Millisecond < d {
		ms++
	}
	return ms
}

// Event is one item of an output stream: an output frame, or the terminal result.
type Event struct {
	Output *sbtypes.OutputFrame
	Result *sbtypes.ExecResult
}

// Stream is an exec's (or an attached process's) output as frames.
type Stream struct {
	// ID is the exec or process id the agent assigned.
	ID   string
	body io.ReadCloser
	r    *bufio.Reader
	buf  []byte
	done bool
	last uint64
	// eof: the stream ended at a frame boundary without a terminal frame (an error for an
	// exec's stream; the normal end of Output's look at a running process).
	eof bool
	// after, when set, runs once the stream has ended or is closed (a handoff's stdin writer
	// is stopped and waited for).
	after     func()
	afterOnce sync.Once
}

// ended runs after once.
func (s *Stream) ended() {
	if s.after != nil {
		s.afterOnce.Do(s.after)
	}
}

func (s *Stream) endedClean() bool { return s.eof }

// ExecStream starts a command and returns its output stream. Closing the stream before its
// terminal event disconnects, which kills the command and everything it started.
func (c *Client) ExecStream(ctx context.Context, req sbtypes.ExecRequest, opts ...ExecOption) (*Stream, error) {
	w, err := toWire(req, opts)
	if err != nil {
		return nil, err
	}
	hdr, err := json.Marshal(w)
	if err != nil {
		return nil, fmt.Errorf("%w: encode exec request: %v", sbtypes.ErrInvalid, err)
	}
	var body io.Reader = bytes.NewReader(hdr)
	if req.Stdin != nil {
		// The body is the JSON header, then stdin until it ends: the agent reads it while it
		// streams output back (full duplex over HTTP/1.1).
		body = io.MultiReader(body, req.Stdin)
	}
	resp, err := c.do(ctx, http.MethodPost, "/v1/exec", nil, body, http.StatusOK, true)
	if err != nil {
		return nil, err
	}
	return newStream(resp), nil
}

func newStream(resp *http.Response) *Stream {
	r := streamReaders.Get().(*bufio.Reader)
	r.Reset(resp.Body)
	return &Stream{ID: resp.Header.Get("X-Airlock-Exec-Id"), body: resp.Body, r: r}
}

// streamReaders holds the streams' frame readers: 64 KiB each, made per call they were most of
// a short exec's garbage on the caller's side.
var streamReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 64<<10) }}

// release hands the frame reader back once Next has read the stream's last frame (the frame's
// payload is in s.buf, not in the reader). Only Next calls it: Close may run while another
// goroutine's Next is still reading, so it leaves the reader to the garbage collector.
func (s *Stream) release() {
	defer s.ended()
	if s.r != nil {
		s.r.Reset(nil)
		streamReaders.Put(s.r)
		s.r = nil
	}
}

// Next returns the next event. After the terminal event it returns io.EOF. A stream that ends
// without a terminal event is an error wrapping sbtypes.ErrOutcomeUnknown, never a success.
func (s *Stream) Next() (Event, error) {
	if s.done {
		return Event{}, io.EOF
	}
	f, buf, err := wire.ReadFrame(s.r, s.buf)
	s.buf = buf
	if err != nil {
		s.done = true
		s.release()
		s.body.Close()
		if err == io.EOF {
			s.eof = true
			return Event{}, fmt.Errorf("%w: exec %s: output stream ended without a terminal frame", sbtypes.ErrOutcomeUnknown, s.ID)
		}
		return Event{}, fmt.Errorf("%w: exec %s: %w", sbtypes.ErrOutcomeUnknown, s.ID, err)
	}
	switch f.Type {
	case wire.FrameStdout, wire.FrameStderr:
		if f.Seq <= s.last {
			s.done = true
			s.release()
			s.body.Close()
			return Event{}, fmt.Errorf("%w: exec %s: sequence %d after %d", sbtypes.ErrOutcomeUnknown, s.ID, f.Seq, s.last)
		}
		s.last = f.Seq
		st := sbtypes.Stdout
		if f.Type == wire.FrameStderr {
			st = sbtypes.Stderr
		}
		return Event{Output: &sbtypes.OutputFrame{Seq: f.Seq, Stream: st, Data: slices.Clone(f.Payload)}}, nil
	case wire.FrameExit:
		s.done = true
		s.release()
		defer s.body.Close()
		var ex wire.Exit
		if err := json.Unmarshal(f.Payload, &ex); err != nil {
			return Event{}, fmt.Errorf("%w: exec %s: bad exit frame: %v", sbtypes.ErrOutcomeUnknown, s.ID, err)
		}
		r := resultOf(ex)
		return Event{Result: &r}, nil
	default: // wire.FrameError
		s.done = true
		s.release()
		defer s.body.Close()
		var we wire.Error
		if err := json.Unmarshal(f.Payload, &we); err != nil || we.Code == "" {
			return Event{}, fmt.Errorf("%w: exec %s: bad error frame", sbtypes.ErrOutcomeUnknown, s.ID)
		}
		return Event{}, &Error{Code: we.Code, Reason: we.Reason, Message: we.Message}
	}
}

// Close ends the stream; before the terminal event this kills an exec (not a process).
func (s *Stream) Close() error {
	s.done = true
	err := s.body.Close()
	s.ended()
	return err
}

func resultOf(ex wire.Exit) sbtypes.ExecResult {
	return sbtypes.ExecResult{
		ExitCode: ex.ExitCode, Signal: ex.Signal, TimedOut: ex.TimedOut, OOMKilled: ex.OOMKilled,
		Truncated: ex.Truncated, Duration: time.Duration(ex.DurationMs) * time.Millisecond,
	}
}

// Exec runs a command to completion, writing its output to stdout and stderr (nil discards)
// as it arrives. The error is nil whenever a terminal exit frame arrived, whatever the exit
// code; a deadline shows as TimedOut in the result.
func (c *Client) Exec(ctx context.Context, req sbtypes.ExecRequest, stdout, stderr io.Writer) (sbtypes.ExecResult, error) {
	s, err := c.ExecStream(ctx, req)
	if err != nil {
		return sbtypes.ExecResult{}, err
	}
	defer s.Close()
	return s.copyTo(stdout, stderr)
}

func (s *Stream) copyTo(stdout, stderr io.Writer) (sbtypes.ExecResult, error) {
	for {
		ev, err := s.Next()
		if err != nil {
			return sbtypes.ExecResult{}, err
		}
		if ev.Result != nil {
			return *ev.Result, nil
		}
		w := stdout
		if ev.Output.Stream == sbtypes.Stderr {
			w = stderr
		}
		if w == nil {
			continue
		}
		if _, err := w.Write(ev.Output.Data); err != nil {
			// Stop here: closing the stream kills the command rather than let it run unheard.
			s.Close()
			return sbtypes.ExecResult{}, fmt.Errorf("exec %s: write %s: %w (the command was killed)", s.ID, ev.Output.Stream, err)
		}
	}
}

// Wait reads the stream to its end, writing output to stdout and stderr (nil discards).
func (s *Stream) Wait(stdout, stderr io.Writer) (sbtypes.ExecResult, error) {
	defer s.Close()
	return s.copyTo(stdout, stderr)
}
