// Package runcode runs one snippet of code in a fresh, disposable sandbox: the run_code semantics shared by the CLI and MCP.
package runcode

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/runcode/core"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/sandbox/prestarted"
	"github.com/airlock-sandbox/airlock/spec"
)

// The run_code semantics themselves are runcode/core's, which a lean caller (airlock run's
// front) links without this package's backend, spec and plan; these are its names here.

// Language is a canonical language name.
type Language = core.Language

const (
	Python = core.Python
	Node   = core.Node
	Bash   = core.Bash
)

// Limits of one run.
const (
	DefaultTimeoutSeconds = core.DefaultTimeoutSeconds
	MaxTimeoutSeconds     = core.MaxTimeoutSeconds
	// MaxCodeBytes bounds the code itself; larger programs belong in Files.
	MaxCodeBytes = core.MaxCodeBytes
	// DefaultOutputBytes caps each of stdout and stderr.
	DefaultOutputBytes = core.DefaultOutputBytes
	// The sandbox a run gets.
	DefaultMemory       = spec.DefaultMemory
	DefaultCPU          = spec.DefaultCPU
	DefaultMaxProcesses = spec.DefaultMaxProcesses
	// lifetimeMargin is how long a sandbox may outlive its exec's deadline before the
	// backend's own lifetime bound reaps it, should this process die before terminating it.
	lifetimeMargin = 60
	// terminateTimeout bounds the cleanup that runs even after the caller's ctx ended.
	terminateTimeout = 30 * time.Second
)

// Languages lists the canonical names.
func Languages() []Language { return core.Languages() }

// LanguageNames lists every accepted name, aliases included, canonical ones first, for a
// schema enum or a flag's help.
func LanguageNames() []string { return core.LanguageNames() }

// ParseLanguage returns the language s names, case-insensitively, or an error listing
// the allowed names.
func ParseLanguage(s string) (Language, error) { return core.ParseLanguage(s) }

// Request is one run.
type Request = core.Request

// View is output cut for a reader with little room (core.View).
func View(b []byte, room int64) (string, int64, bool) { return core.View(b, room) }

// PartialTail is the length of an incomplete UTF-8 character at the end of b (core.PartialTail).
func PartialTail(b []byte) int { return core.PartialTail(b) }

// TimeoutExitCode is the exit code of a program killed at its timeout (core.TimeoutExitCode).
const TimeoutExitCode = core.TimeoutExitCode

// Normalize checks req and returns it with the language canonical and the timeout defaulted.
func Normalize(req Request) (Request, error) { return core.Normalize(req) }

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
	// ViewBytes, when positive, is how much of each stream Result keeps: its first and last
	// ViewBytes/2 bytes around a marker of what was cut (core.Options.ViewBytes).
	ViewBytes int64
	// Labels are added to the sandbox's labels.
	Labels map[string]string
	Logger *slog.Logger
	// Pool, when set, supplies the sandbox of a run whose declaration fits the pool's template
	// (see Fits): a claim instead of a create. The claimed sandbox is still single-use; it is
	// handed back to Pool.Discard, which terminates it off the caller's path (so its errors are
	// logged by the pool, not returned). Runs that do not fit are created as without a pool.
	Pool Pool
}

// Core is the part of opts core.RunIn takes (a run in a parked sandbox, internal/runcli).
func (opts Options) Core() core.Options {
	return core.Options{Stdout: opts.Stdout, Stderr: opts.Stderr, Stdin: opts.Stdin, MaxOutputBytes: opts.MaxOutputBytes, ViewBytes: opts.ViewBytes, Logger: opts.Logger}
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
	ClaimForRun(ctx context.Context) (*sandbox.Session, prestarted.Interpreters, error)
}

// Result is what one run produced.
type Result = core.Result

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
	labels := map[string]string{"run.airlock.dev/purpose": "run-code", "run.airlock.dev/language": req.Language}
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

// undeclareUnenforced leaves a run's limits, lifetime and idle timeout undeclared where set
// does not enforce them: they are airlock's choices for a run, not the caller's ask (a run
// declares none of them). The lifetime and idle timeout are the run's safety net, under its
// own deadline (enforced by the agent) and its termination when it ends; the limits are
// run_code's defaults. Left undeclared, each becomes the platform's own value where the set
// publishes one (plan.Defaults), and is refused as a default where it does not; a run would
// otherwise be refused (docker, the clouds) for bounds nobody asked for.
func undeclareUnenforced(decl spec.Sandbox, set capability.Set) spec.Sandbox {
	if !set.Has(capability.EnforcedLimits) {
		decl.Limits.CPU, decl.Limits.Memory = "", ""
	}
	if !set.Has(capability.ProcessLimit) {
		decl.Limits.MaxProcesses = nil
	}
	if !set.Has(capability.SessionLifetime) {
		decl.Session.MaxLifetimeSeconds = nil
	}
	if !set.Has(capability.IdleTimeout) {
		decl.Session.IdleTimeoutSeconds = nil
	}
	return decl
}

// withDefaults is decl as a backend is given it to create: airlock's default for every
// undeclared property the platform holds, the platform's own value (left unset) elsewhere.
func withDefaults(backend sandbox.Backend, set capability.Set, decl spec.Sandbox) spec.Sandbox {
	return plan.Defaults(backend.Platform(), set, decl)
}

// memoryOf is what a run's memory is for its result: the declared (or defaulted) ceiling, else
// the platform's own size in its words.
func memoryOf(decl spec.Sandbox, set capability.Set) string {
	if decl.Limits.Memory != "" {
		return string(decl.Limits.Memory)
	}
	return set.PlatformValues[capability.PropMemory]
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
	return check(backend.Platform(), backend.Capabilities(ctx), decl, network)
}

func check(platform capability.Platform, set capability.Set, decl spec.Sandbox, network bool) error {
	res := plan.CheckCreate(decl, platform, set)
	if len(res.Refusals) == 0 {
		return nil
	}
	return &RefusedError{Platform: platform, Network: network, Refusals: res.Refusals, Set: set}
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
	set := backend.Capabilities(ctx)
	decl := undeclareUnenforced(Declaration(req, opts), set)
	if !set.Has(capability.Labels) && len(opts.Labels) == 0 {
		// The run's own labels (purpose, language) only say what made it: where the platform
		// keeps none (aws, gcp), they are not asked for. A caller's labels are, and are refused
		// there, never dropped.
		decl.Labels = nil
	}
	if err := check(backend.Platform(), set, decl, req.Network); err != nil {
		return Result{}, nil, err
	}
	decl = withDefaults(backend, set, decl)
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
	if err == nil {
		res.Memory = memoryOf(decl, set)
	}
	return res, term, err
}

// runIn runs req in the sandbox sess (pre: what a pool pre-started in it, or nil), and closes
// the client it used: pre's when there is one, else one it connects.
func runIn(ctx context.Context, backend sandbox.Backend, sess *sandbox.Session, pre *core.Prestarted, decl spec.Sandbox, req Request, opts Options, log *slog.Logger) (Result, error) {
	var agent sandbox.Agent
	if pre != nil {
		defer pre.Close()
		agent = pre.Agent() // the prestart's client, its connections open
	} else {
		var err error
		if agent, err = backend.Connect(ctx, sess.ID); err != nil {
			return Result{}, fmt.Errorf("connecting to the sandbox: %w", err)
		}
		defer agent.Close()
	}
	co := opts.Core()
	co.Logger = log.With("session", sess.ID)
	res, err := core.RunIn(ctx, agent, pre, decl.Workdir, req, co)
	if err != nil {
		return Result{}, err
	}
	res.SandboxID = sess.SandboxID
	return res, nil
}

// claim takes the run's sandbox from pool when decl fits its template and the claimed sandbox
// has lifetime enough for the timeout; nil (and no error) means create one. pre is what the
// pool pre-started in it (RunPool), nil if nothing.
func claim(ctx context.Context, pool Pool, decl spec.Sandbox, timeout time.Duration, log *slog.Logger) (sess *sandbox.Session, pooled bool, pre *core.Prestarted, err error) {
	if pool == nil || !Fits(decl, pool.Template()) {
		return nil, false, nil, nil
	}
	var v prestarted.Interpreters
	if pp, ok := pool.(RunPool); ok {
		sess, v, err = pp.ClaimForRun(ctx)
	} else {
		sess, err = pool.Claim(ctx)
	}
	if err != nil {
		return nil, false, nil, fmt.Errorf("claiming a sandbox from the pool: %w", err)
	}
	if sess == nil { // a RunPool with nothing ready: the run creates its own
		if v != nil {
			_ = v.Close()
		}
		return nil, false, nil, nil
	}
	if !sess.ExpiresAt.IsZero() && time.Until(sess.ExpiresAt) < timeout+core.ClaimMargin {
		log.Debug("run_code: pooled sandbox too close to its lifetime; creating one", "session", sess.ID, "expires", sess.ExpiresAt)
		if v != nil {
			_ = v.Close()
		}
		pool.Discard(sess.ID)
		return nil, false, nil, nil
	}
	pre, ok := v.(*core.Prestarted)
	if !ok && v != nil {
		// Interpreters some other prestart left waiting, which a run cannot hand code to nor
		// end: the code would not be alone in that sandbox.
		log.Debug("run_code: pooled sandbox holds interpreters of another prestart; creating one", "session", sess.ID, "type", fmt.Sprintf("%T", v))
		_ = v.Close()
		pool.Discard(sess.ID)
		return nil, false, nil, nil
	}
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
	delete(d.Labels, "run.airlock.dev/language")
	life := int64(MaxTimeoutSeconds+lifetimeMargin) + int64((idleExpiry+time.Second-1)/time.Second)
	d.Session.MaxLifetimeSeconds, d.Session.IdleTimeoutSeconds = &life, &life
	d.ApplyDefaults()
	return d
}

// Exec runs req on agent and captures its output the way Run does (opts.Stdout, Stderr
// and MaxOutputBytes apply; req's own caps are set from MaxOutputBytes). It is the exec step
// of Run, for callers that keep a sandbox across commands.
func Exec(ctx context.Context, agent sandbox.Agent, req sandbox.ExecRequest, opts Options) (Result, error) {
	return core.Exec(ctx, agent, req, opts.Core())
}
