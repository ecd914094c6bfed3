// Package sandbox holds the Backend contract every platform implements and its domain types.
package sandbox

import (
	"context"
	"io"
	"time"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/spec"
)

// Backend creates, finds, reaches and destroys sandboxes on one platform. Exec and file
// semantics are not here: they live in the agent, reached through Connect.
type Backend interface {
	Platform() capability.Platform
	// Capabilities reports what this backend enforces on this host right now.
	Capabilities(ctx context.Context) capability.Set
	// Create starts a sandbox from a validated, defaulted declaration and returns only once
	// its agent answers.
	Create(ctx context.Context, decl spec.Sandbox) (*Session, error)
	// Get returns a live session by id, ErrNotFound if absent.
	Get(ctx context.Context, sessionID string) (*Session, error)
	List(ctx context.Context) ([]*Session, error)
	// Connect returns a client for the session's agent, authorised for the operation class.
	Connect(ctx context.Context, sessionID string) (Agent, error)
	// Terminate destroys the sandbox and everything it made. It succeeds only once the
	// sandbox is confirmed absent, and is idempotent for an absent session.
	Terminate(ctx context.Context, sessionID string) error
}

// Pauser is implemented by backends with the suspendResume capability.
type Pauser interface {
	Pause(ctx context.Context, sessionID string) error
	Resume(ctx context.Context, sessionID string) error
}

// State is a session's lifecycle state.
type State string

const (
	StateRunning    State = "running"
	StatePaused     State = "paused"
	StateTerminated State = "terminated"
)

// Session is one live sandbox.
type Session struct {
	ID         string            `json:"id"`
	SandboxID  string            `json:"sandboxId"`
	Platform   string            `json:"platform"`
	State      State             `json:"state"`
	Generation uint64            `json:"generation"`
	CreatedAt  time.Time         `json:"createdAt"`
	ExpiresAt  time.Time         `json:"expiresAt,omitzero"`
	Labels     map[string]string `json:"labels,omitempty"`
	Spec       spec.Sandbox      `json:"spec"`
}

// Agent is what a caller can do inside a sandbox; agent/client.Client implements it.
type Agent interface {
	Health(ctx context.Context) (Health, error)
	// Exec runs a command to completion, streaming its output to stdout and stderr as it is
	// produced. The error is nil whenever a terminal frame arrived, whatever the exit code.
	Exec(ctx context.Context, req ExecRequest, stdout, stderr io.Writer) (ExecResult, error)
	ReadFile(ctx context.Context, path string, offset, length int64) (io.ReadCloser, error)
	WriteFile(ctx context.Context, path string, r io.Reader, mode uint32) error
	Mkdir(ctx context.Context, path string, mode uint32) error
	List(ctx context.Context, path string) ([]FileInfo, error)
	Stat(ctx context.Context, path string) (FileInfo, error)
	Remove(ctx context.Context, path string, recursive bool) error
	Rename(ctx context.Context, from, to string) error
	Close() error
}

// ExecRequest is one command. Exactly one of Argv or Shell is set.
type ExecRequest struct {
	Argv  []string          `json:"argv,omitempty"`
	Shell string            `json:"shell,omitempty"` // run with /bin/sh -c
	Cwd   string            `json:"cwd,omitempty"`
	Env   map[string]string `json:"env,omitempty"`
	// Timeout is required and bounded by the agent's maximum.
	Timeout time.Duration `json:"timeout"`
	// Stdin, when non-nil, is streamed to the command; nil means stdin is closed.
	Stdin io.Reader `json:"-"`
	// MaxStdout and MaxStderr cap each stream in bytes; 0 means the agent's default.
	MaxStdout int64 `json:"maxStdout,omitempty"`
	MaxStderr int64 `json:"maxStderr,omitempty"`
	TTY       bool  `json:"tty,omitempty"`
}

// ExecResult is the terminal frame of an exec.
type ExecResult struct {
	ExitCode  int           `json:"exitCode"`
	Signal    string        `json:"signal,omitempty"`
	TimedOut  bool          `json:"timedOut,omitempty"`
	OOMKilled bool          `json:"oomKilled,omitempty"`
	Truncated bool          `json:"truncated,omitempty"`
	Duration  time.Duration `json:"duration"`
}

// Stream names an output stream in a frame.
type Stream string

const (
	Stdout Stream = "stdout"
	Stderr Stream = "stderr"
)

// OutputFrame is one chunk of output; Seq is one sequence across both streams.
type OutputFrame struct {
	Seq    uint64 `json:"seq"`
	Stream Stream `json:"stream"`
	Data   []byte `json:"data"`
}

// FileInfo describes one file inside a sandbox.
type FileInfo struct {
	Name    string    `json:"name"`
	Path    string    `json:"path"`
	Size    int64     `json:"size"`
	Mode    uint32    `json:"mode"` // permission bits
	Type    string    `json:"type"` // file, dir, symlink, other
	ModTime time.Time `json:"modTime"`
	Target  string    `json:"target,omitempty"` // symlink target
}

// Health is what an agent reports about itself.
type Health struct {
	Version         string          `json:"version"`
	ProtocolVersion int             `json:"protocolVersion"`
	SandboxID       string          `json:"sandboxId"`
	Features        map[string]bool `json:"features"`
	// Guarantees says how this agent enforces exec kill ("cgroup-v1", "cgroup-v2", "pidns",
	// "process-group") so a caller knows what survives a deadline.
	KillScope string `json:"killScope"`
}
