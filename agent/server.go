//go:build linux

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/internal/strictjson"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
	"github.com/airlock-sandbox/airlock/token"
)

// drainGrace is how long a client that stopped reading may hold an exec's stream after the
// exec's deadline; past it the agent gives up on that client.
const drainGrace = 30 * time.Second

type server struct {
	cfg   Config
	ring  *token.KeyRing
	cg    *cgroups
	spawn *spawner
	files *files
	procs *processes
	log   *slog.Logger
	act   *activity
	gate  *idleGate

	// verified caches tokens ring accepted (ring never changes after Serve starts).
	verified verified

	life     context.Context // cancelled when the agent stops: every job is killed
	stop     context.CancelFunc
	shutdown chan struct{} // closed by POST /v1/shutdown
	once     sync.Once
}

// Serve runs the agent on cfg.Listen until ctx is done or, with ShutdownOnManage, a manage
// token asks it to stop. Every command it started is dead when it returns.
func Serve(ctx context.Context, cfg Config, hooks Hooks) error {
	ring, err := cfg.check()
	if err != nil {
		return err
	}
	cg, err := newCgroups(&cfg)
	if err != nil {
		return fmt.Errorf("%w: %v", sbtypes.ErrInvalid, err)
	}
	defer cg.closeFiles()
	spareThreads(cfg.SpareThreads)
	// The spawner thread (a new OS thread, its cgroup, PrepareSpawnThread's filters) gets ready
	// while this goroutine opens the files root and the socket; serving waits for it.
	sp := newSpawner(&cfg)
	sp.begin(hooks.PrepareSpawnThread)
	spawnerUp := false
	defer func() {
		if !spawnerUp {
			sp.abandon()
		}
	}()
	fs, err := newFiles(&cfg)
	if err != nil {
		return err
	}
	defer fs.close()
	network, addr, _ := splitListen(cfg.Listen)
	if network == "unix" {
		if err := os.Remove(addr); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("agent: remove stale socket %s: %w", addr, err)
		}
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		return fmt.Errorf("%w: agent: listen %s: %v", sbtypes.ErrRefused, cfg.Listen, err)
	}
	if network == "unix" {
		defer os.Remove(addr)
		// Only the agent's uid may connect: the code's uid must not reach its own agent's
		// socket without a token anyway, but it should not even get to try.
		if err := os.Chmod(addr, 0o600); err != nil {
			ln.Close()
			return fmt.Errorf("agent: chmod socket: %w", err)
		}
		if cfg.SocketUID != 0 {
			if err := os.Lchown(addr, cfg.SocketUID, -1); err != nil {
				ln.Close()
				return fmt.Errorf("agent: give the socket to uid %d: %w", cfg.SocketUID, err)
			}
		}
	}
	if err := applyProcessLimit(cfg.MaxProcesses); err != nil {
		ln.Close()
		return err
	}
	if err := sp.ready(); err != nil {
		ln.Close()
		return err
	}
	spawnerUp = true
	if cg.kind == scopeReaper {
		sp.refill() // the first exec's reaper, started while the caller learns the agent is up
	}
	life, stop := context.WithCancel(context.Background())
	s := &server{
		cfg: cfg, ring: ring, cg: cg, spawn: sp, files: fs, log: slog.Default().With("component", "agent"),
		life: life, stop: stop, shutdown: make(chan struct{}), act: newActivity(cfg.IdleTimeout),
	}
	s.gate = newIdleGate(s.act, cfg.IdleFromFirstCall)
	s.procs = newProcesses(s)
	hs := &http.Server{
		Handler:           s.routes(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		BaseContext:       func(net.Listener) context.Context { return life },
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	idle := make(chan struct{})
	watching := make(chan struct{})
	if cfg.IdleTimeout > 0 {
		go func() {
			defer close(watching)
			s.act.watch(life, idle)
		}()
	} else {
		close(watching)
	}
	var deadline <-chan time.Time
	if !cfg.Deadline.IsZero() {
		t := time.NewTimer(time.Until(cfg.Deadline))
		defer t.Stop()
		deadline = t.C
	}
	if hooks.Ready != nil {
		hooks.Ready(ln.Addr().String())
	}
	token.PrecomputeVerify() // while the caller sends its first request
	var serveErr, idleErr error
	select {
	case <-ctx.Done():
	case <-deadline:
		idleErr = fmt.Errorf("%w at %v", ErrLifetime, cfg.Deadline.UTC().Format(time.RFC3339))
		s.log.Info("session lifetime ended: stopping", "deadline", cfg.Deadline)
	case <-s.shutdown:
	case serveErr = <-served:
	case <-idle:
		frozen := s.act.frozenTotal().Round(time.Millisecond)
		idleErr = fmt.Errorf("%w: nothing active for %v (%v frozen not counted)", ErrIdle, cfg.IdleTimeout, frozen)
		s.log.Info("idle timeout: stopping", "idleTimeout", cfg.IdleTimeout, "frozenNotCounted", frozen)
	}
	// Kill every job first so in-flight streams end with their terminal frames, then let the
	// handlers finish writing them.
	stop()
	s.procs.killAll()
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_ = hs.Shutdown(sctx)
	cancel()
	hs.Close()
	if serveErr == nil {
		<-served
	}
	s.procs.wait()
	if err := cg.close(); err != nil {
		s.log.Error("remove the pre-made exec cgroup", "err", err)
	}
	sp.dropNext()
	sp.close()
	<-watching
	if errors.Is(serveErr, http.ErrServerClosed) {
		serveErr = nil
	}
	if serveErr == nil {
		serveErr = idleErr
	}
	return serveErr
}

func (s *server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/health", s.health)
	mux.HandleFunc("POST /v1/shutdown", s.authed(token.Manage, s.shutdownHandler))
	mux.HandleFunc("POST /v1/exec", s.authed(token.Execute, s.execHandler))
	s.filesRoutes(mux)
	s.processRoutes(mux)
	mux.HandleFunc("POST /v1/processes/{id}/handoff", s.authed(token.Execute, s.procHandler(s.handoffHandler)))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, fmt.Errorf("%w: no endpoint %s %s in protocol v%d", sbtypes.ErrNotFound, r.Method, r.URL.Path, wire.ProtocolVersion))
	})
	return mux
}

func (s *server) features() map[string]bool {
	return map[string]bool{
		"exec":         true,
		"stdin":        true,
		"tty":          true,
		"processes":    true,
		"files":        true,
		"shutdown":     s.cfg.ShutdownOnManage,
		"oomDetection": s.cg.oomDetection(),
		"oomPerExec":   s.cg.oomPerExec(),
		"idleTimeout":  true,
	}
}

func (s *server) health(w http.ResponseWriter, r *http.Request) {
	if err := onlyQuery(r); err != nil {
		writeError(w, err)
		return
	}
	hl := wire.Health{Health: sbtypes.Health{
		Version:         Version,
		ProtocolVersion: wire.ProtocolVersion,
		SandboxID:       s.cfg.SandboxID,
		Features:        s.features(),
		KillScope:       s.cg.kind,
	}}
	if s.cfg.IdleTimeout > 0 {
		hl.IdleTimeoutMs = s.cfg.IdleTimeout.Milliseconds()
		hl.IdleRemainingMs = max(s.act.remaining().Milliseconds(), 0)
	}
	writeJSON(w, http.StatusOK, hl)
}

// authed verifies the bearer token for class before h runs.
func (s *server) authed(class token.Class, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		if auth == "" {
			auth = r.Header.Get(wire.HeaderAuthorization) // through an API server's pod proxy
		}
		scheme, tok, _ := strings.Cut(auth, " ")
		if auth == "" || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="airlock-agent"`)
			writeError(w, fmt.Errorf("%w: this call needs Authorization: Bearer <capability token of class %s>", sbtypes.ErrUnauthenticated, class))
			return
		}
		tok = strings.TrimSpace(tok)
		now := time.Now()
		var err error
		if !s.verified.ok(tok, class, now) {
			var c token.Claims
			c, err = token.Verify(s.ring, tok, token.Expect{
				Sandbox:    s.cfg.SandboxID,
				Session:    s.cfg.SessionID,
				Generation: s.cfg.Generation,
				Class:      class,
				Now:        now,
			})
			if err == nil {
				s.verified.add(tok, class, c)
			}
		}
		if err != nil {
			var te *token.Error
			if errors.As(err, &te) {
				writeErrorReason(w, fmt.Errorf("%w: %v", sbtypes.ErrForbidden, err), string(te.Reason))
				return
			}
			s.log.Error("token verification could not run", "err", err)
			writeError(w, fmt.Errorf("token verification failed: %v", err))
			return
		}
		// An authenticated call keeps the agent from going idle until it has finished
		// (an exec or attach stream: until the stream ends).
		defer s.act.begin()()
		s.gate.open()
		h(w, r)
	}
}

func (s *server) shutdownHandler(w http.ResponseWriter, r *http.Request) {
	if err := onlyQuery(r); err != nil {
		writeError(w, err)
		return
	}
	if !s.cfg.ShutdownOnManage {
		writeError(w, fmt.Errorf("%w: this agent was started without shutdownOnManage", sbtypes.ErrUnsupported))
		return
	}
	writeJSON(w, http.StatusAccepted, struct{}{})
	s.once.Do(func() { close(s.shutdown) })
}

// onlyQuery refuses any query parameter not in allowed, naming it.
func onlyQuery(r *http.Request, allowed ...string) error {
	for k := range r.URL.Query() {
		ok := false
		for _, a := range allowed {
			ok = ok || a == k
		}
		if !ok {
			return fmt.Errorf("%w: query parameter %q is not known here (allowed: %s)", sbtypes.ErrInvalid, k, strings.Join(allowed, ", "))
		}
	}
	return nil
}

// queryBool is query parameter name as a boolean (strconv.ParseBool's forms), def when absent.
func queryBool(r *http.Request, name string, def bool) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%w: query parameter %s=%q is not a boolean", sbtypes.ErrInvalid, name, v)
	}
	return b, nil
}

// readRequest reads a request that takes no query parameters and whose body is one JSON object.
func readRequest(r *http.Request, v any) error {
	if err := onlyQuery(r); err != nil {
		return err
	}
	return decodeJSON(r.Body, v)
}

// decodeJSON reads exactly one JSON object from body, refusing unknown fields and trailing data.
func decodeJSON(body io.Reader, v any) error {
	dec := json.NewDecoder(io.LimitReader(body, maxRequestHeader))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if dec.More() {
		return fmt.Errorf("%w: request body has data after the JSON object", sbtypes.ErrInvalid)
	}
	return nil
}

// jsonError turns a decoding error into an invalid-request error that names the field.
func jsonError(err error) error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	name, unknown := strictjson.UnknownField(err)
	switch {
	case errors.Is(err, sbtypes.ErrTooLarge):
		return err
	case errors.As(err, &te):
		return fmt.Errorf("%w: field %q: %s is not allowed, want %s", sbtypes.ErrInvalid, te.Field, te.Value, te.Type)
	case errors.As(err, &se):
		return fmt.Errorf("%w: request body is not valid JSON at offset %d: %v", sbtypes.ErrInvalid, se.Offset, err)
	case unknown:
		return fmt.Errorf("%w: unknown field %s", sbtypes.ErrInvalid, name)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("%w: request body ends before the JSON object does", sbtypes.ErrInvalid)
	}
	return fmt.Errorf("%w: request body: %v", sbtypes.ErrInvalid, err)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, err error) { writeErrorReason(w, err, "") }

func writeErrorReason(w http.ResponseWriter, err error, reason string) {
	code, status := wire.CodeOf(err)
	writeJSON(w, status, wire.Error{Code: code, Reason: reason, Message: err.Error()})
}
