package sbtypes

import (
	"context"
	"io"
	"time"
)

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
	// KillScope says how this agent enforces exec kill (one of the KillScope constants) so a
	// caller knows what survives a deadline.
	KillScope string `json:"killScope"`
}

// Kill scopes an agent reports (Health.KillScope).
const (
	KillScopeCgroupV1  = "cgroup-v1"
	KillScopeCgroupV2  = "cgroup-v2"
	KillScopeSubreaper = "subreaper"     // a reaper per exec kills every descendant
	KillScopePgrp      = "process-group" // a setsid'd descendant escapes it
)

// KillsWholeTree reports whether an exec's deadline, cancel and end reach every process it
// started, setsid'd and double-forked ones included.
func (h Health) KillsWholeTree() bool {
	switch h.KillScope {
	case KillScopeCgroupV1, KillScopeCgroupV2, KillScopeSubreaper:
		return true
	}
	return false
}
