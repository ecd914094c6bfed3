// Package runcode runs one snippet of code in a fresh, disposable sandbox: the run_code semantics shared by the CLI and MCP.
package runcode

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
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
	// MaxCodeBytes bounds the code itself; larger programs belong in Files.
	MaxCodeBytes = 1 << 20
	// DefaultOutputBytes caps each of stdout and stderr.
	DefaultOutputBytes = 1 << 20
	// The sandbox a run gets.
	DefaultMemory       = "512Mi"
	DefaultCPU          = "1"
	DefaultMaxProcesses = 256
	// lifetimeMargin is how long a sandbox may outlive its exec's deadline before the
	// backend's own lifetime bound reaps it, should this process die before terminating it.
	lifetimeMargin = 60
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
		return "", fmt.Errorf("%w: language is empty: allowed are %s", sandbox.ErrInvalid, strings.Join(LanguageNames(), ", "))
	}
	return "", fmt.Errorf("%w: language %q is not supported: allowed are %s", sandbox.ErrInvalid, s, strings.Join(LanguageNames(), ", "))
}

// Request is one run.
type Request struct {
	// Language is python, node or bash, or an alias (py, python3, js, javascript, sh, shell).
	Language string `json:"language"`
	// Code is the program text.
	Code string `json:"code"`
	// TimeoutSeconds is 1..300; 0 means 30.
	TimeoutSeconds int `json:"timeout_seconds,omitempty"`
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
		return req, fmt.Errorf("%w: code is empty: give the program to run", sandbox.ErrInvalid)
	}
	if len(req.Code) > MaxCodeBytes {
		return req, fmt.Errorf("%w: code is %d bytes, over the cap of %d bytes: put large programs in files", sandbox.ErrInvalid, len(req.Code), MaxCodeBytes)
	}
	switch {
	case req.TimeoutSeconds == 0:
		req.TimeoutSeconds = DefaultTimeoutSeconds
	case req.TimeoutSeconds < 0:
		return req, fmt.Errorf("%w: timeout_seconds %d must be at least 1", sandbox.ErrInvalid, req.TimeoutSeconds)
	case req.TimeoutSeconds > MaxTimeoutSeconds:
		return req, fmt.Errorf("%w: timeout_seconds %d is over the cap of %d seconds", sandbox.ErrInvalid, req.TimeoutSeconds, MaxTimeoutSeconds)
	}
	codeFile := runtimes[l].file
	for p := range req.Files {
		if err := checkFilePath(p); err != nil {
			return req, err
		}
		if path.Clean(p) == codeFile {
			return req, fmt.Errorf("%w: file %q would overwrite the code itself (%s): give it another name", sandbox.ErrInvalid, p, codeFile)
		}
	}
	return req, nil
}

func checkFilePath(p string) error {
	switch {
	case p == "":
		return fmt.Errorf("%w: a file path is empty", sandbox.ErrInvalid)
	case strings.IndexByte(p, 0) >= 0:
		return fmt.Errorf("%w: file path %q contains a NUL byte", sandbox.ErrInvalid, p)
	case slices.Contains(strings.Split(p, "/"), ".."):
		return fmt.Errorf("%w: file path %q contains '..': give the path without it", sandbox.ErrInvalid, p)
	case path.Clean(p) == "." || path.Clean(p) == "/":
		return fmt.Errorf("%w: file path %q names a directory, not a file", sandbox.ErrInvalid, p)
	}
	return nil
}

// Options are how the caller runs code, beyond the request itself.
type Options struct {
	// Image is the root filesystem; zero means the host image.
	Image spec.Image
	// Stdout and Stderr, when set, receive output live as it is produced, in addition to
	// what Result captures (at most MaxOutputBytes each).
	Stdout, Stderr io.Writer
	// Stdin, when set, is fed to the program instead of Request.Stdin.
	Stdin io.Reader
	// MaxOutputBytes caps each stream; 0 means DefaultOutputBytes.
	MaxOutputBytes int64
	// Labels are added to the sandbox's labels.
	Labels map[string]string
	Logger *slog.Logger
	// Pool, when set, supplies the sandbox of a run whose declaration fits the pool's template
	// (see Fits): a claim instead of a create. The claimed sandbox is still single-use; it is
	// handed back to Pool.Discard, which terminates it off the caller's path (so its errors are
	// logged by the pool, not returned). Runs that do not fit are created as without a pool.
	Pool Pool
}

// Pool hands out fresh sandboxes created ahead of time from one template
// (backend/local.Pool implements it).
type Pool interface {
	// Template is the declaration the pool's sandboxes are made from.
	Template() spec.Sandbox
	// Claim returns a sandbox no other claim gets, creating one when none is ready.
	Claim(ctx context.Context) (*sandbox.Session, error)
	// Discard terminates a claimed sandbox, off the caller's path.
	Discard(sessionID string)
}

// RunPool is a Pool that hands out sandboxes for one run (backend/local.Pool implements it):
// they may hold interpreters its PoolOptions.Prestart started, which Run uses.
type RunPool interface {
	Pool
	// ClaimForRun is Claim for one run, whose sandbox goes (Discard) when the run ends, at
	// the latest with this process; it also returns what was pre-started in the sandbox. A
	// nil session (no error) means none is ready: the run creates its own sandbox.
	ClaimForRun(ctx context.Context) (*sandbox.Session, any, error)
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
	Truncated      bool   `json:"truncated" jsonschema:"stdout or stderr went over output_cap_bytes and the rest was dropped"`
	DurationMs     int64  `json:"duration_ms"`
	TimeoutSeconds int    `json:"timeout_seconds"`
	SandboxID      string `json:"sandbox_id"`
	// Memory is the memory limit the program ran under, for the OOM message.
	Memory string `json:"memory" jsonschema:"the memory limit the program ran under"`
	// OutputCapBytes is the per-stream cap, for the truncation message.
	OutputCapBytes int64 `json:"output_cap_bytes" jsonschema:"the cap on each of stdout and stderr, in bytes"`
}

// Text renders the result for a person or a model: "Exit code: N", notes on a timeout,
// OOM kill or truncation, then the non-empty output sections.
func (r Result) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Exit code: %d\n", r.ExitCode)
	if r.TimedOut {
		fmt.Fprintf(&b, "Timed out after %ds: the program and everything it started were killed\n", r.TimeoutSeconds)
	}
	if r.OOMKilled {
		fmt.Fprintf(&b, "Killed: out of memory (limit %s)\n", r.Memory)
	} else if r.Signal != "" && !r.TimedOut {
		fmt.Fprintf(&b, "Killed by signal %s\n", r.Signal)
	}
	if r.Truncated {
		fmt.Fprintf(&b, "Output truncated: each stream is capped at %d bytes\n", r.OutputCapBytes)
	}
	section := func(name, s string) {
		if s == "" {
			return
		}
		fmt.Fprintf(&b, "--- %s ---\n%s", name, s)
		if !strings.HasSuffix(s, "\n") {
			b.WriteByte('\n')
		}
	}
	section("stdout", r.Stdout)
	section("stderr", r.Stderr)
	return b.String()
}

// ExitStatus is the status a command-line tool exits with for this result: 124 on a
// timeout (as coreutils timeout), 137 on an OOM kill, else the program's exit code.
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

// Declaration is the sandbox a run of req gets: the run_code defaults, egress allow only
// when req.Network, and a lifetime just past the timeout so that a sandbox this process
// failed to terminate still ends. req must be normalized.
func Declaration(req Request, opts Options) spec.Sandbox {
	img := opts.Image
	if img == (spec.Image{}) {
		img = spec.Image{Host: true}
	}
	egress := spec.EgressDeny
	if req.Network {
		egress = spec.EgressAllow
	}
	procs := int64(DefaultMaxProcesses)
	// The idle timeout is the lifetime: a run is one exec, and the lifetime bounds it.
	life := int64(req.TimeoutSeconds + lifetimeMargin)
	noReconnect := false
	labels := map[string]string{"airlock.dev/purpose": "run-code", "airlock.dev/language": req.Language}
	for k, v := range opts.Labels {
		labels[k] = v
	}
	return spec.Sandbox{
		ID:      "run-" + randomHex(6),
		Image:   img,
		Limits:  spec.Limits{CPU: DefaultCPU, Memory: DefaultMemory, MaxProcesses: &procs},
		Egress:  spec.Egress{Mode: egress},
		Session: spec.Session{MaxLifetimeSeconds: &life, IdleTimeoutSeconds: &life, Reconnect: &noReconnect},
		Labels:  labels,
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b)
}

// RefusedError is a run the backend cannot enforce as asked; it unwraps to
// sandbox.ErrRefused and to each *plan.Refusal.
type RefusedError struct {
	Platform capability.Platform
	Network  bool
	Refusals []*plan.Refusal
	Set      capability.Set
}

func (e *RefusedError) Error() string {
	var lines []string
	for _, r := range e.Refusals {
		if r.Capability == capability.PublicOnlyEgress && e.Network {
			why := e.Set.Entries[r.Capability].Reason
			if why == "" {
				why = r.Message
			}
			lines = append(lines, fmt.Sprintf("network: true needs egress \"allow\" (public internet only), which is not available on this host (%s): %s (capability %s is unsupported); run with network off",
				e.Platform, why, r.Capability))
			continue
		}
		lines = append(lines, describe(r))
	}
	return "refused: " + strings.Join(lines, "; ")
}

// describe renders one refusal of the run's single sandbox: the field, the value checked,
// why, and the capability or rule.
func describe(r *plan.Refusal) string {
	var b strings.Builder
	b.WriteString(strings.TrimPrefix(r.Field, "sandboxes[0]."))
	if r.Value != "" {
		fmt.Fprintf(&b, " %q", r.Value)
	}
	fmt.Fprintf(&b, ": %s (needs %s)", r.Message, r.Needs())
	return b.String()
}

func (e *RefusedError) Unwrap() []error {
	errs := []error{sandbox.ErrRefused}
	for _, r := range e.Refusals {
		errs = append(errs, r)
	}
	return errs
}

// Check refuses, before anything is created, a declaration the backend cannot enforce.
// (An idle timeout no shorter than an enforced lifetime needs no idleTimeout capability:
// plan.Check itself knows the lifetime ends the sandbox first.)
func Check(ctx context.Context, backend sandbox.Backend, decl spec.Sandbox, network bool) error {
	set := backend.Capabilities(ctx)
	res := plan.Check(&spec.Stack{APIVersion: spec.APIVersion, Sandboxes: []spec.Sandbox{decl}}, backend.Platform(), set)
	if len(res.Refusals) == 0 {
		return nil
	}
	return &RefusedError{Platform: backend.Platform(), Network: network, Refusals: res.Refusals, Set: set}
}

// Run runs req in a fresh sandbox on backend and always terminates that sandbox, even when
// ctx is cancelled; it returns once the sandbox is gone. An error means the run could not
// happen, its outcome is unknown, or its sandbox could not be terminated; a program that
// failed, timed out or was killed is a Result with no error.
func Run(ctx context.Context, backend sandbox.Backend, req Request, opts Options) (Result, error) {
	res, term, err := RunDetached(ctx, backend, req, opts)
	if terr := term.Wait(); terr != nil {
		err = errors.Join(err, terr)
	}
	return res, err
}

// Termination is the end of a run's sandbox, which RunDetached leaves running in the
// background once the result is known.
type Termination struct {
	done chan struct{}
	err  error
}

// Wait blocks until the run's sandbox is gone (terminated, its cgroup confirmed empty and
// removed; or handed back to the pool, which terminates it) and returns why terminating it
// failed, if it did. Nil-safe: a nil Termination had no sandbox to terminate.
func (t *Termination) Wait() error {
	if t == nil {
		return nil
	}
	<-t.done
	return t.err
}

// Done is closed once the run's sandbox is gone (Wait then returns at once).
func (t *Termination) Done() <-chan struct{} {
	if t == nil {
		return closedChan
	}
	return t.done
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// RunDetached is Run returning as soon as the result is known: the run's sandbox is terminated
// in the background, the kernel's teardown of its namespaces off the caller's path. The
// Termination reports when that is confirmed and what failed; it is nil only when no sandbox
// was made. A caller that reports the run's success must Wait first (a sandbox that cannot be
// terminated is an error of the run); one that answers at once must still Wait and report.
func RunDetached(ctx context.Context, backend sandbox.Backend, req Request, opts Options) (res Result, term *Termination, err error) {
	req, err = Normalize(req)
	if err != nil {
		return Result{}, nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	decl := Declaration(req, opts)
	if err := Check(ctx, backend, decl, req.Network); err != nil {
		return Result{}, nil, err
	}
	decl.ApplyDefaults()
	sess, pooled, pre, err := claim(ctx, opts.Pool, decl, time.Duration(req.TimeoutSeconds)*time.Second, log)
	if err != nil {
		return Result{}, nil, err
	}
	if sess == nil {
		if sess, err = backend.Create(ctx, decl); err != nil {
			return Result{}, nil, fmt.Errorf("creating the sandbox: %w", err)
		}
	}
	term = &Termination{done: make(chan struct{})}
	defer func() {
		if pooled {
			opts.Pool.Discard(sess.ID) // the pool terminates it off this path and logs its errors
			close(term.done)
			return
		}
		// The sandbox goes whatever happened, with a context of its own: a cancelled
		// caller must not leave it behind.
		go func() {
			defer close(term.done)
			tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), terminateTimeout)
			defer cancel()
			if terr := backend.Terminate(tctx, sess.ID); terr != nil {
				log.Error("run_code: terminating the sandbox failed", "session", sess.ID, "err", terr)
				term.err = fmt.Errorf("terminating sandbox %s: %w", sess.ID, terr)
			}
		}()
	}()
	res, err = runIn(ctx, backend, sess, pre, decl, req, opts, log)
	return res, term, err
}

// runIn runs req in the sandbox sess (pre: what a pool pre-started in it, or nil).
func runIn(ctx context.Context, backend sandbox.Backend, sess *sandbox.Session, pre *prestarted, decl spec.Sandbox, req Request, opts Options, log *slog.Logger) (res Result, err error) {
	var agent sandbox.Agent
	if pre != nil {
		agent = pre.agent // the prestart's client, its connections open
	} else if agent, err = backend.Connect(ctx, sess.ID); err != nil {
		return Result{}, fmt.Errorf("connecting to the sandbox: %w", err)
	}
	defer agent.Close()

	workdir := decl.Workdir
	rt := runtimes[Language(req.Language)]
	if err := writeFiles(ctx, agent, workdir, req.Files); err != nil {
		return Result{}, err
	}

	stdin := opts.Stdin
	if stdin == nil && req.Stdin != "" {
		stdin = strings.NewReader(req.Stdin)
	}
	if pre != nil {
		// A pooled sandbox with interpreters waiting (prestart.go): the one for this language
		// gets the code, the others go first.
		pa, ok := agent.(processAgent)
		if !ok {
			return Result{}, fmt.Errorf("%w: the sandbox holds pre-started interpreters but this agent client cannot reach them", sandbox.ErrUnsupported)
		}
		w, err := pre.take(ctx, pa, Language(req.Language), pre.usable(opts))
		if err != nil {
			return Result{}, err
		}
		if w != nil {
			res, err = runPrestarted(ctx, pa, w, req, stdin, opts, log)
			if err == nil {
				log.Debug("run_code: ran in a pre-started interpreter", "session", sess.ID, "language", req.Language)
				res.Language = req.Language
				res.SandboxID = sess.SandboxID
				res.Memory = string(decl.Limits.Memory)
				return res, nil
			}
			if !errors.Is(err, errInterpreterGone) {
				return Result{}, fmt.Errorf("running the code: %w", err)
			}
			log.Warn("run_code: the pre-started interpreter had exited; running the code cold", "session", sess.ID)
		}
	}
	if err := agent.WriteFile(ctx, path.Join(workdir, rt.file), strings.NewReader(req.Code), 0o644); err != nil {
		return Result{}, fmt.Errorf("writing the code to %s: %w", path.Join(workdir, rt.file), err)
	}
	res, err = Exec(ctx, agent, sandbox.ExecRequest{
		Argv:    rt.argv,
		Cwd:     workdir,
		Timeout: time.Duration(req.TimeoutSeconds) * time.Second,
		Stdin:   stdin,
	}, opts)
	if err != nil {
		return Result{}, fmt.Errorf("running the code: %w", err)
	}
	res.Language = req.Language
	res.SandboxID = sess.SandboxID
	res.Memory = string(decl.Limits.Memory)
	return res, nil
}

// ClaimMargin is how much lifetime a claimed sandbox must have beyond the run's timeout.
const ClaimMargin = 5 * time.Second

// claim takes the run's sandbox from pool when decl fits its template and the claimed sandbox
// has lifetime enough for the timeout; nil (and no error) means create one. pre is what the
// pool pre-started in it (RunPool), nil if nothing.
func claim(ctx context.Context, pool Pool, decl spec.Sandbox, timeout time.Duration, log *slog.Logger) (sess *sandbox.Session, pooled bool, pre *prestarted, err error) {
	if pool == nil || !Fits(decl, pool.Template()) {
		return nil, false, nil, nil
	}
	var v any
	if pp, ok := pool.(RunPool); ok {
		sess, v, err = pp.ClaimForRun(ctx)
	} else {
		sess, err = pool.Claim(ctx)
	}
	if err != nil {
		return nil, false, nil, fmt.Errorf("claiming a sandbox from the pool: %w", err)
	}
	if sess == nil { // a RunPool with nothing ready: the run creates its own
		if c, ok := v.(io.Closer); ok {
			_ = c.Close()
		}
		return nil, false, nil, nil
	}
	if !sess.ExpiresAt.IsZero() && time.Until(sess.ExpiresAt) < timeout+ClaimMargin {
		log.Debug("run_code: pooled sandbox too close to its lifetime; creating one", "session", sess.ID, "expires", sess.ExpiresAt)
		pool.Discard(sess.ID)
		return nil, false, nil, nil
	}
	pre, _ = v.(*prestarted)
	return sess, true, pre, nil
}

// Fits reports whether a run declared as decl may use a sandbox of tmpl: the same image,
// limits, egress, runtime, working directory, environment and ports. Ids, labels and the
// session's clocks may differ (a claim checks the lifetime left instead).
func Fits(decl, tmpl spec.Sandbox) bool {
	norm := func(s spec.Sandbox) spec.Sandbox {
		s.ApplyDefaults()
		s.ID, s.Labels, s.Session = "", nil, spec.Session{}
		if len(s.Env) == 0 {
			s.Env = nil
		}
		return s
	}
	return reflect.DeepEqual(norm(decl), norm(tmpl))
}

// PoolTemplate is the sandbox a pool for run_code keeps ready: what Declaration gives a run
// with opts and network off, living long enough for the longest timeout after idleExpiry in
// the pool.
func PoolTemplate(opts Options, idleExpiry time.Duration) spec.Sandbox {
	d := Declaration(Request{Language: string(Python), TimeoutSeconds: MaxTimeoutSeconds}, opts)
	d.ID = "run"
	delete(d.Labels, "airlock.dev/language")
	life := int64(MaxTimeoutSeconds+lifetimeMargin) + int64((idleExpiry+time.Second-1)/time.Second)
	d.Session.MaxLifetimeSeconds, d.Session.IdleTimeoutSeconds = &life, &life
	d.ApplyDefaults()
	return d
}

// Exec runs req on agent and captures its output the way Run does (opts.Stdout, Stderr
// and MaxOutputBytes apply; req's own caps are set from MaxOutputBytes). It is the exec step
// of Run, for callers that keep a sandbox across commands.
func Exec(ctx context.Context, agent sandbox.Agent, req sandbox.ExecRequest, opts Options) (Result, error) {
	capBytes := opts.MaxOutputBytes
	if capBytes <= 0 {
		capBytes = DefaultOutputBytes
	}
	req.MaxStdout, req.MaxStderr = capBytes, capBytes
	outBuf := &capped{max: capBytes}
	errBuf := &capped{max: capBytes}
	var stdout, stderr io.Writer = outBuf, errBuf
	if opts.Stdout != nil {
		stdout = io.MultiWriter(outBuf, opts.Stdout)
	}
	if opts.Stderr != nil {
		stderr = io.MultiWriter(errBuf, opts.Stderr)
	}
	ex, err := agent.Exec(ctx, req, stdout, stderr)
	if err != nil {
		return Result{}, err
	}
	res := Result{
		ExitCode:       ex.ExitCode,
		Signal:         ex.Signal,
		Stdout:         outBuf.String(),
		Stderr:         errBuf.String(),
		TimedOut:       ex.TimedOut,
		OOMKilled:      ex.OOMKilled,
		Truncated:      ex.Truncated || outBuf.over || errBuf.over,
		DurationMs:     ex.Duration.Milliseconds(),
		TimeoutSeconds: int(req.Timeout / time.Second),
		OutputCapBytes: capBytes,
	}
	if res.ExitCode < 0 && res.Signal != "" {
		if n := unix.SignalNum(res.Signal); n != 0 {
			res.ExitCode = 128 + int(n)
		}
	}
	return res, nil
}

// writeFiles writes files in a stable order, creating parent directories.
func writeFiles(ctx context.Context, agent sandbox.Agent, workdir string, files map[string][]byte) error {
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

// capped keeps at most max bytes, cut back to whole UTF-8 characters when read, and
// remembers whether more came.
type capped struct {
	buf  bytes.Buffer
	max  int64
	over bool
}

func (c *capped) Write(p []byte) (int, error) {
	room := c.max - int64(c.buf.Len())
	if int64(len(p)) > room {
		c.over = true
		if room > 0 {
			c.buf.Write(p[:room])
		}
		return len(p), nil
	}
	c.buf.Write(p)
	return len(p), nil
}

func (c *capped) String() string {
	b := c.buf.Bytes()
	if c.over {
		// The cut may have split a character; drop its partial tail rather than emit U+FFFD.
		for i := 1; i <= utf8.UTFMax && i <= len(b); i++ {
			if utf8.RuneStart(b[len(b)-i]) {
				if !utf8.FullRune(b[len(b)-i:]) {
					b = b[:len(b)-i]
				}
				break
			}
		}
	}
	return string(b)
}
