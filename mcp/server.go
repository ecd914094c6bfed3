// Package mcp serves run_code and the sandbox session tools over MCP (stdio and streamable HTTP).
package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/strictjson"
	"github.com/airlock-sandbox/airlock/runcode"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// Name is the server's name in the MCP handshake.
const Name = "airlock"

// DefaultMaxSessions bounds the sandboxes that sandbox_create keeps alive at once.
const DefaultMaxSessions = 16

// DefaultMaxConcurrentRuns bounds the run_code sandboxes alive at once; further calls wait.
const DefaultMaxConcurrentRuns = 8

// HTTPPath is where the streamable HTTP transport is served.
const HTTPPath = "/mcp"

// Options configure a Server.
type Options struct {
	// Image is the root filesystem of every sandbox; zero means the host image.
	Image spec.Image
	// Version is reported in the MCP handshake.
	Version string
	// MaxSessions bounds the live sandbox_create sessions; 0 means DefaultMaxSessions.
	MaxSessions int
	// MaxConcurrentRuns bounds concurrent run_code calls (each is a sandbox); later calls
	// wait for a slot. 0 means DefaultMaxConcurrentRuns.
	MaxConcurrentRuns int
	Logger            *slog.Logger
	// Pool, when set, is a process pool run_code claims its sandboxes from (see runcode.Options);
	// its owner closes it after the server.
	Pool runcode.Pool
	// MaxMessageBytes bounds one inbound message on stdio; 0 means DefaultMaxMessageBytes.
	MaxMessageBytes int
	// OutputViewBytes is how much of each of stdout and stderr a tool result keeps for the
	// model: the first and the last half, with a marker of what was cut between them (errors
	// are at the end). 0 means DefaultOutputViewBytes; negative keeps everything up to the
	// output cap (runcode.DefaultOutputBytes).
	OutputViewBytes int64
}

// Server is the airlock MCP server over one backend. Sessions created through it are
// shared by every client of this server (it serves one user: stdio, or HTTP on loopback)
// and terminated by Close.
type Server struct {
	backend sandbox.Backend
	opts    Options
	log     *slog.Logger
	srv     *sdk.Server

	// ctx ends every tool call when the server closes.
	ctx    context.Context
	cancel context.CancelFunc
	calls  sync.WaitGroup
	runs   chan struct{} // run_code slots

	mu       sync.Mutex
	closed   bool
	sessions map[string]*session
	pending  int // sandbox_create calls between their slot check and registration
	// snapshots are the names taken through sandbox_snapshot; Close deletes them.
	snapshots map[string]bool
	// terminated are the sessions sandbox_terminate ended, so that a second call succeeds.
	terminated map[string]bool
}

// New returns a server with every tool registered.
func New(backend sandbox.Backend, opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MaxSessions <= 0 {
		opts.MaxSessions = DefaultMaxSessions
	}
	if opts.MaxConcurrentRuns <= 0 {
		opts.MaxConcurrentRuns = DefaultMaxConcurrentRuns
	}
	if opts.Image == (spec.Image{}) {
		opts.Image = spec.Image{Host: true}
	}
	if opts.Version == "" {
		opts.Version = "dev"
	}
	if opts.MaxMessageBytes <= 0 {
		opts.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if opts.OutputViewBytes == 0 {
		opts.OutputViewBytes = DefaultOutputViewBytes
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		backend: backend, opts: opts, log: opts.Logger,
		ctx: ctx, cancel: cancel,
		runs:       make(chan struct{}, opts.MaxConcurrentRuns),
		sessions:   map[string]*session{},
		snapshots:  map[string]bool{},
		terminated: map[string]bool{},
	}
	s.srv = sdk.NewServer(&sdk.Implementation{Name: Name, Title: "airlock sandboxes", Version: opts.Version}, &sdk.ServerOptions{
		Instructions: "run_code runs a snippet of python, node or bash in a fresh, isolated, disposable sandbox " +
			"(no network unless network is true). For multi-step work, sandbox_create keeps one sandbox " +
			"alive for sandbox_exec, sandbox_write_file and sandbox_read_file; end it with sandbox_terminate.",
		Logger: opts.Logger,
	})
	s.register()
	return s
}

// SDK returns the underlying go-sdk server, to connect any transport.
func (s *Server) SDK() *sdk.Server { return s.srv }

// Close ends every tool call in flight, waits for them, terminates every sandbox created
// through sandbox_create or sandbox_fork, and deletes the snapshots taken through
// sandbox_snapshot. Later calls refuse. Close is idempotent.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	live := make([]*session, 0, len(s.sessions))
	for _, se := range s.sessions {
		live = append(live, se)
	}
	s.sessions = map[string]*session{}
	s.mu.Unlock()
	s.cancel()

	done := make(chan struct{})
	go func() { s.calls.Wait(); close(done) }()
	var errs []error
	select {
	case <-done:
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("tool calls still running at shutdown: %w", ctx.Err()))
	}
	for _, se := range live {
		if err := se.terminate(ctx, s.backend); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, s.deleteSnapshots(ctx)...)
	return errors.Join(errs...)
}

// ServeStdio serves one client over r and w (the process's stdin and stdout, for a client
// that started this process) until the client goes away or ctx ends, then closes the server.
// A message over Options.MaxMessageBytes is answered with an error and the server reads on.
func (s *Server) ServeStdio(ctx context.Context, r io.Reader, w io.Writer) error {
	// Closing the reader (os.Stdin) is what unblocks the read loop when ctx ends first.
	rc, ok := r.(io.ReadCloser)
	if !ok {
		rc = io.NopCloser(r)
	}
	lw := &lockedWriter{w: w}
	// The guard bounds every message the SDK sees; the SDK's own limit would end the connection.
	return s.serveTransport(ctx, &sdk.IOTransport{Reader: newMessageGuard(rc, lw, s.opts.MaxMessageBytes), Writer: lw, MaxLineLength: -1})
}

// serveTransport serves one connection, then closes the server.
func (s *Server) serveTransport(ctx context.Context, t sdk.Transport) error {
	err := s.srv.Run(ctx, t)
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		err = nil
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
	defer cancel()
	return errors.Join(err, s.Close(cctx))
}

// HTTPHandler is the streamable HTTP transport, served at HTTPPath. Requests whose Host is
// not localhost are refused when they arrive on a loopback address, and requests from a
// browser page of another origin are refused whatever their Host (DNS rebinding: the MCP
// specification's Origin rule). A request without a session id must be an initialize: one
// server-side session per client session, never one per stray request.
func (s *Server) HTTPHandler() http.Handler {
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s.srv }, &sdk.StreamableHTTPOptions{Logger: s.log})
	mux := http.NewServeMux()
	mux.Handle(HTTPPath, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := checkOrigin(r); err != nil {
			http.Error(w, "Forbidden: "+err.Error(), http.StatusForbidden)
			return
		}
		if r.Method == http.MethodPost && r.Header.Get("Mcp-Session-Id") == "" {
			body, err := io.ReadAll(io.LimitReader(r.Body, int64(s.opts.MaxMessageBytes)+1))
			if err != nil {
				http.Error(w, "Bad Request: reading the body: "+err.Error(), http.StatusBadRequest)
				return
			}
			if !isInitialize(body) {
				http.Error(w, "Bad Request: no Mcp-Session-Id header: only an initialize request starts a session; send the id its answer gave with every later request", http.StatusBadRequest)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		h.ServeHTTP(w, r)
	}))
	return mux
}

// checkOrigin refuses a request whose Origin header (a browser's) names another origin than
// the server's own address or a loopback one: a page elsewhere must not drive the tools.
func checkOrigin(r *http.Request) error {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return nil // not from a browser page
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return fmt.Errorf("Origin %q is not an http(s) origin of this server", origin)
	}
	if u.Host == r.Host {
		return nil
	}
	host := u.Hostname()
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("Origin %q is not this server (%s) nor a loopback address", origin, r.Host)
}

// isInitialize reports whether body is a JSON-RPC initialize request (alone or in a batch).
func isInitialize(body []byte) bool {
	var one struct {
		Method string `json:"method"`
	}
	if json.Unmarshal(body, &one) == nil {
		return one.Method == "initialize"
	}
	var batch []struct {
		Method string `json:"method"`
	}
	if json.Unmarshal(body, &batch) != nil {
		return false
	}
	for _, m := range batch {
		if m.Method == "initialize" {
			return true
		}
	}
	return false
}

// ServeListener serves the streamable HTTP transport on ln until ctx ends, then shuts the
// HTTP server down and closes the server.
func (s *Server) ServeListener(ctx context.Context, ln net.Listener) error {
	hs := &http.Server{Handler: s.HTTPHandler(), ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return s.ctx }}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	// Tool calls end first (their sandboxes go), then the connections: an open event stream
	// would otherwise hold Shutdown until its timeout.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
	defer cancel()
	cerr := s.Close(cctx)
	for ss := range s.srv.Sessions() {
		ss.Close()
	}
	sctx, scancel := context.WithTimeout(cctx, 5*time.Second)
	defer scancel()
	if serr := hs.Shutdown(sctx); serr != nil {
		hs.Close()
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return errors.Join(err, cerr)
}

// toolError is a tool result that reports err to the model (IsError), not a protocol error.
func toolError(err error) *sdk.CallToolResult {
	r := &sdk.CallToolResult{}
	r.SetError(err)
	return r
}

// handler is a typed tool: it returns the structured output and the text for the model.
type handler[In, Out any] func(ctx context.Context, in In) (Out, string, error)

// addTool registers h with a hand-checked input: the schema is published for the client, and
// the handler decodes strictly (unknown arguments refused) and validates itself, so every
// mistake comes back as a tool error whose message names the argument and what is allowed.
func addTool[In, Out any](s *Server, t *sdk.Tool, patch func(*jsonschema.Schema), h handler[In, Out]) {
	in, err := jsonschema.For[In](nil)
	if err != nil {
		panic(fmt.Sprintf("tool %s: input schema: %v", t.Name, err))
	}
	if patch != nil {
		patch(in)
	}
	out, err := jsonschema.For[Out](nil)
	if err != nil {
		panic(fmt.Sprintf("tool %s: output schema: %v", t.Name, err))
	}
	t.InputSchema, t.OutputSchema = in, out
	s.srv.AddTool(t, func(ctx context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		s.calls.Add(1)
		defer s.calls.Done()
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stop := context.AfterFunc(s.ctx, cancel)
		defer stop()
		if s.isClosed() {
			return toolError(errors.New("the airlock MCP server is shutting down")), nil
		}

		var input In
		if err := decodeArgs(req.Params.Arguments, &input); err != nil {
			return toolError(err), nil
		}
		output, text, err := h(ctx, input)
		if err != nil {
			s.log.Info("tool error", "tool", t.Name, "err", err)
			return toolError(err), nil
		}
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: text}}, StructuredContent: output}, nil
	})
}

// decodeArgs decodes a tool's arguments strictly: an unknown argument is refused rather
// than ignored (a misspelt timeout would otherwise silently get the default).
func decodeArgs(raw json.RawMessage, v any) error {
	if len(raw) == 0 || string(raw) == "null" {
		raw = json.RawMessage("{}")
	}
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var ute *json.UnmarshalTypeError
		name, unknown := strictjson.UnknownField(err)
		switch {
		case errors.As(err, &ute):
			return fmt.Errorf("%w: argument %s must be %s, not a JSON %s", sandbox.ErrInvalid, ute.Field, jsonKind(ute.Type), ute.Value)
		case unknown:
			return fmt.Errorf("%w: unknown argument %s: allowed are %s", sandbox.ErrInvalid, name, strings.Join(argNames(v), ", "))
		}
		return fmt.Errorf("%w: arguments: %v", sandbox.ErrInvalid, err)
	}
	return nil
}

// jsonKind names the JSON type a Go type decodes from.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return t.String()
}

// argNames lists the JSON names of the fields of the struct v points to.
func argNames(v any) []string {
	t := reflect.TypeOf(v).Elem()
	var names []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			names = append(names, name)
		}
	}
	return names
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}
