// Package server is the daemon's HTTP API over a sandbox.Backend: what `airlock serve` listens with.
package server

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/server/api"
	"github.com/airlock-sandbox/airlock/spec"
	"github.com/airlock-sandbox/airlock/token"
)

// Defaults.
const (
	DefaultMaxTokenTTL     = time.Hour
	DefaultTokenTTL        = 10 * time.Minute
	DefaultMaxBodyBytes    = 1 << 20
	DefaultShutdownTimeout = 10 * time.Second
	// backendTimeout bounds backend calls made outside a request (metrics scrapes).
	backendTimeout = 10 * time.Second
)

// Options configure a Server.
type Options struct {
	Backend sandbox.Backend
	// Templates are declarations a caller may create from by name ({"template": name}).
	Templates map[string]spec.Sandbox
	// APIKeys are accepted as `Authorization: Bearer <key>` with the daemon's full rights.
	APIKeys []string
	// RequireAPIKeyOnUnix makes callers on the unix socket present an API key as well;
	// otherwise the socket's file permissions are the credential.
	RequireAPIKeyOnUnix bool
	// SigningKey signs delegated capability tokens. It is the daemon's own key, never an
	// agent's: a delegated token is verified by the daemon and reaches no agent.
	SigningKey ed25519.PrivateKey
	// VerifyKeys are further public keys whose tokens are accepted (rotation overlap).
	VerifyKeys []ed25519.PublicKey
	// MaxTokenTTL caps a delegated token's lifetime (default 1h); DefaultTokenTTL applies when
	// a request names none (default 10m).
	MaxTokenTTL     time.Duration
	DefaultTokenTTL time.Duration
	// MaxBodyBytes bounds a JSON or YAML request body (default 1 MiB); file uploads and exec
	// stdin are streams and not bounded here.
	MaxBodyBytes int64
	Logger       *slog.Logger
	// Registry receives the metrics; nil means a fresh one with the Go and process
	// collectors. /metrics serves it.
	Registry *prometheus.Registry
}

// Transport says how a listener's callers are authenticated.
type Transport int

const (
	// Unix: the socket's file permissions are the credential (plus an API key when required).
	Unix Transport = iota
	// TCP: an API key or a delegated token is required on every call.
	TCP
)

func (t Transport) String() string {
	if t == Unix {
		return "unix"
	}
	return "tcp"
}

// Server serves the API for one backend.
type Server struct {
	opts    Options
	backend sandbox.Backend
	log     *slog.Logger
	keys    [][sha256.Size]byte // API keys, hashed so comparing takes the same time for any key
	ring    *token.KeyRing
	metrics *metrics
}

// New checks opts and returns a server.
func New(opts Options) (*Server, error) {
	if opts.Backend == nil {
		return nil, fmt.Errorf("%w: server: no backend", sandbox.ErrInvalid)
	}
	if len(opts.SigningKey) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("%w: server: signing key is %d bytes, want an ed25519 private key (%d)", sandbox.ErrInvalid, len(opts.SigningKey), ed25519.PrivateKeySize)
	}
	if opts.MaxTokenTTL == 0 {
		opts.MaxTokenTTL = DefaultMaxTokenTTL
	}
	if opts.DefaultTokenTTL == 0 {
		opts.DefaultTokenTTL = min(DefaultTokenTTL, opts.MaxTokenTTL)
	}
	if opts.MaxTokenTTL < time.Second || opts.DefaultTokenTTL < time.Second || opts.DefaultTokenTTL > opts.MaxTokenTTL {
		return nil, fmt.Errorf("%w: server: token ttl default %s and maximum %s: both at least 1s, default at most the maximum", sandbox.ErrInvalid, opts.DefaultTokenTTL, opts.MaxTokenTTL)
	}
	if opts.MaxBodyBytes == 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	// A template the platform cannot enforce would refuse every create that names it: say
	// so now, every refusal of every template.
	set, platform := opts.Backend.Capabilities(context.Background()), opts.Backend.Platform()
	var bad []error
	for _, name := range slices.Sorted(maps.Keys(opts.Templates)) {
		res := plan.CheckCreate(opts.Templates[name], platform, set)
		for _, r := range res.Refusals {
			bad = append(bad, fmt.Errorf("template %q: %w", name, r))
		}
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("server: templates this %s backend cannot create: %w", platform, errors.Join(bad...))
	}
	s := &Server{opts: opts, backend: opts.Backend, log: opts.Logger}
	for i, k := range opts.APIKeys {
		if len(k) < MinAPIKeyLen {
			return nil, fmt.Errorf("%w: server: API key %d is %d characters, at least %d required", sandbox.ErrInvalid, i+1, len(k), MinAPIKeyLen)
		}
		s.keys = append(s.keys, sha256.Sum256([]byte(k)))
	}
	var pubs []ed25519.PublicKey
	pubs = append(pubs, opts.SigningKey.Public().(ed25519.PublicKey))
	pubs = append(pubs, opts.VerifyKeys...)
	for _, p := range pubs {
		if err := token.CheckPublicKey(p); err != nil {
			return nil, fmt.Errorf("server: verify key: %w", err)
		}
	}
	s.ring = token.NewKeyRing(pubs...)
	reg := opts.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	m, err := newMetrics(reg, s.backend)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	return s, nil
}

// Endpoint is one listener and how its callers authenticate.
type Endpoint struct {
	Listener  net.Listener
	Transport Transport
	// TLS, when set, serves HTTPS on the listener.
	TLS *tls.Config
}

// Serve serves every endpoint until ctx ends (then shuts down gracefully, waiting up to
// DefaultShutdownTimeout for calls in flight) or one of them fails. It closes the listeners.
func (s *Server) Serve(ctx context.Context, eps ...Endpoint) error {
	if len(eps) == 0 {
		return fmt.Errorf("%w: serve: no endpoint", sandbox.ErrInvalid)
	}
	servers := make([]*http.Server, len(eps))
	errc := make(chan error, len(eps))
	var wg sync.WaitGroup
	for i, ep := range eps {
		hs := &http.Server{
			Handler:           s.Handler(ep.Transport),
			ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout:       2 * time.Minute,
			// No read or write timeout: exec output and file transfers are streams whose
			// length the caller chooses; each exec has its own deadline.
			ErrorLog:  slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
			TLSConfig: ep.TLS,
		}
		servers[i] = hs
		wg.Add(1)
		go func(ep Endpoint) {
			defer wg.Done()
			var err error
			if ep.TLS != nil {
				err = hs.ServeTLS(ep.Listener, "", "")
			} else {
				err = hs.Serve(ep.Listener)
			}
			if !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("serve %s %s: %w", ep.Transport, ep.Listener.Addr(), err)
			}
		}(ep)
		s.log.Info("listening", "transport", ep.Transport.String(), "addr", ep.Listener.Addr().String(), "tls", ep.TLS != nil)
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultShutdownTimeout)
	defer cancel()
	for _, hs := range servers {
		if serr := hs.Shutdown(sctx); serr != nil {
			hs.Close() // streams still running after the grace period are cut
		}
	}
	wg.Wait()
	return err
}

// ListenUnix listens on a unix socket at path with the given mode and, when gid >= 0, group.
// A stale socket file (nobody answers) is replaced; a live one is refused with ErrConflict.
func ListenUnix(path string, mode os.FileMode, gid int) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("socket dir: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("%w: %s exists and is not a socket", sandbox.ErrConflict, path)
		}
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("%w: %s: another daemon is listening", sandbox.ErrConflict, path)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("%w: %s: cannot tell whether a daemon listens: %v", sandbox.ErrConflict, path, err)
		}
		if err := os.Remove(path); err != nil {
			return nil, err
		}
	}
	// The socket is created with the umask's mode; until the chmod below nobody but root
	// may connect, so create it under a tight umask.
	old := syscall.Umask(0o177)
	ln, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, err
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(true)
	if gid >= 0 {
		if err := os.Chown(path, -1, gid); err != nil {
			ln.Close()
			return nil, fmt.Errorf("socket group: %w", err)
		}
	}
	if err := os.Chmod(path, mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("socket mode: %w", err)
	}
	return ln, nil
}

// route is one endpoint: its mux pattern, what it asks of the caller, its handler.
type route struct {
	pattern string
	need    access
	h       http.HandlerFunc
}

// routes is every endpoint; docs/openapi.yaml documents exactly these (a test holds them equal).
func (s *Server) routes() []route {
	v := api.Version
	return []route{
		{"GET /healthz", accessNone, s.health},
		{"GET /metrics", accessAdmin, s.metrics.handler().ServeHTTP},
		{"GET " + v + "/capabilities", accessAny, s.capabilities},

		{"POST " + v + "/sandboxes", accessAdmin, s.create},
		{"GET " + v + "/sandboxes", accessAny, s.list},
		{"GET " + v + "/sandboxes/{id}", accessRead, s.get},
		{"DELETE " + v + "/sandboxes/{id}", accessManage, s.terminate},
		{"POST " + v + "/sandboxes/{id}/pause", accessManage, s.pause},
		{"POST " + v + "/sandboxes/{id}/resume", accessManage, s.resume},
		{"GET " + v + "/sandboxes/{id}/stats", accessRead, s.stats},
		{"POST " + v + "/sandboxes/{id}/tokens", accessAdmin, s.mintToken},
		// Egress is the creator's decision: a delegated token may not widen it.
		{"PUT " + v + "/sandboxes/{id}/egress", accessAdmin, s.setEgress},
		{"GET " + v + "/sandboxes/{id}/egress/counters", accessRead, s.egressCounters},
		// A preview reaches the sandbox's port, which its execute-class holder can already
		// reach by exec (the preview proxy takes that token too).
		{"POST " + v + "/sandboxes/{id}/previews", accessExecute, s.preview},
		// Snapshots live in the daemon's one store, under names of the daemon's namespace, and
		// a fork creates sandboxes: daemon rights, like create.
		{"POST " + v + "/sandboxes/{id}/snapshots", accessAdmin, s.snapshot},
		{"POST " + v + "/sandboxes/{id}/fork", accessAdmin, s.fork},
		{"GET " + v + "/snapshots", accessAdmin, s.listSnapshots},
		{"DELETE " + v + "/snapshots/{name}", accessAdmin, s.deleteSnapshot},

		{"POST " + v + "/sandboxes/{id}/exec", accessExecute, s.exec},
		{"GET " + v + "/sandboxes/{id}/files", accessExecute, s.readFile},
		{"PUT " + v + "/sandboxes/{id}/files", accessExecute, s.writeFile},
		{"DELETE " + v + "/sandboxes/{id}/files", accessExecute, s.removeFile},
		{"GET " + v + "/sandboxes/{id}/files/stat", accessExecute, s.statFile},
		{"GET " + v + "/sandboxes/{id}/files/list", accessExecute, s.listFiles},
		{"POST " + v + "/sandboxes/{id}/files/mkdir", accessExecute, s.mkdir},

		{"POST " + v + "/sandboxes/{id}/processes", accessExecute, s.startProcess},
		{"GET " + v + "/sandboxes/{id}/processes", accessExecute, s.listProcesses},
		{"GET " + v + "/sandboxes/{id}/processes/{pid}", accessExecute, s.getProcess},
		{"DELETE " + v + "/sandboxes/{id}/processes/{pid}", accessExecute, s.removeProcess},
		{"GET " + v + "/sandboxes/{id}/processes/{pid}/output", accessExecute, s.attachProcess},
		{"POST " + v + "/sandboxes/{id}/processes/{pid}/stdin", accessExecute, s.processStdin},
		{"POST " + v + "/sandboxes/{id}/processes/{pid}/signal", accessExecute, s.signalProcess},
		{"GET " + v + "/sandboxes/{id}/processes/{pid}/wait", accessExecute, s.waitProcess},
		{"POST " + v + "/sandboxes/{id}/processes/{pid}/resize", accessExecute, s.resizeProcess},
	}
}

// Handler returns the API for callers arriving over transport t.
func (s *Server) Handler(t Transport) http.Handler {
	mux := http.NewServeMux()
	for _, rt := range s.routes() {
		mux.Handle(rt.pattern, s.guard(t, rt.need, rt.h))
	}
	// Anything else (an unknown path or method): a JSON 404 like every other error.
	mux.Handle("/", s.guard(t, accessNone, func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, fmt.Errorf("%w: no endpoint %s %s", sandbox.ErrNotFound, r.Method, r.URL.Path))
	}))
	return s.withRequestID(mux)
}
