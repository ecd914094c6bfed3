// Package api is the daemon's HTTP wire vocabulary, shared by the server and the Go SDK: bodies, stream events and the one error table.
package api

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
	"github.com/airlock-sandbox/airlock/spec"
	"github.com/airlock-sandbox/airlock/token"
)

// Version is the path prefix of every endpoint.
const Version = "/v1"

// Media types.
const (
	ContentTypeJSON   = "application/json"
	ContentTypeNDJSON = "application/x-ndjson"
	ContentTypeBytes  = "application/octet-stream"
)

// RequestIDHeader carries the request id in both directions.
const RequestIDHeader = "X-Request-Id"

// DefaultSocket is where `airlock serve` listens unless told otherwise.
const DefaultSocket = "/run/airlock/airlock.sock"

// CreateRequest is the body of POST /v1/sandboxes when it names a template. Any other body is
// a sandbox declaration (JSON or YAML), taken as is.
type CreateRequest struct {
	Template string `json:"template"`
	// Labels are merged over the template's labels.
	Labels map[string]string `json:"labels,omitempty"`
}

// SandboxList is the answer of GET /v1/sandboxes.
type SandboxList struct {
	Sandboxes []*sandbox.Session `json:"sandboxes"`
}

// ExecRequest is the JSON header of POST /v1/sandboxes/{id}/exec and the body of
// POST /v1/sandboxes/{id}/processes.
type ExecRequest struct {
	Argv  []string          `json:"argv,omitempty"`
	Shell string            `json:"shell,omitempty"`
	Cwd   string            `json:"cwd,omitempty"`
	Env   map[string]string `json:"env,omitempty"`
	// TimeoutMs is the command's deadline; 0 means DefaultExecTimeout.
	TimeoutMs int64 `json:"timeoutMs,omitempty"`
	// Stdin, on exec, says the request body continues after the JSON header and one '\n' with
	// the command's stdin until the body ends; false means stdin is /dev/null. On a process,
	// it keeps stdin open for POST .../stdin.
	Stdin     bool  `json:"stdin,omitempty"`
	MaxStdout int64 `json:"maxStdout,omitempty"`
	MaxStderr int64 `json:"maxStderr,omitempty"`
	TTY       bool  `json:"tty,omitempty"`
	Rows      int   `json:"rows,omitempty"` // tty only
	Cols      int   `json:"cols,omitempty"` // tty only
}

// DefaultExecTimeout applies when an exec or process request gives no timeout.
const DefaultExecTimeout = 60 * time.Second

// Event is one NDJSON line of an output stream (exec, process output). Exactly one of
// (Stream, Data), Exit or Error is set; Exit and Error are terminal. A stream that ends
// without a terminal event has an unknown outcome.
type Event struct {
	// Seq is one sequence across stdout and stderr, starting at 1.
	Seq    uint64         `json:"seq,omitempty"`
	Stream sandbox.Stream `json:"stream,omitempty"`
	// Data is base64 in JSON (output is bytes, not necessarily text).
	Data  []byte              `json:"data,omitempty"`
	Exit  *sandbox.ExecResult `json:"exit,omitempty"`
	Error *Error              `json:"error,omitempty"`
}

// Process describes a background process.
type Process struct {
	ID        string              `json:"id"`
	Argv      []string            `json:"argv"`
	TTY       bool                `json:"tty,omitempty"`
	Running   bool                `json:"running"`
	StartedAt time.Time           `json:"startedAt"`
	Exit      *sandbox.ExecResult `json:"exit,omitempty"`
}

// ProcessList is the answer of GET /v1/sandboxes/{id}/processes, oldest first.
type ProcessList struct {
	Processes []Process `json:"processes"`
}

// FileList is the answer of GET /v1/sandboxes/{id}/files/list, sorted by name.
type FileList struct {
	Files []sandbox.FileInfo `json:"files"`
}

// MkdirRequest is the body of POST /v1/sandboxes/{id}/files/mkdir.
type MkdirRequest struct {
	Path string `json:"path"`
	// Mode is the permission bits of created directories; 0 means 0755.
	Mode uint32 `json:"mode,omitempty"`
}

// SignalRequest is the body of POST .../processes/{pid}/signal.
type SignalRequest struct {
	Signal string `json:"signal"`
}

// ResizeRequest is the body of POST .../processes/{pid}/resize.
type ResizeRequest struct {
	Rows int `json:"rows"`
	Cols int `json:"cols"`
}

// TokenRequest is the body of POST /v1/sandboxes/{id}/tokens.
type TokenRequest struct {
	Class token.Class `json:"class"`
	// TTLSeconds is the token's lifetime; 0 means the daemon's default.
	TTLSeconds int64 `json:"ttlSeconds,omitempty"`
}

// TokenResponse is a delegated capability token, usable as `Authorization: Bearer <token>`.
type TokenResponse struct {
	Token     string      `json:"token"`
	Session   string      `json:"session"`
	Class     token.Class `json:"class"`
	ExpiresAt time.Time   `json:"expiresAt"`
}

// EgressPolicy is the answer of PUT /v1/sandboxes/{id}/egress (whose body is a spec.Egress):
// the policy now in force for new connections and DNS queries.
type EgressPolicy struct {
	Session string      `json:"session"`
	Egress  spec.Egress `json:"egress"`
}

// EgressCounters is the answer of GET /v1/sandboxes/{id}/egress/counters: the sandbox's egress
// decisions since it was attached by the daemon's process.
type EgressCounters struct {
	ConnsAllowed  uint64 `json:"connsAllowed"`  // TCP connections the policy allowed
	ConnsDenied   uint64 `json:"connsDenied"`   // TCP connections (or later requests on one) refused
	DialFailures  uint64 `json:"dialFailures"`  // allowed connections whose destination was unreachable
	BytesSent     uint64 `json:"bytesSent"`     // sandbox → destination
	BytesReceived uint64 `json:"bytesReceived"` // destination → sandbox
	DNSAllowed    uint64 `json:"dnsAllowed"`    // queries answered from upstream
	DNSDenied     uint64 `json:"dnsDenied"`     // queries refused or stripped of non-public answers
	// PacketsDropped counts packets the kernel rules dropped (UDP other than DNS, other protocols).
	PacketsDropped uint64 `json:"packetsDropped"`
}

// PreviewRequest is the body of POST /v1/sandboxes/{id}/previews.
type PreviewRequest struct {
	// Port is one of the sandbox's declared previewPorts.
	Port int `json:"port"`
	// TTLSeconds is the preview token's lifetime; 0 means the backend's default (1 hour on
	// local). It never outlives the sandbox.
	TTLSeconds int64 `json:"ttlSeconds,omitempty"`
}

// Preview is the answer of POST /v1/sandboxes/{id}/previews: the port's URL and its token.
type Preview = sandbox.PreviewInfo

// SnapshotRequest is the body of POST /v1/sandboxes/{id}/snapshots.
type SnapshotRequest struct {
	// Name is 1 to 64 letters, digits, '_' and '-', unique on the daemon; a new sandbox
	// starts from it with image: {snapshot: NAME}.
	Name string `json:"name"`
}

// Snapshot is a stored snapshot: the answer of POST /v1/sandboxes/{id}/snapshots.
type Snapshot = sandbox.SnapshotInfo

// SnapshotList is the answer of GET /v1/snapshots, oldest first.
type SnapshotList struct {
	Snapshots []Snapshot `json:"snapshots"`
}

// ForkRequest is the body of POST /v1/sandboxes/{id}/fork; the answer is a SandboxList of
// the new sandboxes.
type ForkRequest struct {
	// Count is how many sandboxes to start from the sandbox's files, at least 1.
	Count int `json:"count"`
}

// Capabilities is the answer of GET /v1/capabilities.
type Capabilities = capability.Set

// Health is the answer of GET /healthz.
type Health struct {
	Status   string              `json:"status"`
	Platform capability.Platform `json:"platform"`
}

// Problem is one field-level reason a request was refused: a validation problem (code
// "invalid") or a capability or bound refusal (code "refused").
type Problem struct {
	SandboxID  string          `json:"sandboxId,omitempty"`
	Field      string          `json:"field"`
	Value      string          `json:"value,omitempty"`
	Capability capability.Name `json:"capability,omitempty"`
	Rule       string          `json:"rule"`
	Message    string          `json:"message"`
}

// Error is every error body, and the payload of a terminal error event.
type Error struct {
	Code string `json:"code"`
	// Reason refines the code, e.g. the token refusal ("expired", "wrongSession").
	Reason    string    `json:"reason,omitempty"`
	Message   string    `json:"message"`
	RequestID string    `json:"requestId,omitempty"`
	Problems  []Problem `json:"problems,omitempty"`
}

// Error codes beyond the sandbox classes.
const (
	CodeInternal = sbtypes.CodeInternal
	CodeCanceled = "canceled"
)

// CodeOf returns the code and HTTP status for err: its sandbox class's (the one table,
// sbtypes.Codes), a context deadline as deadline_exceeded, a cancelled request as canceled
// (499, nginx's "client closed request": nobody reads it, but logs and metrics do).
func CodeOf(err error) (code string, status int) {
	if code, status = sbtypes.CodeOf(err); code != sbtypes.CodeInternal {
		return code, status
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return sbtypes.CodeOf(sandbox.ErrDeadlineExceeded)
	case errors.Is(err, context.Canceled):
		return CodeCanceled, 499
	}
	return CodeInternal, http.StatusInternalServerError
}

// ClassOf returns the sandbox error class of a code (context.Canceled for "canceled"), or nil
// for an unknown code.
func ClassOf(code string) error {
	if code == CodeCanceled {
		return context.Canceled
	}
	return sbtypes.ClassOf(code)
}

// CodeForStatus classifies an answer without an error body (a proxy's, a 405).
func CodeForStatus(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusMethodNotAllowed, http.StatusLengthRequired:
		return "invalid"
	case http.StatusInternalServerError:
		// A bare 500 from something between us: whether the request took effect is unknown.
		return "outcome_unknown"
	}
	for _, c := range sbtypes.Codes {
		if c.Status == status {
			return c.Code // 504: deadline_exceeded, the first in the table
		}
	}
	return CodeInternal
}
