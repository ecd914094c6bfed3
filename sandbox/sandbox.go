// Package sandbox holds the Backend contract every platform implements and its domain types.
package sandbox

import (
	"context"
	"time"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
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

// The agent-facing types live in sbtypes (no heavy imports, so the agent binary stays lean);
// these aliases keep them sandbox.X for everyone else.
type (
	// Agent is what a caller can do inside a sandbox; agent/client.Client implements it.
	Agent = sbtypes.Agent
	// ExecRequest is one command. Exactly one of Argv or Shell is set.
	ExecRequest = sbtypes.ExecRequest
	// ExecResult is the terminal frame of an exec.
	ExecResult = sbtypes.ExecResult
	// Stream names an output stream in a frame.
	Stream = sbtypes.Stream
	// OutputFrame is one chunk of output; Seq is one sequence across both streams.
	OutputFrame = sbtypes.OutputFrame
	// FileInfo describes one file inside a sandbox.
	FileInfo = sbtypes.FileInfo
	// Health is what an agent reports about itself.
	Health = sbtypes.Health
)

const (
	Stdout = sbtypes.Stdout
	Stderr = sbtypes.Stderr
)
