package mcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/runcode"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// Background processes (sandbox_exec with background: true): a command that outlives its
// call, such as a server, read with sandbox_process_output and ended with
// sandbox_process_kill, the session's end or its timeout. The agent keeps its output.

// backgroundOutputBytes caps each stream of a background process: what the agent forwards and
// keeps for sandbox_process_output.
const backgroundOutputBytes = runcode.DefaultOutputBytes

// processAgent is what background processes need of a session's agent (agent/client.Client).
type processAgent interface {
	StartProcess(ctx context.Context, req client.ProcessRequest, opts ...client.ExecOption) (client.Process, error)
	WriteStdin(ctx context.Context, id string, r io.Reader, closeAfter bool) error
	Output(ctx context.Context, id string, after uint64) ([]sandbox.OutputFrame, *sandbox.ExecResult, error)
	RemoveProcess(ctx context.Context, id string) error
}

// execOutput is sandbox_exec's result: the command's, or, in the background, its process id.
type execOutput struct {
	runcode.Result
	ProcessID string `json:"process_id,omitempty" jsonschema:"with background: the process to pass to sandbox_process_output and sandbox_process_kill; exit_code and the output are then not yet known"`
}

type processInput struct {
	SessionID string `json:"session_id" jsonschema:"the session from sandbox_create"`
	ProcessID string `json:"process_id" jsonschema:"the process_id sandbox_exec returned for a background command"`
}

type processOutput struct {
	ProcessID string `json:"process_id"`
	Running   bool   `json:"running" jsonschema:"the process is still running; exit_code is then absent"`
	ExitCode  *int   `json:"exit_code,omitempty" jsonschema:"the exit status once it has exited; 124 when killed at its timeout, 128+N when killed by signal N"`
	Stdout    string `json:"stdout" jsonschema:"output since the previous sandbox_process_output of this process"`
	Stderr    string `json:"stderr" jsonschema:"output since the previous sandbox_process_output of this process"`
	// Dropped: output the agent's buffer let go before it was read.
	Dropped  bool  `json:"dropped,omitempty" jsonschema:"some output was lost: it came faster than it was read, or past the cap of 1 MiB per stream"`
	CutBytes int64 `json:"cut_bytes,omitempty" jsonschema:"bytes left out of the middle of stdout and stderr to fit a model's context, each cut marked"`
	NotUTF8  bool  `json:"not_utf8,omitempty" jsonschema:"the output was not valid UTF-8 text: its invalid bytes appear as U+FFFD"`
}

type killOutput struct {
	ProcessID string `json:"process_id"`
	Killed    bool   `json:"killed"`
}

// hasProcesses reports whether the platform keeps background processes (the capability).
func (s *Server) hasProcesses() bool {
	return s.backend.Capabilities(s.ctx).Has(capability.BackgroundProcesses)
}

// registerProcesses offers the process tools where the platform has background processes.
func (s *Server) registerProcesses() {
	if !s.hasProcesses() {
		return
	}
	addTool(s, &sdk.Tool{
		Name:        "sandbox_process_output",
		Title:       "Read a background process's output",
		Description: "Returns what a command started with sandbox_exec background: true has printed since the previous call (without waiting for more), and its exit code once it has exited.",
		Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true},
	}, nil, s.processOutput)
	addTool(s, &sdk.Tool{
		Name:        "sandbox_process_kill",
		Title:       "Kill a background process",
		Description: "Kills a command started with sandbox_exec background: true, with everything it started. Killing one that has already exited or was killed succeeds.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: new(true), IdempotentHint: true},
	}, nil, s.processKill)
}

// startBackground starts in.Command as a background process of se.
func (s *Server) startBackground(ctx context.Context, se *session, in execInput, cwd string, timeout, cappedFrom int) (execOutput, string, error) {
	pa, ok := se.agent.(processAgent)
	if !s.hasProcesses() {
		return execOutput{}, "", fmt.Errorf("%w: background needs capability %s, which this platform lacks", sandbox.ErrUnsupported, capability.BackgroundProcesses)
	}
	if !ok {
		return execOutput{}, "", fmt.Errorf("%w: background: this platform's sandboxes cannot keep a process running between calls", sandbox.ErrUnsupported)
	}
	// Without a timeout of its own, it runs until the session ends; never past that.
	d := time.Duration(timeout) * time.Second
	if exp, err := time.Parse(time.RFC3339, se.info.ExpiresAt); err == nil {
		if left := time.Until(exp); in.TimeoutSeconds == 0 || d > left {
			d = left
		}
	}
	cappedFrom = 0
	if d < time.Second {
		return execOutput{}, "", fmt.Errorf("%w: background: the session ends in under a second", sandbox.ErrRefused)
	}
	p, err := pa.StartProcess(ctx, client.ProcessRequest{
		ExecRequest: sandbox.ExecRequest{Shell: in.Command, Cwd: cwd, Env: in.Env, Timeout: d,
			MaxStdout: backgroundOutputBytes, MaxStderr: backgroundOutputBytes},
		OpenStdin: in.Stdin != "",
	})
	if err != nil {
		return execOutput{}, "", fmt.Errorf("starting the command: %w", err)
	}
	if in.Stdin != "" {
		if err := pa.WriteStdin(ctx, p.ID, strings.NewReader(in.Stdin), true); err != nil && !errors.Is(err, sandbox.ErrConflict) {
			return execOutput{}, "", fmt.Errorf("writing stdin to process %s: %w", p.ID, err)
		}
	}
	se.mu.Lock()
	if se.read == nil {
		se.read = map[string]uint64{}
	}
	se.read[p.ID] = 0
	se.mu.Unlock()
	out := execOutput{Result: runcode.Result{SandboxID: se.info.SandboxID, Memory: se.info.Memory, TimeoutSeconds: int(d / time.Second), TimeoutCappedFrom: cappedFrom}, ProcessID: p.ID}
	text := fmt.Sprintf("Started process %s in the background; it runs until sandbox_process_kill, the session's end or %s from now.\n"+
		"Read its output with sandbox_process_output (session_id %q, process_id %q).", p.ID, d.Round(time.Second), se.info.SessionID, p.ID)
	return out, text, nil
}

func (s *Server) backgroundProcess(in processInput) (*session, processAgent, error) {
	se, err := s.lookup(in.SessionID)
	if err != nil {
		return nil, nil, err
	}
	if strings.TrimSpace(in.ProcessID) == "" {
		return nil, nil, fmt.Errorf("%w: process_id is empty: give the process_id sandbox_exec returned", sandbox.ErrInvalid)
	}
	se.mu.Lock()
	_, ok := se.read[in.ProcessID]
	se.mu.Unlock()
	if !ok {
		return nil, nil, fmt.Errorf("%w: no background process %q in session %s", sandbox.ErrNotFound, in.ProcessID, in.SessionID)
	}
	pa, _ := se.agent.(processAgent)
	return se, pa, nil
}

func (s *Server) processOutput(ctx context.Context, in processInput) (processOutput, string, error) {
	se, pa, err := s.backgroundProcess(in)
	if err != nil {
		return processOutput{}, "", err
	}
	se.mu.Lock()
	after := se.read[in.ProcessID]
	se.mu.Unlock()
	frames, exit, err := pa.Output(ctx, in.ProcessID, after)
	if errors.Is(err, sandbox.ErrNotFound) {
		return processOutput{}, "", fmt.Errorf("%w: process %s was killed with sandbox_process_kill", sandbox.ErrNotFound, in.ProcessID)
	}
	if err != nil {
		return processOutput{}, "", fmt.Errorf("reading the output of process %s: %w", in.ProcessID, err)
	}
	se.mu.Lock()
	carry := se.carry[in.ProcessID]
	se.mu.Unlock()
	stdout, stderr := carry[0], carry[1]
	out := processOutput{ProcessID: in.ProcessID, Running: exit == nil}
	last := after
	for _, f := range frames {
		if f.Seq != last+1 {
			out.Dropped = true
		}
		last = f.Seq
		if f.Stream == sandbox.Stderr {
			stderr = append(stderr, f.Data...)
		} else {
			stdout = append(stdout, f.Data...)
		}
	}
	// Output still arriving may end inside a character: its start waits for the next read.
	if exit == nil {
		n1, n2 := runcode.PartialTail(stdout), runcode.PartialTail(stderr)
		carry = [2][]byte{bytes.Clone(stdout[len(stdout)-n1:]), bytes.Clone(stderr[len(stderr)-n2:])}
		stdout, stderr = stdout[:len(stdout)-n1], stderr[:len(stderr)-n2]
	}
	se.mu.Lock()
	se.read[in.ProcessID] = last
	if se.carry == nil {
		se.carry = map[string][2][]byte{}
	}
	se.carry[in.ProcessID] = carry
	se.mu.Unlock()
	var cut1, cut2 int64
	var bad1, bad2 bool
	out.Stdout, cut1, bad1 = runcode.View(stdout, s.viewBytes())
	out.Stderr, cut2, bad2 = runcode.View(stderr, s.viewBytes())
	out.CutBytes, out.NotUTF8 = cut1+cut2, bad1 || bad2
	var b strings.Builder
	if exit != nil {
		code := exit.ExitCode
		switch {
		case exit.TimedOut:
			code = runcode.TimeoutExitCode
		default:
			code = wire.ShellExitCode(code, exit.Signal)
		}
		out.ExitCode = &code
		out.Dropped = out.Dropped || exit.Truncated
		fmt.Fprintf(&b, "Process %s has exited. Exit code: %d\n", in.ProcessID, code)
	} else {
		fmt.Fprintf(&b, "Process %s is running.\n", in.ProcessID)
	}
	res := runcode.Result{Stdout: out.Stdout, Stderr: out.Stderr, CutBytes: out.CutBytes, NotUTF8: out.NotUTF8}
	if body := strings.TrimPrefix(res.Text(), "Exit code: 0\n"); body != "" {
		b.WriteString(body)
	} else {
		b.WriteString("\n(no new output)\n")
	}
	if out.Dropped {
		b.WriteString("Some output was lost: it came faster than it was read, or past the cap of 1 MiB per stream.\n")
	}
	return out, b.String(), nil
}

func (s *Server) processKill(ctx context.Context, in processInput) (killOutput, string, error) {
	_, pa, err := s.backgroundProcess(in)
	if err != nil {
		return killOutput{}, "", err
	}
	if err := pa.RemoveProcess(ctx, in.ProcessID); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
		return killOutput{}, "", fmt.Errorf("killing process %s: %w", in.ProcessID, err)
	}
	return killOutput{ProcessID: in.ProcessID, Killed: true}, fmt.Sprintf("Killed process %s and everything it started.", in.ProcessID), nil
}
