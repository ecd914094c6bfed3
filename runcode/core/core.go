// Package core runs one request in a sandbox through its agent: run_code's semantics without a backend, spec or plan.
package core

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

// Language is a canonical language name.
type Language string

const (
	Python Language = "python"
	Node   Language = "node"
	Bash   Language = "bash"
)

// Limits of one run.
const (
	DefaultTimeoutSeconds = 30
	MaxTimeoutSeconds     = 300
	// MaxCodeBytes bounds the code itself; larger programs belong in Files, which it does not
	// bound (the sandbox's disk does).
	MaxCodeBytes = 1 << 20
	// DefaultOutputBytes caps each of stdout and stderr.
	DefaultOutputBytes = 1 << 20
	// ClaimMargin is how much lifetime a claimed sandbox (a pool's, a parked spare) must have
	// beyond the run's timeout.
	ClaimMargin = 5 * time.Second
	// terminateTimeout bounds the cleanup that runs even after the caller's ctx ended.
	terminateTimeout = 30 * time.Second
)

// runtime is how one language is run: the file the code goes into and the command.
type runtime struct {
	file string
	argv []string
}

var runtimes = map[Language]runtime{
	Python: {file: "main.py", argv: []string{"python3", "main.py"}},
	Node:   {file: "main.js", argv: []string{"node", "main.js"}},
	Bash:   {file: "main.sh", argv: []string{"bash", "main.sh"}},
}

// Program is how l is run: the file its code goes into (relative to the working directory)
// and the command, for a caller that starts the interpreter itself (runcode's Prestart).
func Program(l Language) (file string, argv []string) {
	rt := runtimes[l]
	return rt.file, slices.Clone(rt.argv)
}

// Runner is code in language l that runs the program in file (relative to the working
// directory) as if it were the code itself: how a program larger than MaxCodeBytes runs,
// sent as a file.
func Runner(l Language, file string) string {
	switch l {
	case Node:
		return fmt.Sprintf("process.argv[1] = require('path').resolve(%s);\nrequire(process.argv[1]);\n", strconv.Quote(file))
	case Bash:
		return "source '" + strings.ReplaceAll(file, "'", `'\''`) + "'\n"
	}
	return fmt.Sprintf("import runpy, sys\nsys.argv[0] = %s\nrunpy.run_path(%s, run_name='__main__')\n", strconv.Quote(file), strconv.Quote(file))
}

// aliases maps every accepted (lower-case) name to its language, canonical names included.
var aliases = map[string]Language{
	"python": Python, "py": Python, "python3": Python,
	"node": Node, "js": Node, "javascript": Node,
	"bash": Bash, "sh": Bash, "shell": Bash,
}

// Languages lists the canonical names.
func Languages() []Language { return []Language{Python, Node, Bash} }

// LanguageNames lists every accepted name, aliases included, canonical ones first, for a
// schema enum or a flag's help.
func LanguageNames() []string {
	names := []string{string(Python), string(Node), string(Bash)}
	var rest []string
	for a := range aliases {
		if !slices.Contains(names, a) {
			rest = append(rest, a)
		}
	}
	sort.Strings(rest)
	return append(names, rest...)
}

// ParseLanguage returns the language s names, case-insensitively, or an error listing
// the allowed names.
func ParseLanguage(s string) (Language, error) {
	if l, ok := aliases[strings.ToLower(strings.TrimSpace(s))]; ok {
		return l, nil
	}
	if strings.TrimSpace(s) == "" {
		return "", fmt.Errorf("%w: language is empty: allowed are %s", sbtypes.ErrInvalid, strings.Join(LanguageNames(), ", "))
	}
	return "", fmt.Errorf("%w: language %q is not supported: allowed are %s", sbtypes.ErrInvalid, s, strings.Join(LanguageNames(), ", "))
}

// Request is one run.
type Request struct {
	// Language is python, node or bash, or an alias (py, python3, js, javascript, sh, shell).
	Language string `json:"language"`
	// Code is the program text.
	Code string `json:"code"`
	// TimeoutSeconds is 1..300; 0 means 30; more is capped to 300 (the result says so).
	TimeoutSeconds int `json:"timeout_seconds,omitempty"`
	// askedTimeout is what TimeoutSeconds was before Normalize capped it (0: not capped).
	askedTimeout int
	// Network allows connections to the public internet (egress mode allow); off by default.
	Network bool `json:"network,omitempty"`
	// Stdin is fed to the program; empty means stdin is closed.
	Stdin string `json:"stdin,omitempty"`
	// Files are written before the program starts: relative paths are below the working
	// directory, absolute ones are where they say.
	Files map[string][]byte `json:"-"`
}

// Normalize checks req and returns it with the language canonical and the timeout defaulted.
func Normalize(req Request) (Request, error) {
	l, err := ParseLanguage(req.Language)
	if err != nil {
		return req, err
	}
	req.Language = string(l)
	if strings.TrimSpace(req.Code) == "" {
		return req, fmt.Errorf("%w: code is empty: give the program to run", sbtypes.ErrInvalid)
	}
	if len(req.Code) > MaxCodeBytes {
		return req, fmt.Errorf("%w: code is %d bytes, over the cap of %d bytes: send a larger program as a file (run_code's files; airlock run FILE does) and code that runs it", sbtypes.ErrInvalid, len(req.Code), MaxCodeBytes)
	}
	switch {
	case req.TimeoutSeconds == 0:
		req.TimeoutSeconds = DefaultTimeoutSeconds
	case req.TimeoutSeconds < 0:
		return req, fmt.Errorf("%w: timeout_seconds %d must be at least 1", sbtypes.ErrInvalid, req.TimeoutSeconds)
	case req.TimeoutSeconds > MaxTimeoutSeconds:
		// Capped, not refused (run_code's specification): the result says so.
		req.askedTimeout, req.TimeoutSeconds = req.TimeoutSeconds, MaxTimeoutSeconds
	}
	codeFile := runtimes[l].file
	for p := range req.Files {
		if err := checkFilePath(p); err != nil {
			return req, err
		}
		if path.Clean(p) == codeFile {
			return req, fmt.Errorf("%w: file %q would overwrite the code itself (%s): give it another name", sbtypes.ErrInvalid, p, codeFile)
		}
	}
	return req, nil
}

func checkFilePath(p string) error {
	switch {
	case p == "":
		return fmt.Errorf("%w: a file path is empty", sbtypes.ErrInvalid)
	case strings.IndexByte(p, 0) >= 0:
		return fmt.Errorf("%w: file path %q contains a NUL byte", sbtypes.ErrInvalid, p)
	case slices.Contains(strings.Split(p, "/"), ".."):
		return fmt.Errorf("%w: file path %q contains '..': give the path without it", sbtypes.ErrInvalid, p)
	case path.Clean(p) == "." || path.Clean(p) == "/":
		return fmt.Errorf("%w: file path %q names a directory, not a file", sbtypes.ErrInvalid, p)
	}
	return nil
}

// Options are how the caller runs code, beyond the request itself: where its output goes.
type Options struct {
	// Stdout and Stderr, when set, receive output live as it is produced, in addition to
	// what Result captures (at most MaxOutputBytes each).
	Stdout, Stderr io.Writer
	// Stdin, when set, is fed to the program instead of Request.Stdin.
	Stdin io.Reader
	// MaxOutputBytes caps each stream; 0 means DefaultOutputBytes.
	MaxOutputBytes int64
	// ViewBytes, when positive, is how much of each stream Result keeps for a reader with
	// little room (a model's context): the first and the last ViewBytes/2 bytes of what
	// arrived, with a line saying how much was cut between them.
	ViewBytes int64
	Logger    *slog.Logger
}

// Result is what one run produced.
type Result struct {
	Language string `json:"language" jsonschema:"the language the code ran as (empty for a session command)"`
	// ExitCode is the program's exit status; a program killed by a signal reports 128+signal,
	// as a shell does.
	ExitCode int    `json:"exit_code" jsonschema:"the exit status; 128+N when killed by signal N"`
	Signal   string `json:"signal,omitempty" jsonschema:"the signal that killed the program, if one did"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	// TimedOut: the program ran past its timeout and was killed with everything it started.
	TimedOut bool `json:"timed_out" jsonschema:"the program ran past its timeout and was killed with everything it started"`
	// OOMKilled: the program was killed for exceeding the memory limit.
	OOMKilled bool `json:"oom_killed" jsonschema:"the program was killed for exceeding the memory limit"`
	// Truncated: stdout or stderr went over the cap and the rest was dropped.
	Truncated bool `json:"truncated" jsonschema:"stdout or stderr went over output_cap_bytes and the rest was dropped"`
	// CutBytes is how many bytes of output were left out of the middle of stdout and stderr
	// (Options.ViewBytes), each cut marked in its stream.
	CutBytes int64 `json:"cut_bytes,omitempty" jsonschema:"bytes left out of the middle of stdout and stderr to fit a model's context; each cut is marked in its stream"`
	// NotUTF8: stdout or stderr was not valid UTF-8; the invalid bytes read as U+FFFD.
	NotUTF8        bool  `json:"not_utf8,omitempty" jsonschema:"stdout or stderr was not valid UTF-8 text: its invalid bytes appear as U+FFFD"`
	DurationMs     int64 `json:"duration_ms"`
	TimeoutSeconds int   `json:"timeout_seconds"`
	// TimeoutCappedFrom is the timeout asked for when it was over the cap and TimeoutSeconds
	// is the cap.
	TimeoutCappedFrom int    `json:"timeout_capped_from,omitempty" jsonschema:"the timeout_seconds asked for, when it was over the cap of 300 and was capped"`
	SandboxID         string `json:"sandbox_id"`
	// Memory is the memory limit the program ran under, for the OOM message.
	Memory string `json:"memory" jsonschema:"the memory limit the program ran under"`
	// OutputCapBytes is the per-stream cap, for the truncation message.
	OutputCapBytes int64 `json:"output_cap_bytes" jsonschema:"the cap on each of stdout and stderr, in bytes"`
}

// Text renders the result for a person or a model: "Exit code: N", a blank line, the
// non-empty output sections, then a line for each of a timeout, a kill, cut or truncated
// output, output that is not UTF-8 and a capped timeout.
func (r Result) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Exit code: %d\n", r.ExitCode)
	var sections strings.Builder
	section := func(name, s string) {
		if s == "" {
			return
		}
		fmt.Fprintf(&sections, "--- %s ---\n%s", name, s)
		if !strings.HasSuffix(s, "\n") {
			sections.WriteByte('\n')
		}
	}
	section("stdout", r.Stdout)
	section("stderr", r.Stderr)
	var status []string
	if r.TimedOut {
		status = append(status, fmt.Sprintf("Timed out after %ds: the program and everything it started were killed", r.TimeoutSeconds))
	}
	if r.OOMKilled {
		status = append(status, fmt.Sprintf("Killed: out of memory (limit %s)", r.Memory))
	} else if r.Signal != "" && !r.TimedOut {
		status = append(status, "Killed by signal "+r.Signal)
	}
	if r.CutBytes > 0 {
		status = append(status, fmt.Sprintf("Output shortened: %d bytes were left out of the middle (marked where), keeping each stream's beginning and end", r.CutBytes))
	}
	if r.Truncated {
		status = append(status, fmt.Sprintf("Output truncated: each stream is capped at %d bytes", r.OutputCapBytes))
	}
	if r.NotUTF8 {
		status = append(status, "Output is not valid UTF-8 text: its invalid bytes are shown as U+FFFD")
	}
	if r.TimeoutCappedFrom > 0 {
		status = append(status, fmt.Sprintf("Timeout capped: %ds asked for, %ds is the most a run gets", r.TimeoutCappedFrom, r.TimeoutSeconds))
	}
	for i, part := range []string{sections.String(), strings.Join(status, "\n")} {
		if part == "" {
			continue
		}
		b.WriteByte('\n')
		b.WriteString(part)
		if i == 1 {
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// ExitStatus is the status a command-line tool exits with for this result: 124 on a
// timeout (as coreutils timeout, and the result's ExitCode), 137 on an OOM kill, else the
// program's exit code.
func (r Result) ExitStatus() int {
	switch {
	case r.TimedOut:
		return 124
	case r.OOMKilled:
		return 137
	case r.ExitCode < 0 || r.ExitCode > 255:
		return 1
	}
	return r.ExitCode
}

// RunIn runs req in the sandbox whose agent is agent, with workdir its working directory
// (the declaration's, defaults applied): req.Files first, then the code, in pre's waiting
// interpreter for req's language when there is one (every other one is removed first), else cold (the code written to its file, the command exec'd), as also when that
// interpreter had exited before it got the code. pre is what was pre-started in the sandbox,
// or nil; agent nil means pre.Agent(). The result's SandboxID and Memory are the caller's to
// set. RunIn closes neither agent nor pre: the caller does, after it (pre.Close closes pre's
// agent). An error means the run could not happen or its outcome is unknown; a program that
// failed, timed out or was killed is a Result with no error.
func RunIn(ctx context.Context, agent sbtypes.Agent, pre *Prestarted, workdir string, req Request, opts Options) (res Result, err error) {
	req, err = Normalize(req)
	if err != nil {
		return Result{}, err
	}
	if agent == nil && pre != nil {
		agent = pre.agent
	}
	if agent == nil {
		return Result{}, fmt.Errorf("%w: no agent to run the code with", sbtypes.ErrInvalid)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	rt := runtimes[Language(req.Language)]
	if err := writeFiles(ctx, agent, workdir, req.Files); err != nil {
		return Result{}, err
	}

	stdin := opts.Stdin
	if stdin == nil && req.Stdin != "" {
		stdin = strings.NewReader(req.Stdin)
	}
	if pre != nil {
		// A sandbox with interpreters waiting (prestarted.go): the one for this language gets
		// the code, the others go first.
		pa, ok := agent.(processAgent)
		if !ok {
			return Result{}, fmt.Errorf("%w: the sandbox holds pre-started interpreters but this agent client cannot reach them", sbtypes.ErrUnsupported)
		}
		id, err := pre.take(ctx, pa, Language(req.Language))
		if err != nil {
			return Result{}, err
		}
		if id != "" {
			res, err = runPrestarted(ctx, pa, id, req, stdin, opts)
			if err == nil {
				log.Debug("run_code: ran in a pre-started interpreter", "language", req.Language)
				res.Language, res.TimeoutCappedFrom = req.Language, req.askedTimeout
				return res, nil
			}
			if !errors.Is(err, errInterpreterGone) {
				return Result{}, fmt.Errorf("running the code: %w", err)
			}
			log.Warn("run_code: the pre-started interpreter had exited; running the code cold")
		}
	}
	if err := agent.WriteFile(ctx, path.Join(workdir, rt.file), strings.NewReader(req.Code), 0o644); err != nil {
		return Result{}, fmt.Errorf("writing the code to %s: %w", path.Join(workdir, rt.file), err)
	}
	res, err = Exec(ctx, agent, sbtypes.ExecRequest{
		Argv:    rt.argv,
		Cwd:     workdir,
		Timeout: time.Duration(req.TimeoutSeconds) * time.Second,
		Stdin:   stdin,
	}, opts)
	if err != nil {
		return Result{}, fmt.Errorf("running the code: %w", err)
	}
	res.Language, res.TimeoutCappedFrom = req.Language, req.askedTimeout
	return res, nil
}

// Exec runs req on agent and captures its output the way RunIn does (opts.Stdout, Stderr
// and MaxOutputBytes apply; req's own caps are set from MaxOutputBytes). It is the exec step
// of a cold run, for callers that keep a sandbox across commands.
func Exec(ctx context.Context, agent sbtypes.Agent, req sbtypes.ExecRequest, opts Options) (Result, error) {
	c := newCapture(opts)
	req.MaxStdout, req.MaxStderr = c.capBytes, c.capBytes
	ex, err := agent.Exec(ctx, req, c.stdout, c.stderr)
	if err != nil {
		return Result{}, err
	}
	return c.resultOf(ex, int(req.Timeout/time.Second))
}

// outputCap is opts' per-stream output cap, defaulted.
func outputCap(opts Options) int64 {
	if opts.MaxOutputBytes <= 0 {
		return DefaultOutputBytes
	}
	return opts.MaxOutputBytes
}

// capture is a run's output: kept, and streamed to opts' writers as it comes. The cap is the
// agent's to keep (the request carries it); more than it is an agent that did not.
type capture struct {
	capBytes, view int64
	out, err       *kept
	stdout, stderr io.Writer
}

func newCapture(opts Options) *capture {
	c := &capture{capBytes: outputCap(opts), view: max(opts.ViewBytes, 0)}
	c.out, c.err = &kept{max: c.capBytes}, &kept{max: c.capBytes}
	c.stdout, c.stderr = io.Writer(c.out), io.Writer(c.err)
	if opts.Stdout != nil {
		c.stdout = io.MultiWriter(c.out, opts.Stdout)
	}
	if opts.Stderr != nil {
		c.stderr = io.MultiWriter(c.err, opts.Stderr)
	}
	return c
}

// resultOf is the Result of a run that ended as ex, with what was captured, timeoutSeconds its
// timeout; an error when the agent sent more than the cap it was given.
func (c *capture) resultOf(ex sbtypes.ExecResult, timeoutSeconds int) (Result, error) {
	if c.out.overrun || c.err.overrun {
		return Result{}, fmt.Errorf("%w: the agent sent more output than the cap of %d bytes per stream it was given", sbtypes.ErrOutcomeUnknown, c.capBytes)
	}
	res := c.result(ex)
	res.DurationMs = ex.Duration.Milliseconds()
	res.TimeoutSeconds = timeoutSeconds
	return res, nil
}

// TimeoutExitCode is the exit code of a program killed at its timeout, on every surface
// (the CLI's status, MCP's and the API's exit_code): coreutils timeout's.
const TimeoutExitCode = 124

// result is the Result of an exec that ended as ex, with what was captured; the caller sets
// the duration and timeout. A program killed by a signal exits 128+signal, as a shell says;
// one killed at its timeout TimeoutExitCode.
func (c *capture) result(ex sbtypes.ExecResult) Result {
	res := Result{
		ExitCode:       ex.ExitCode,
		Signal:         ex.Signal,
		TimedOut:       ex.TimedOut,
		OOMKilled:      ex.OOMKilled,
		Truncated:      ex.Truncated,
		OutputCapBytes: c.capBytes,
	}
	var cutOut, cutErr int64
	var badOut, badErr bool
	// The agent's cap may have cut a stream inside a character.
	res.Stdout, cutOut, badOut = c.out.view(c.view, ex.Truncated)
	res.Stderr, cutErr, badErr = c.err.view(c.view, ex.Truncated)
	res.CutBytes, res.NotUTF8 = cutOut+cutErr, badOut || badErr
	res.ExitCode = wire.ShellExitCode(res.ExitCode, res.Signal)
	if ex.TimedOut {
		res.ExitCode = TimeoutExitCode
	}
	return res
}

// writeFiles writes files in a stable order, creating parent directories.
func writeFiles(ctx context.Context, agent sbtypes.Agent, workdir string, files map[string][]byte) error {
	names := make([]string, 0, len(files))
	for p := range files {
		names = append(names, p)
	}
	sort.Strings(names)
	made := map[string]bool{workdir: true}
	for _, p := range names {
		abs := p
		if !path.IsAbs(abs) {
			abs = path.Join(workdir, p)
		}
		abs = path.Clean(abs)
		if dir := path.Dir(abs); !made[dir] {
			if err := agent.Mkdir(ctx, dir, 0o755); err != nil {
				return fmt.Errorf("creating directory %s for file %q: %w", dir, p, err)
			}
			made[dir] = true
		}
		if err := agent.WriteFile(ctx, abs, bytes.NewReader(files[p]), 0o644); err != nil {
			return fmt.Errorf("writing file %q to %s: %w", p, abs, err)
		}
	}
	return nil
}

// kept is one stream of a run's output as the agent sent it; overrun: more than max came,
// and the excess was not kept.
type kept struct {
	buf     bytes.Buffer
	max     int64
	overrun bool
}

func (k *kept) Write(p []byte) (int, error) {
	n := len(p)
	if room := k.max - int64(k.buf.Len()); int64(n) > room {
		k.overrun = true
		p = p[:max(room, 0)]
	}
	k.buf.Write(p)
	return n, nil
}

// view is what the stream reads as (View of what was kept); cut: the agent cut it at the cap,
// perhaps inside a character, whose partial tail is dropped rather than shown as U+FFFD.
func (k *kept) view(room int64, cut bool) (s string, cutBytes int64, bad bool) {
	b := k.buf.Bytes()
	if cut && int64(len(b)) >= k.max {
		b = b[:len(b)-partialTail(b)]
	}
	return View(b, room)
}

// View is output as a reader with little room (a model's context) gets it: valid UTF-8 (bad
// reports invalid bytes, replaced by U+FFFD), and with room > 0 and more than room bytes, the
// first and last room/2 bytes around a line saying how many were cut (cut), each part cut at a
// character boundary.
func View(b []byte, room int64) (s string, cut int64, bad bool) {
	if room > 0 && int64(len(b)) > room {
		head, tail := b[:room/2], b[int64(len(b))-room/2:]
		head = head[:len(head)-partialTail(head)]
		for i := 0; i < utf8.UTFMax && i < len(tail) && !utf8.RuneStart(tail[0]); i++ {
			tail = tail[1:]
		}
		cut = int64(len(b) - len(head) - len(tail))
		bad = !utf8.Valid(head) || !utf8.Valid(tail)
		return strings.ToValidUTF8(string(head), "\uFFFD") + fmt.Sprintf("\n[... %d bytes cut here ...]\n", cut) +
			strings.ToValidUTF8(string(tail), "\uFFFD"), cut, bad
	}
	if !utf8.Valid(b) {
		return strings.ToValidUTF8(string(b), "\uFFFD"), 0, true
	}
	return string(b), 0, false
}

// PartialTail is the length of an incomplete UTF-8 character at the end of b (0: none): what
// a reader of output still arriving keeps for the next read.
func PartialTail(b []byte) int { return partialTail(b) }

// partialTail is the length of an incomplete UTF-8 character at the end of b (0: none).
func partialTail(b []byte) int {
	for i := 1; i <= utf8.UTFMax && i <= len(b); i++ {
		if utf8.RuneStart(b[len(b)-i]) {
			if !utf8.FullRune(b[len(b)-i:]) {
				return i
			}
			return 0
		}
	}
	return 0
}
