// Package gcp runs sandboxes on Cloud Run's sandbox launcher, from inside the workload that hosts them, driven by our agent.
package gcp

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/agent"
	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/internal/backoff"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
	"github.com/airlock-sandbox/airlock/token"
)

// DefaultLauncher is where a launcher-enabled Cloud Run container has the CLI.
const DefaultLauncher = "/usr/local/gcp/bin/sandbox"

// Paths inside a sandbox. Only /tmp is writable before --write's overlay, and it is the
// sandbox's own, so the agent keeps its config and socket there.
const (
	agentDir    = "/tmp/.airlock"
	agentConfig = agentDir + "/agent.json"
	agentSocket = agentDir + "/agent.sock"
)

const (
	// maxTimeout bounds one exec: the launcher has no lifetime, and a Cloud Run instance
	// serves a request for at most an hour, a job task for at most a day.
	maxTimeout = 24 * time.Hour
	// tokenLifetime bounds each minted execute token; a fresh one is minted per request.
	tokenLifetime = 60 * time.Second
	// startTimeout bounds Create when ctx has no deadline.
	startTimeout = 60 * time.Second
	// controlTimeout bounds one launcher call that is not an exec (run, delete, probe).
	controlTimeout = 60 * time.Second
)

// runtimePaths are the runtime's own (the agent's directory): the files API refuses them, with
// the kernel's filesystems (wire.NewPolicy), and no workdir may be there.
var runtimePaths = []string{agentDir}

// Options configure a gcp backend.
type Options struct {
	// Launcher is the launcher CLI (default DefaultLauncher, or $AIRLOCK_GCP_LAUNCHER).
	Launcher string
	// AgentPath is the agent binary as the sandbox sees it: a sandbox's root is this
	// container's own, so it is the path here. Empty: $AIRLOCK_AGENT, "airlock-agent" next to
	// this executable, on PATH, else this executable as "__agent".
	AgentPath string
	// AgentArgs are arguments put before the agent's command (the "__agent" fallback sets it).
	AgentArgs []string
	// LauncherEnv is the launcher's environment (default: this process's).
	LauncherEnv []string
	// NoAgent runs every command through the launcher's own exec instead of our agent, for a
	// hosting image the agent cannot run in: weaker (PublishedNoAgent: no files, pty or
	// background processes; deadlines kill the command's process group).
	NoAgent bool
	Logger  *slog.Logger
}

// Backend drives the launcher. It knows the sandboxes it created: the launcher cannot list,
// and its names live in this Cloud Run instance only.
type Backend struct {
	launcher    string
	launcherEnv []string
	agentPath   string
	agentArgs   []string
	log         *slog.Logger
	caps        capability.Set
	noAgent     bool

	mu       sync.Mutex
	sessions map[string]*session
}

type session struct {
	s   sandbox.Session
	key ed25519.PrivateKey
}

var _ sandbox.Backend = (*Backend)(nil)

// New checks that the launcher and the agent binary exist. It starts nothing.
func New(ctx context.Context, opts Options) (*Backend, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	l := opts.Launcher
	if l == "" {
		l = os.Getenv("AIRLOCK_GCP_LAUNCHER")
	}
	if l == "" {
		l = DefaultLauncher
	}
	fi, err := os.Stat(l)
	if err != nil {
		return nil, fmt.Errorf("%w: the Cloud Run sandbox launcher %s: %v (gcp runs inside a Cloud Run workload deployed with sandboxLauncher: true; see docs/platforms/gcp.md)", sandbox.ErrUnsupported, l, err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return nil, fmt.Errorf("%w: the launcher %s is not an executable file", sandbox.ErrInvalid, l)
	}
	b := &Backend{launcher: l, launcherEnv: opts.LauncherEnv, log: opts.Logger.With("backend", "gcp"),
		caps: Published(), sessions: map[string]*session{}}
	if opts.NoAgent {
		b.caps, b.noAgent = PublishedNoAgent(), true
		return b, nil
	}
	b.agentPath, b.agentArgs, err = statedir.ResolveAgent(opts.AgentPath, opts.AgentArgs, func(string, fs.FileInfo) error { return nil })
	if err != nil {
		return nil, err
	}
	return b, nil
}

// Platform is gcp.
func (b *Backend) Platform() capability.Platform { return capability.GCP }

// Capabilities is the published set: the launcher is the same wherever it runs.
func (b *Backend) Capabilities(context.Context) capability.Set { return b.caps }

// agentCmd is the agent's command line inside a sandbox, before its own command.
func (b *Backend) agentCmd() []string {
	return append([]string{b.agentPath}, b.agentArgs...)
}

// resolved is a declaration as the launcher takes it.
type resolved struct {
	allowEgress bool
	workdir     string
}

func resolve(decl spec.Sandbox) (resolved, error) {
	var r resolved
	if err := spec.ValidateID(decl.ID); err != nil {
		return r, err
	}
	switch decl.Runtime {
	case "", spec.RuntimeNative, spec.RuntimeGVisor:
		// Every launcher sandbox is a gVisor sandbox: native names no other choice here.
	default:
		return r, fmt.Errorf("%w: runtime %q: a Cloud Run sandbox is gVisor (allowed: gvisor, native)", sandbox.ErrUnsupported, decl.Runtime)
	}
	switch decl.Egress.Mode {
	case "", spec.EgressDeny:
	case spec.EgressOpen:
		if len(decl.Egress.Domains) > 0 {
			return r, fmt.Errorf("%w: egress.domains %q: only valid with mode allowDomains", sandbox.ErrInvalid, strings.Join(decl.Egress.Domains, ","))
		}
		r.allowEgress = true
	default:
		// allow and allowDomains are refused by plan.CheckSandbox, naming the capability.
		return r, fmt.Errorf("%w: egress mode %q: the launcher has deny (its default) and open (--allow-egress)", sandbox.ErrUnsupported, decl.Egress.Mode)
	}
	if decl.Image.Kind() != spec.ImageHost {
		return r, fmt.Errorf("%w: image %s: a Cloud Run sandbox's root is its hosting container's image (declare image: host)", sandbox.ErrUnsupported, decl.Image.String())
	}
	r.workdir = decl.Workdir
	if r.workdir == "" {
		r.workdir = spec.DefaultWorkdir
	}
	if !path.IsAbs(r.workdir) || path.Clean(r.workdir) != r.workdir || r.workdir == "/" {
		return r, fmt.Errorf("%w: workdir %q: must be an absolute, clean path other than /", sandbox.ErrInvalid, r.workdir)
	}
	for _, d := range agentPolicy(decl, r.workdir).DenyPaths {
		if r.workdir == d || strings.HasPrefix(r.workdir, d+"/") {
			return r, fmt.Errorf("%w: workdir %q: is a directory the runtime owns (%s)", sandbox.ErrInvalid, r.workdir, d)
		}
	}
	return r, nil
}

// agentPolicy is the run policy of a sandbox's agent: a sandbox inherits no environment but
// HOME, and its one user has no name of ours; the launcher has no lifetime or idle timeout, so
// maxTimeout bounds a command's deadline.
func agentPolicy(decl spec.Sandbox, workdir string) wire.Policy {
	return wire.NewPolicy(wire.PolicyFor{Workdir: workdir, Env: decl.Env, Lifetime: maxTimeout, RuntimePaths: runtimePaths})
}

// startScript writes the agent's config where only the sandbox sees it and makes the workdir
// (the root is the hosting image, writable through --write's overlay), then becomes the
// agent: the sandbox's first process. The config travels as an argument, never through a
// shell's parser ("$2"), within Linux's 128 KiB per argument.
const startScript = `umask 077 && mkdir -p "$1" && printf '%s' "$2" > "$1/agent.json" && umask 022 && mkdir -p "$3" && shift 3 && exec "$@"`

// Create starts a sandbox through the launcher and returns once our agent inside answers.
// What this backend's set says no to is refused first (plan.CheckSandbox).
func (b *Backend) Create(ctx context.Context, decl spec.Sandbox) (*sandbox.Session, error) {
	if err := plan.CheckSandbox(decl, b.caps); err != nil {
		return nil, err
	}
	r, err := resolve(decl)
	if err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, startTimeout)
		defer cancel()
	}
	id, err := newName()
	if err != nil {
		return nil, err
	}
	if b.noAgent {
		return b.createNoAgent(ctx, id, decl, r)
	}
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	ring, err := token.NewKeyRing(key.Public().(ed25519.PublicKey)).MarshalText()
	if err != nil {
		return nil, err
	}
	cfg := agent.Config{
		SandboxID: decl.ID, SessionID: id, Generation: 1, KeyRing: string(ring),
		Listen: "unix:" + agentSocket, FilesRoot: "/",
		Workdir: r.workdir, Policy: agentPolicy(decl, r.workdir),
		// The launcher gives a sandbox one user (its own mapped root, or a user with sudo)
		// and gVisor no CAP_SETUID to leave it: commands run as the agent's own user.
		AllowRootCode: true,
	}
	cj, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	if len(cj) > maxArg {
		return nil, fmt.Errorf("%w: env: the agent's configuration is %d bytes and travels as one launcher argument, at most %d (Linux's limit): declare less environment", sandbox.ErrInvalid, len(cj), maxArg)
	}
	command := append([]string{"/bin/sh", "-c", startScript, "sh", agentDir, string(cj), r.workdir}, b.agentCmd()...)
	argv, err := argvRun(runArgs{name: id, allowEgress: r.allowEgress, workdir: r.workdir,
		command: append(command, "serve", "--config", agentConfig)})
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	sess := &session{key: key, s: sandbox.Session{ID: id, SandboxID: decl.ID, Platform: string(capability.GCP),
		State: sandbox.StateRunning, Generation: 1, CreatedAt: now, Labels: decl.Labels, Spec: decl}}
	if out, err := b.run(ctx, argv); err != nil {
		b.cleanup(ctx, id)
		return nil, fmt.Errorf("%w: launcher run: %v%s", sandbox.ErrUnreachable, err, out)
	}
	if err := b.waitAgent(ctx, sess); err != nil {
		b.cleanup(ctx, id)
		return nil, err
	}
	b.mu.Lock()
	b.sessions[id] = sess
	b.mu.Unlock()
	b.log.Debug("sandbox created", "session", id, "sandbox", decl.ID)
	out := sess.s
	return &out, nil
}

// cleanup deletes a half-made sandbox, under a deadline of its own.
func (b *Backend) cleanup(ctx context.Context, id string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), controlTimeout)
	defer cancel()
	if err := b.Terminate(cctx, id); err != nil {
		b.log.Warn("cleaning up a sandbox that did not start", "session", id, "err", err)
	}
}

// run runs one launcher call to completion and returns its output for an error message.
func (b *Backend) run(ctx context.Context, argv []string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, controlTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.launcher, argv...)
	cmd.Env = b.launcherEnv
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	s := strings.TrimSpace(out.String())
	if len(s) > 2048 {
		s = s[len(s)-2048:]
	}
	if s != "" {
		s = "\nlauncher output:\n" + s
	}
	return s, err
}

// waitAgent polls the agent through the bridge until it answers for this sandbox. `run
// --detach` exits 0 even for a sandbox whose command died at once (measured by scion), so an
// answer is the only proof of life.
func (b *Backend) waitAgent(ctx context.Context, s *session) error {
	c := b.client(s)
	defer c.Close()
	var last error
	for wait := backoff.New(10*time.Millisecond, 200*time.Millisecond); ; {
		hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		h, err := c.Health(hctx)
		cancel()
		if err == nil {
			if h.SandboxID != s.s.SandboxID {
				return fmt.Errorf("%w: agent of %s answered for sandbox %q", sandbox.ErrUnreachable, s.s.ID, h.SandboxID)
			}
			return checkKillScope(s.s.ID, h)
		}
		last = err
		if !wait.Wait(ctx) {
			return fmt.Errorf("%w: agent of %s did not answer through the launcher: %v (last error: %v)", sandbox.ErrDeadlineExceeded, s.s.ID, ctx.Err(), last)
		}
	}
}

// checkKillScope refuses an agent whose kill does not reach every process an exec started:
// Published holds backgroundProcesses on the agent's subreaper, and an agent that could not
// start reapers would leave setsid'd processes running.
func checkKillScope(id string, h sandbox.Health) error {
	if h.KillsWholeTree() {
		return nil
	}
	return fmt.Errorf("%w: capability %s: the agent of %s kills an exec by %q only, not every process it started (it could not run its exec reaper in this sandbox)",
		sandbox.ErrRefused, capability.BackgroundProcesses, id, h.KillScope)
}

func (b *Backend) client(s *session) *client.Client {
	id, sandboxID, key := s.s.ID, s.s.SandboxID, s.key
	return client.NewDial(func(ctx context.Context) (net.Conn, error) { return b.dialBridge(ctx, id) }, func() string {
		now := time.Now()
		tok, err := token.Mint(key, token.Claims{
			Sandbox: sandboxID, Session: id, Generation: 1, Class: token.Execute,
			IssuedAt: now.Unix(), Expiry: now.Add(tokenLifetime).Unix(),
		})
		if err != nil {
			return "" // the agent refuses an empty token; Mint fails only on a bad key
		}
		return tok
	})
}

func (b *Backend) lookup(id string) (*session, error) {
	if !launcherName.MatchString(id) {
		return nil, fmt.Errorf("%w: session id %q: must match %s", sandbox.ErrInvalid, id, launcherName)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.sessions[id]
	if !ok {
		return nil, fmt.Errorf("%w: session %s (this process knows only the sandboxes it created: the launcher cannot list)", sandbox.ErrNotFound, id)
	}
	return s, nil
}

// Get returns a session this backend created and has not terminated.
func (b *Backend) Get(_ context.Context, sessionID string) (*sandbox.Session, error) {
	s, err := b.lookup(sessionID)
	if err != nil {
		return nil, err
	}
	out := s.s
	return &out, nil
}

// List returns the sessions this backend created, oldest first.
func (b *Backend) List(context.Context) ([]*sandbox.Session, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]*sandbox.Session, 0, len(b.sessions))
	for _, s := range b.sessions {
		c := s.s
		out = append(out, &c)
	}
	slices.SortFunc(out, func(a, c *sandbox.Session) int { return a.CreatedAt.Compare(c.CreatedAt) })
	return out, nil
}

// Connect returns an agent client whose every request carries a freshly minted execute token
// and whose every connection is a launcher exec of the agent's bridge.
func (b *Backend) Connect(_ context.Context, sessionID string) (sandbox.Agent, error) {
	s, err := b.lookup(sessionID)
	if err != nil {
		return nil, err
	}
	if b.noAgent {
		r, err := resolve(s.s.Spec)
		if err != nil {
			return nil, err
		}
		return &cliAgent{b: b, name: s.s.ID, workdir: r.workdir, env: agentPolicy(s.s.Spec, r.workdir).Env}, nil
	}
	return b.client(s), nil
}

// noAgentScript makes the workdir and then holds the sandbox open: the launcher-exec path's
// sandbox runs nothing of ours.
const noAgentScript = `mkdir -p "$1" && exec /bin/sleep infinity`

// createNoAgent starts a sandbox that holds itself open, and returns once it runs commands.
func (b *Backend) createNoAgent(ctx context.Context, id string, decl spec.Sandbox, r resolved) (*sandbox.Session, error) {
	argv, err := argvRun(runArgs{name: id, allowEgress: r.allowEgress, workdir: r.workdir,
		command: []string{"/bin/sh", "-c", noAgentScript, "sh", r.workdir}})
	if err != nil {
		return nil, err
	}
	if out, err := b.run(ctx, argv); err != nil {
		b.cleanup(ctx, id)
		return nil, fmt.Errorf("%w: launcher run: %v%s", sandbox.ErrUnreachable, err, out)
	}
	probe, err := argvProbe(id)
	if err != nil {
		return nil, err
	}
	for wait := backoff.New(10*time.Millisecond, 200*time.Millisecond); ; {
		out, err := b.run(ctx, probe)
		if err == nil {
			break
		}
		if !wait.Wait(ctx) {
			b.cleanup(ctx, id)
			return nil, fmt.Errorf("%w: sandbox %s did not run commands: %v (last: %v%s)", sandbox.ErrDeadlineExceeded, id, ctx.Err(), err, out)
		}
	}
	sess := &session{s: sandbox.Session{ID: id, SandboxID: decl.ID, Platform: string(capability.GCP),
		State: sandbox.StateRunning, Generation: 1, CreatedAt: time.Now().UTC(), Labels: decl.Labels, Spec: decl}}
	b.mu.Lock()
	b.sessions[id] = sess
	b.mu.Unlock()
	out := sess.s
	return &out, nil
}

// Terminate deletes the sandbox and succeeds only once the launcher confirms it no longer
// runs commands. An absent sandbox is not an error (the launcher's delete of a missing name
// succeeds).
func (b *Backend) Terminate(ctx context.Context, sessionID string) error {
	if !launcherName.MatchString(sessionID) {
		return fmt.Errorf("%w: session id %q: must match %s", sandbox.ErrInvalid, sessionID, launcherName)
	}
	del, err := argvDelete(sessionID)
	if err != nil {
		return err
	}
	if out, err := b.run(ctx, del); err != nil {
		return fmt.Errorf("%w: terminate %s: launcher delete: %v%s", sandbox.ErrOutcomeUnknown, sessionID, err, out)
	}
	probe, err := argvProbe(sessionID)
	if err != nil {
		return err
	}
	for wait := backoff.New(10*time.Millisecond, 200*time.Millisecond); ; {
		_, err := b.run(ctx, probe)
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			break // the launcher no longer runs a command there
		}
		if err != nil {
			return fmt.Errorf("%w: terminate %s: confirm: %v", sandbox.ErrOutcomeUnknown, sessionID, err)
		}
		if !wait.Wait(ctx) {
			return fmt.Errorf("%w: terminate %s: the sandbox still runs commands after delete: %v", sandbox.ErrOutcomeUnknown, sessionID, ctx.Err())
		}
	}
	b.mu.Lock()
	delete(b.sessions, sessionID)
	b.mu.Unlock()
	return nil
}

// newName is a fresh launcher sandbox name.
func newName() (string, error) {
	var r [8]byte
	if _, err := rand.Read(r[:]); err != nil {
		return "", err
	}
	return "airlock-" + hex.EncodeToString(r[:]), nil
}

// Launcher is the launcher CLI this backend drives.
func (b *Backend) Launcher() string { return b.launcher }

// Close releases nothing: sandboxes live on until deleted or their instance ends.
func (b *Backend) Close() error { return nil }
