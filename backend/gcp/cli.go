package gcp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// The launcher-exec path, for a hosting image our agent cannot run in (Options.NoAgent):
// every command is one `sandbox exec`, whose own exit status is 0 or 1 only (documented), so a
// wrapper prints the command's status after its output behind a marker unique to the call.
// What this path cannot do is a no in its set (PublishedNoAgent).

// noAgentUnsupported is what the launcher-exec path adds to the set's noes, and why.
var noAgentUnsupported = map[capability.Name]string{
	capability.Files:               "without our agent in the sandbox (gcp.noAgent) the launcher's exec is the only way in, and it has no file operations",
	capability.PTY:                 "without our agent in the sandbox (gcp.noAgent) the launcher's exec gives a command no terminal airlock can size",
	capability.BackgroundProcesses: "without our agent in the sandbox (gcp.noAgent) a command lives only as long as its launcher exec",
}

// PublishedNoAgent is the set of the launcher-exec path: Published with what needs our agent
// turned no.
func PublishedNoAgent() capability.Set {
	s := Published()
	for n, why := range noAgentUnsupported {
		s.Entries[n] = capability.Status{Reason: why}
	}
	return s
}

// cliDir holds the launcher-exec path's pid files inside a sandbox (its own /tmp).
const cliDir = "/tmp/.airlock-cli"

// cliWrapper runs one command and prints its status: $1 the marker, $2 the pid file, $3 the
// working directory, then the command (env assignments first). setsid -w makes the command's
// shell the leader of a process group of its own, whose id it writes to the pid file, so that
// a deadline can kill the group (not a setsid descendant: the set says so).
const cliWrapper = `m=$1; pf=$2; shift 2; mkdir -p ` + cliDir + ` && /usr/bin/setsid -w /bin/sh -c 'echo $$ > "$0"; cd "$1" || exit 126; shift; exec /usr/bin/env "$@"' "$pf" "$@"; c=$?; rm -f "$pf"; printf '%s %d\n' "$m" "$c"`

// cliAgent is sandbox.Agent over the launcher's exec.
type cliAgent struct {
	b       *Backend
	name    string
	workdir string
	env     map[string]string
}

var _ sandbox.Agent = (*cliAgent)(nil)

func (a *cliAgent) Close() error { return nil }

func (a *cliAgent) Health(ctx context.Context) (sandbox.Health, error) {
	argv, err := argvProbe(a.name)
	if err != nil {
		return sandbox.Health{}, err
	}
	if out, err := a.b.run(ctx, argv); err != nil {
		return sandbox.Health{}, fmt.Errorf("%w: sandbox %s: %v%s", sandbox.ErrUnreachable, a.name, err, out)
	}
	return sandbox.Health{Version: "launcher", KillScope: "process-group"}, nil
}

// Exec runs req through one launcher exec and recovers the command's exit status.
func (a *cliAgent) Exec(ctx context.Context, req sandbox.ExecRequest, stdout, stderr io.Writer) (sandbox.ExecResult, error) {
	if (len(req.Argv) == 0) == (req.Shell == "") {
		return sandbox.ExecResult{}, fmt.Errorf("%w: exactly one of argv and shell", sandbox.ErrInvalid)
	}
	if req.Timeout <= 0 || req.Timeout > maxTimeout {
		return sandbox.ExecResult{}, fmt.Errorf("%w: timeout %v: must be positive and at most %v", sandbox.ErrInvalid, req.Timeout, maxTimeout)
	}
	if req.TTY {
		return sandbox.ExecResult{}, fmt.Errorf("%w: tty: %s", sandbox.ErrUnsupported, noAgentUnsupported[capability.PTY])
	}
	var rnd [12]byte
	_, _ = rand.Read(rnd[:])
	id := hex.EncodeToString(rnd[:])
	marker := "\x1eairlock-exit-" + id
	cwd := req.Cwd
	if cwd == "" {
		cwd = a.workdir
	}
	env := maps.Clone(a.env)
	maps.Copy(env, req.Env)
	command := []string{"/bin/sh", "-c", cliWrapper, "sh", marker, cliDir + "/" + id + ".pid", cwd}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		command = append(command, k+"="+env[k])
	}
	if req.Shell != "" {
		command = append(command, "/bin/sh", "-c", req.Shell)
	} else {
		command = append(command, req.Argv...)
	}
	argv, err := argvExec(a.name, req.Stdin != nil, command)
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	start := time.Now()
	runCtx, cancel := context.WithTimeout(ctx, req.Timeout)
	defer cancel()
	cmd := exec.Command(a.b.launcher, argv...)
	cmd.Env = a.b.launcherEnv
	cmd.Stdin = req.Stdin
	out := &markerWriter{w: capped(stdout, req.MaxStdout), marker: []byte(marker)}
	errw := capped(stderr, req.MaxStderr)
	cmd.Stdout, cmd.Stderr = out, errw
	if err := cmd.Start(); err != nil {
		return sandbox.ExecResult{}, fmt.Errorf("%w: start the launcher: %v", sandbox.ErrUnreachable, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var waitErr error
	timedOut := false
	select {
	case waitErr = <-done:
	case <-runCtx.Done():
		timedOut = ctx.Err() == nil
		// Kill the command's process group inside, then the launcher's exec here.
		kctx, kcancel := context.WithTimeout(context.WithoutCancel(ctx), controlTimeout)
		if kill, err := argvExec(a.name, false, []string{"/bin/sh", "-c", `[ -s "$1" ] && kill -KILL -- "-$(cat "$1")"; true`, "sh", cliDir + "/" + id + ".pid"}); err == nil {
			_, _ = a.b.run(kctx, kill)
		}
		kcancel()
		_ = cmd.Process.Kill()
		waitErr = <-done
	}
	res := sandbox.ExecResult{Duration: time.Since(start), Truncated: out.truncated() || errw.truncated()}
	if timedOut || ctx.Err() != nil {
		out.flush() // what the command wrote before it was killed: no status follows
	}
	if timedOut {
		res.TimedOut, res.ExitCode = true, 124
		return res, nil
	}
	if ctx.Err() != nil {
		return res, fmt.Errorf("%w: exec in %s: %v", sandbox.ErrOutcomeUnknown, a.name, ctx.Err())
	}
	code, ok := out.finish()
	if !ok {
		return res, fmt.Errorf("%w: the launcher's exec in %s ended without the command's exit status (launcher: %v)", sandbox.ErrOutcomeUnknown, a.name, waitErr)
	}
	res.ExitCode = code
	return res, nil
}

// markerWriter passes a command's stdout on, holding back what could be the start of the
// marker line, and reads the status after the marker at the end.
type markerWriter struct {
	w      *capWriter
	marker []byte
	held   []byte
}

func (m *markerWriter) Write(p []byte) (int, error) {
	m.held = append(m.held, p...)
	// Anything before the last possible start of "marker <status>\n" is output.
	keep := len(m.marker) + 16
	if len(m.held) > keep {
		n := len(m.held) - keep
		if _, err := m.w.Write(m.held[:n]); err != nil {
			return 0, err
		}
		m.held = append(m.held[:0], m.held[n:]...)
	}
	return len(p), nil
}

// flush writes what was held back, for a command that was killed before its status.
func (m *markerWriter) flush() {
	_, _ = m.w.Write(m.held)
	m.held = nil
}

// finish writes the output before the marker and returns the status after it.
func (m *markerWriter) finish() (int, bool) {
	i := bytes.LastIndex(m.held, m.marker)
	if i < 0 {
		_, _ = m.w.Write(m.held)
		return 0, false
	}
	_, _ = m.w.Write(m.held[:i])
	rest := bytes.TrimSpace(m.held[i+len(m.marker):])
	code, err := strconv.Atoi(string(rest))
	return code, err == nil
}

func (m *markerWriter) truncated() bool { return m.w.truncated() }

// capWriter passes at most max bytes on (max <= 0: every agent's default, wire.DefaultOutputCap).
type capWriter struct {
	mu   sync.Mutex
	w    io.Writer
	left int64
	cut  bool
}

func capped(w io.Writer, max int64) *capWriter {
	if max <= 0 {
		max = wire.DefaultOutputCap
	}
	if w == nil {
		w = io.Discard
	}
	return &capWriter{w: w, left: max}
}

func (c *capWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(p)
	if int64(len(p)) > c.left {
		p, c.cut = p[:c.left], true
	}
	c.left -= int64(len(p))
	if len(p) > 0 {
		if _, err := c.w.Write(p); err != nil {
			return 0, err
		}
	}
	return n, nil
}

func (c *capWriter) truncated() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cut
}

// errNoFiles refuses every file operation of the launcher-exec path.
var errNoFiles = errors.New(noAgentUnsupported[capability.Files])

func (a *cliAgent) filesRefused(op string) error {
	return fmt.Errorf("%w: %s: %v", sandbox.ErrUnsupported, op, errNoFiles)
}

func (a *cliAgent) ReadFile(context.Context, string, int64, int64) (io.ReadCloser, error) {
	return nil, a.filesRefused("read file")
}
func (a *cliAgent) WriteFile(context.Context, string, io.Reader, uint32) error {
	return a.filesRefused("write file")
}
func (a *cliAgent) Mkdir(context.Context, string, uint32) error { return a.filesRefused("mkdir") }
func (a *cliAgent) List(context.Context, string) ([]sandbox.FileInfo, error) {
	return nil, a.filesRefused("list")
}
func (a *cliAgent) Stat(context.Context, string) (sandbox.FileInfo, error) {
	return sandbox.FileInfo{}, a.filesRefused("stat")
}
func (a *cliAgent) Remove(context.Context, string, bool) error { return a.filesRefused("remove") }
func (a *cliAgent) Rename(context.Context, string, string) error {
	return a.filesRefused("rename")
}
