// Package wire holds the agent protocol's shared vocabulary: request and response types, output frames and the error-code table.
package wire

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

// ProtocolVersion is the major version in every path ("/v1/...") and in the health answer.
const ProtocolVersion = 1

// Frame types on an output stream (exec, process attach).
const (
	FrameStdout byte = 1
	FrameStderr byte = 2
	FrameExit   byte = 3 // terminal: JSON Exit
	FrameError  byte = 4 // terminal: JSON Error
)

// FrameHeaderSize is type (1 byte) + payload length (4 bytes, big endian).
const FrameHeaderSize = 5

// MaxFramePayload bounds one frame; readers refuse anything larger so a corrupt or hostile
// stream cannot make them allocate without bound.
const MaxFramePayload = 1 << 20

// SeqSize prefixes the payload of stdout/stderr frames: one sequence across both streams.
const SeqSize = 8

// HeaderAuthorization carries "Bearer <token>" where Authorization cannot: a Kubernetes API
// server that proxies a request to a pod or Service (its pods/proxy and services/proxy
// subresources) authenticates the caller with Authorization and deletes it before proxying
// (k8s.io/apiserver's WithAuthentication). The agent and the broker read it when Authorization
// is absent.
const HeaderAuthorization = "X-Airlock-Authorization"

// ContentTypeFrames is the media type of a frame stream.
const ContentTypeFrames = "application/vnd.airlock.frames.v1"

// ExecRequest is the JSON header of POST /v1/exec and the body of POST /v1/processes.
type ExecRequest struct {
	Argv      []string          `json:"argv,omitempty"`
	Shell     string            `json:"shell,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	TimeoutMs int64             `json:"timeoutMs"`
	// Stdin: on exec, the request body continues after the JSON header with stdin bytes until
	// the body ends; on a background process, stdin stays open for POST .../stdin. False means
	// the command's stdin is /dev/null.
	Stdin     bool  `json:"stdin,omitempty"`
	MaxStdout int64 `json:"maxStdout,omitempty"`
	MaxStderr int64 `json:"maxStderr,omitempty"`
	TTY       bool  `json:"tty,omitempty"`
	Rows      int   `json:"rows,omitempty"` // tty only; default 24
	Cols      int   `json:"cols,omitempty"` // tty only; default 80
	// ExitFirst (background processes only; an exec refuses it) is for a caller that discards
	// the sandbox after this process: the exit is reported once the main process has exited
	// and the output has ended, with the processes it left that hold its output sent SIGKILL
	// (so the output ends where it would have) but not yet confirmed gone, and the others
	// killed only after the report; the agent empties and removes the process's cgroup after
	// the report instead of before it.
	ExitFirst bool `json:"exitFirst,omitempty"`
}

// HandoffRequest is the JSON header of POST /v1/processes/{id}/handoff: work handed to a
// background process that waits for it on its stdin (a pre-started interpreter), with the
// work's deadline and output caps, which the agent keeps as an exec's. The request body
// continues after the header with the bytes for the process's stdin, closed when the body
// ends unless More; the answer is a frame stream, as an exec's, of the output from the
// handoff on.
type HandoffRequest struct {
	// TimeoutMs is the work's deadline from the handoff: required, > 0 and at most the
	// agent's maximum. It replaces the process's own.
	TimeoutMs int64 `json:"timeoutMs"`
	// MaxStdout and MaxStderr cap each stream from the handoff on; 0 = the agent's default.
	MaxStdout int64 `json:"maxStdout,omitempty"`
	MaxStderr int64 `json:"maxStderr,omitempty"`
	// More keeps stdin open after the body, for POST /v1/processes/{id}/stdin to append the
	// rest (close=true ends it): stdin that streams, sent once the agent has taken the work.
	More bool `json:"more,omitempty"`
}

// Exit is the payload of the terminal exit frame and the answer of GET /v1/processes/{id}/wait.
type Exit struct {
	ExitCode   int    `json:"exitCode"`
	Signal     string `json:"signal,omitempty"`
	TimedOut   bool   `json:"timedOut,omitempty"`
	Cancelled  bool   `json:"cancelled,omitempty"`
	OOMKilled  bool   `json:"oomKilled,omitempty"`
	Truncated  bool   `json:"truncated,omitempty"`
	DurationMs int64  `json:"durationMs"`
}

// Health is the answer of GET /v1/health: sbtypes.Health plus what only an agent knows.
type Health struct {
	sbtypes.Health
	// IdleTimeoutMs is the agent's idle timeout; absent when it has none.
	IdleTimeoutMs int64 `json:"idleTimeoutMs,omitempty"`
	// IdleRemainingMs is how long the agent stays up if nothing happens from now on (the whole
	// timeout while anything is active); absent when there is no idle timeout (or none left).
	IdleRemainingMs int64 `json:"idleRemainingMs,omitempty"`
}

// Error is every error body (HTTP error responses and terminal error frames).
type Error struct {
	Code    string `json:"code"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message"`
}

// Process describes a background process.
type Process struct {
	ID        string   `json:"id"`
	Argv      []string `json:"argv"`
	TTY       bool     `json:"tty,omitempty"`
	State     string   `json:"state"` // running, exited
	StartedAt string   `json:"startedAt"`
	Exit      *Exit    `json:"exit,omitempty"`
}

// Process states.
const (
	StateRunning = "running"
	StateExited  = "exited"
)

// SignalRequest is the body of POST /v1/processes/{id}/signal.
type SignalRequest struct {
	Signal string `json:"signal"` // e.g. "SIGTERM", "TERM", "KILL"
}

// ResizeRequest is the body of POST /v1/processes/{id}/resize.
type ResizeRequest struct {
	Rows int `json:"rows"`
	Cols int `json:"cols"`
}

// MkdirRequest is the body of POST /v1/files/mkdir.
type MkdirRequest struct {
	Path string `json:"path"`
	Mode uint32 `json:"mode,omitempty"` // default 0755
}

// RemoveRequest is the body of POST /v1/files/remove.
type RemoveRequest struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive,omitempty"`
}

// RenameRequest is the body of POST /v1/files/rename.
type RenameRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// CodeInternal is an error that matches no sandbox class.
const CodeInternal = sbtypes.CodeInternal

// CodeOf returns the wire code and HTTP status for err: the one table, sbtypes.Codes.
func CodeOf(err error) (string, int) { return sbtypes.CodeOf(err) }

// ErrorOf returns the sandbox error class for a wire code, or nil for an unknown code.
func ErrorOf(code string) error { return sbtypes.ClassOf(code) }

// WriteFrame writes one frame. For stdout/stderr frames the caller puts the sequence number
// first in payload (see AppendOutput).
func WriteFrame(w io.Writer, typ byte, payload []byte) error {
	if len(payload) > MaxFramePayload {
		return fmt.Errorf("frame payload %d bytes exceeds %d", len(payload), MaxFramePayload)
	}
	var h [FrameHeaderSize]byte
	h[0] = typ
	binary.BigEndian.PutUint32(h[1:], uint32(len(payload)))
	if _, err := w.Write(h[:]); err != nil {
		return err
	}
	_, err := w.Write(payload)
	return err
}

// AppendOutput builds an output frame (header, seq, data) into buf.
func AppendOutput(buf []byte, typ byte, seq uint64, data []byte) []byte {
	buf = append(buf, typ)
	buf = binary.BigEndian.AppendUint32(buf, uint32(SeqSize+len(data)))
	buf = binary.BigEndian.AppendUint64(buf, seq)
	return append(buf, data...)
}

// WriteJSONFrame writes a terminal frame with a JSON payload.
func WriteJSONFrame(w io.Writer, typ byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return WriteFrame(w, typ, b)
}

// Frame is one decoded frame.
type Frame struct {
	Type    byte
	Seq     uint64 // stdout/stderr only
	Payload []byte // data for stdout/stderr (without seq), JSON otherwise
}

// ErrBadFrame marks a stream that is not a valid frame sequence.
var ErrBadFrame = errors.New("bad frame")

// ReadFrame reads one frame; io.EOF only when the stream ends cleanly between frames.
func ReadFrame(r io.Reader, buf []byte) (Frame, []byte, error) {
	var h [FrameHeaderSize]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		if err == io.EOF {
			return Frame{}, buf, io.EOF
		}
		return Frame{}, buf, fmt.Errorf("%w: header: %w", ErrBadFrame, err)
	}
	n := binary.BigEndian.Uint32(h[1:])
	if n > MaxFramePayload {
		return Frame{}, buf, fmt.Errorf("%w: payload %d bytes exceeds %d", ErrBadFrame, n, MaxFramePayload)
	}
	if cap(buf) < int(n) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		return Frame{}, buf, fmt.Errorf("%w: payload: %w", ErrBadFrame, err)
	}
	f := Frame{Type: h[0]}
	switch f.Type {
	case FrameStdout, FrameStderr:
		if n < SeqSize {
			return Frame{}, buf, fmt.Errorf("%w: output frame of %d bytes has no sequence number", ErrBadFrame, n)
		}
		f.Seq = binary.BigEndian.Uint64(buf[:SeqSize])
		f.Payload = buf[SeqSize:]
	case FrameExit, FrameError:
		f.Payload = buf
	default:
		return Frame{}, buf, fmt.Errorf("%w: unknown frame type %d", ErrBadFrame, f.Type)
	}
	return f, buf, nil
}
