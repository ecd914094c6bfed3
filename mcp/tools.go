package mcp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/runcode"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// Session defaults and caps.
const (
	DefaultSessionLifetimeSeconds = 1800
	MaxSessionLifetimeSeconds     = 86400
	DefaultReadBytes              = 1 << 20
	MaxReadBytes                  = 8 << 20
)

type runCodeInput struct {
	Language       string `json:"language" jsonschema:"the language: python, node or bash (aliases py, python3, js, javascript, sh, shell)"`
	Code           string `json:"code" jsonschema:"the program to run, at most 1 MiB; it is written to a file (main.py, main.js or main.sh) in the working directory /workspace and run from there"`
	TimeoutSeconds int    `json:"timeout_seconds,omitempty" jsonschema:"wall-clock limit in seconds (default 30); more than 300 is capped to 300 and the result says so; on expiry the program and everything it started are killed and the exit code is 124"`
	Network        bool   `json:"network,omitempty" jsonschema:"allow connections to the public internet (loopback and private addresses stay unreachable); default false: no network at all"`
	Stdin          string `json:"stdin,omitempty" jsonschema:"text fed to the program's standard input; default: stdin is closed"`
}

type createInput struct {
	Network         bool              `json:"network,omitempty" jsonschema:"allow connections to the public internet (loopback and private addresses stay unreachable); default false: no network at all"`
	Memory          spec.Quantity     `json:"memory,omitempty" jsonschema:"memory ceiling as a Kubernetes quantity, e.g. 512Mi (default), 2Gi"`
	CPU             spec.Quantity     `json:"cpu,omitempty" jsonschema:"cpu ceiling in cores, e.g. 1 (default), 0.5, 2, 250m"`
	MaxProcesses    int64             `json:"max_processes,omitempty" jsonschema:"cap on processes and threads (default 256)"`
	LifetimeSeconds int64             `json:"lifetime_seconds,omitempty" jsonschema:"the sandbox ends by itself after this many seconds, 1 to 86400 (default 1800)"`
	Env             map[string]string `json:"env,omitempty" jsonschema:"environment variables of every command run in the sandbox"`
	// Offered only where the platform has preview and snapshots (registerFeatures).
	PreviewPorts []int  `json:"preview_ports,omitempty" jsonschema:"ports a web server in the sandbox will listen on (bind 127.0.0.1); sandbox_preview_url opens one in a browser"`
	FromSnapshot string `json:"from_snapshot,omitempty" jsonschema:"start with the files of a snapshot taken with sandbox_snapshot"`
}

type sessionInfo struct {
	SessionID    string `json:"session_id" jsonschema:"pass this to sandbox_exec, sandbox_read_file, sandbox_write_file and sandbox_terminate"`
	SandboxID    string `json:"sandbox_id"`
	Workdir      string `json:"workdir" jsonschema:"the working directory; relative paths are resolved against it"`
	Network      bool   `json:"network"`
	Memory       string `json:"memory"`
	CPU          string `json:"cpu"`
	MaxProcesses int64  `json:"max_processes" jsonschema:"the process limit; 0: the platform's own (it has none of airlock's)"`
	CreatedAt    string `json:"created_at"`
	ExpiresAt    string `json:"expires_at" jsonschema:"when the sandbox ends by itself; empty: when the platform ends it"`
	PreviewPorts []int  `json:"preview_ports,omitempty"`
}

type execInput struct {
	SessionID      string            `json:"session_id" jsonschema:"the session from sandbox_create"`
	Command        string            `json:"command" jsonschema:"a shell command line, run with /bin/sh -c"`
	TimeoutSeconds int               `json:"timeout_seconds,omitempty" jsonschema:"wall-clock limit in seconds (default 30); more than 300 is capped to 300 and the result says so; on expiry the command and everything it started are killed and the exit code is 124"`
	Cwd            string            `json:"cwd,omitempty" jsonschema:"working directory (default: the sandbox's workdir); relative to it when not absolute"`
	Stdin          string            `json:"stdin,omitempty" jsonschema:"text fed to standard input; default: stdin is closed"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"extra environment variables for this command"`
	Background     bool              `json:"background,omitempty" jsonschema:"start the command and return at once with a process_id: it keeps running (a server, say) until sandbox_process_kill, the session's end or timeout_seconds when given; read its output with sandbox_process_output"`
}

type readInput struct {
	SessionID string `json:"session_id" jsonschema:"the session from sandbox_create"`
	Path      string `json:"path" jsonschema:"the file; relative to the sandbox's workdir when not absolute"`
	MaxBytes  int64  `json:"max_bytes,omitempty" jsonschema:"read at most this many bytes, 1 to 8388608 (default 1048576)"`
}

type readOutput struct {
	Path string `json:"path"`
	Size int64  `json:"size" jsonschema:"the file's whole size in bytes"`
	// Content is the text, or base64 when the file is not UTF-8.
	Content   string `json:"content"`
	Encoding  string `json:"encoding" jsonschema:"utf-8 or base64"`
	Truncated bool   `json:"truncated" jsonschema:"the file is larger than max_bytes and only its beginning is returned"`
}

type writeInput struct {
	SessionID string `json:"session_id" jsonschema:"the session from sandbox_create"`
	Path      string `json:"path" jsonschema:"the file; relative to the sandbox's workdir when not absolute; missing parent directories are created"`
	Content   string `json:"content" jsonschema:"the file's content"`
	Encoding  string `json:"encoding,omitempty" jsonschema:"how content is encoded: utf-8 (default) or base64"`
	Mode      string `json:"mode,omitempty" jsonschema:"octal permission bits, e.g. 644 (default) or 755"`
}

type writeOutput struct {
	Path  string `json:"path"`
	Bytes int64  `json:"bytes"`
}

type sessionInput struct {
	SessionID string `json:"session_id" jsonschema:"the session from sandbox_create"`
}

type listOutput struct {
	Sandboxes []sessionInfo `json:"sandboxes"`
}

type terminateOutput struct {
	SessionID  string `json:"session_id"`
	Terminated bool   `json:"terminated"`
}

func ptrF(v float64) *float64 { return &v }

func prop(s *jsonschema.Schema, name string) *jsonschema.Schema {
	p, ok := s.Properties[name]
	if !ok {
		panic("schema has no property " + name)
	}
	return p
}

// timeoutSchema: no maximum, since a larger timeout is capped, not refused (run_code's
// specification); 0 means the default, as absent does.
func timeoutSchema(p *jsonschema.Schema) {
	p.Minimum = ptrF(0)
	p.Default = []byte(strconv.Itoa(runcode.DefaultTimeoutSeconds))
}

func (s *Server) register() {
	addTool(s, &sdk.Tool{
		Name:  "run_code",
		Title: "Run code in a fresh sandbox",
		Description: "Runs a python, node or bash program in a fresh, isolated, disposable sandbox " +
			"(512 MiB memory, 1 cpu, 256 processes, no network unless network is true) and returns its " +
			"exit code (124 when killed at its timeout), stdout and stderr" + s.viewNote() + ". Nothing persists between calls.",
		// Disposable: nothing outside the sandbox changes.
		Annotations: &sdk.ToolAnnotations{DestructiveHint: new(false)},
	}, func(in *jsonschema.Schema) {
		l := prop(in, "language")
		for _, n := range runcode.LanguageNames() {
			l.Enum = append(l.Enum, n)
		}
		timeoutSchema(prop(in, "timeout_seconds"))
		prop(in, "network").Default = []byte("false")
	}, s.runCode)

	addTool(s, &sdk.Tool{
		Name:  "sandbox_create",
		Title: "Create a sandbox session",
		Description: "Creates an isolated sandbox that stays alive for several commands (any language the " +
			"image has: python3, node, bash). Use sandbox_exec, sandbox_write_file and sandbox_read_file " +
			"with its session_id, and sandbox_terminate when done; it also ends by itself after lifetime_seconds.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: new(false)},
	}, func(in *jsonschema.Schema) {
		for _, q := range []string{"memory", "cpu"} {
			p := prop(in, q)
			p.Type, p.Types = "", []string{"string", "number"}
		}
		prop(in, "memory").Default = []byte(`"` + runcode.DefaultMemory + `"`)
		prop(in, "cpu").Default = []byte(`"` + runcode.DefaultCPU + `"`)
		mp := prop(in, "max_processes")
		mp.Minimum, mp.Default = ptrF(1), []byte(strconv.FormatInt(runcode.DefaultMaxProcesses, 10))
		prop(in, "network").Default = []byte("false")
		lt := prop(in, "lifetime_seconds")
		lt.Minimum, lt.Maximum, lt.Default = ptrF(1), ptrF(MaxSessionLifetimeSeconds), []byte(strconv.Itoa(DefaultSessionLifetimeSeconds))
		s.patchCreateSchema(in)
	}, s.create)

	addTool(s, &sdk.Tool{
		Name:  "sandbox_exec",
		Title: "Run a command in a sandbox session",
		Description: "Runs a shell command in a sandbox from sandbox_create and returns its exit code (124 when killed at its timeout), stdout and stderr" + s.viewNote() + ". " +
			"Files persist between commands of the same session; processes do not: everything the command started, " +
			"including what it put in the background with & or nohup, is killed when it ends. To keep a process running " +
			"(a server), use background: true, then sandbox_process_output and sandbox_process_kill.",
	}, func(in *jsonschema.Schema) {
		timeoutSchema(prop(in, "timeout_seconds"))
		if !s.hasProcesses() {
			delete(in.Properties, "background")
		} else {
			prop(in, "background").Default = []byte("false")
		}
	}, s.exec)

	addTool(s, &sdk.Tool{
		Name:        "sandbox_read_file",
		Title:       "Read a file from a sandbox session",
		Description: "Reads a file from a sandbox from sandbox_create. Text comes back as is; other content as base64.",
		Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true},
	}, func(in *jsonschema.Schema) {
		p := prop(in, "max_bytes")
		p.Minimum, p.Maximum, p.Default = ptrF(1), ptrF(MaxReadBytes), []byte(strconv.Itoa(DefaultReadBytes))
	}, s.readFile)

	addTool(s, &sdk.Tool{
		Name:        "sandbox_write_file",
		Title:       "Write a file into a sandbox session",
		Description: "Writes (creates or replaces) a file in a sandbox from sandbox_create, creating missing parent directories.",
	}, func(in *jsonschema.Schema) {
		prop(in, "encoding").Enum = []any{"utf-8", "base64"}
		prop(in, "encoding").Default = []byte(`"utf-8"`)
		prop(in, "mode").Pattern = "^0?[0-7]{3}$"
		prop(in, "mode").Default = []byte(`"644"`)
	}, s.writeFile)

	addTool(s, &sdk.Tool{
		Name:        "sandbox_list",
		Title:       "List sandbox sessions",
		Description: "Lists the live sandboxes created with sandbox_create through this server.",
		Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true},
	}, nil, s.list)

	addTool(s, &sdk.Tool{
		Name:        "sandbox_terminate",
		Title:       "Terminate a sandbox session",
		Description: "Destroys a sandbox from sandbox_create and everything in it.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: new(true), IdempotentHint: true},
	}, nil, s.terminate)

	s.registerProcesses()
	s.registerFeatures()
}

func (s *Server) runCode(ctx context.Context, in runCodeInput) (runcode.Result, string, error) {
	select {
	case s.runs <- struct{}{}:
		defer func() { <-s.runs }()
	case <-ctx.Done():
		return runcode.Result{}, "", fmt.Errorf("waiting for a free run_code slot (%d run at once): %w", cap(s.runs), ctx.Err())
	}
	// Exactly the schema's enum: what a client validating against it would send.
	if in.Language != "" && !slices.Contains(runcode.LanguageNames(), in.Language) {
		return runcode.Result{}, "", fmt.Errorf("%w: language %q is not supported: allowed are %s", sandbox.ErrInvalid, in.Language, strings.Join(runcode.LanguageNames(), ", "))
	}
	res, err := runcode.Run(ctx, s.backend, runcode.Request{
		Language: in.Language, Code: in.Code, TimeoutSeconds: in.TimeoutSeconds, Network: in.Network, Stdin: in.Stdin,
	}, runcode.Options{Image: s.opts.Image, Logger: s.log, Pool: s.opts.Pool, ViewBytes: s.viewBytes()})
	if err != nil {
		return runcode.Result{}, "", err
	}
	return res, res.Text(), nil
}

// session is a sandbox created through sandbox_create.
type session struct {
	info  sessionInfo
	agent sandbox.Agent

	// mu guards read and carry: per background process (process.go), the last output frame
	// read, and an incomplete character at its end held for the next read (stdout, stderr).
	mu    sync.Mutex
	read  map[string]uint64
	carry map[string][2][]byte

	once sync.Once
	err  error
}

// terminate closes the agent connection and destroys the sandbox, once.
func (se *session) terminate(ctx context.Context, b sandbox.Backend) error {
	se.once.Do(func() {
		se.agent.Close()
		if err := b.Terminate(ctx, se.info.SessionID); err != nil {
			se.err = fmt.Errorf("terminating sandbox session %s: %w", se.info.SessionID, err)
		}
	})
	return se.err
}

func (s *Server) create(ctx context.Context, in createInput) (sessionInfo, string, error) {
	life := in.LifetimeSeconds
	switch {
	case life == 0:
		life = DefaultSessionLifetimeSeconds
	case life < 0:
		return sessionInfo{}, "", fmt.Errorf("%w: lifetime_seconds %d must be at least 1", sandbox.ErrInvalid, life)
	case life > MaxSessionLifetimeSeconds:
		return sessionInfo{}, "", fmt.Errorf("%w: lifetime_seconds %d is over the cap of %d seconds", sandbox.ErrInvalid, life, MaxSessionLifetimeSeconds)
	}
	// Limits the caller left out stay undeclared: airlock's default where the platform holds
	// it, the platform's own value where it publishes one (plan.Defaults below).
	limits := spec.Limits{CPU: in.CPU, Memory: in.Memory}
	if in.MaxProcesses != 0 {
		limits.MaxProcesses = &in.MaxProcesses
	}
	egress := spec.EgressDeny
	if in.Network {
		egress = spec.EgressAllow
	}
	img, err := s.createFeatures(ctx, in)
	if err != nil {
		return sessionInfo{}, "", err
	}
	noReconnect := false
	decl := spec.Sandbox{
		ID:     "mcp-" + randomHex(6),
		Image:  img,
		Limits: limits,
		Egress: spec.Egress{Mode: egress},
		// The idle timeout is the lifetime: sandbox_terminate, the lifetime and this server's
		// shutdown end a session.
		Session:      spec.Session{MaxLifetimeSeconds: &life, IdleTimeoutSeconds: &life, Reconnect: &noReconnect},
		Labels:       map[string]string{"run.airlock.dev/purpose": "mcp-session"},
		Env:          in.Env,
		PreviewPorts: in.PreviewPorts,
	}
	// What only this server chose (the session's labels; its lifetime and idle timeout when
	// lifetime_seconds is left out) is not asked for where the platform holds none: the
	// platform's own applies. What the caller gave is, and is refused there.
	set := s.backend.Capabilities(ctx)
	if in.LifetimeSeconds == 0 {
		if !set.Has(capability.SessionLifetime) {
			decl.Session.MaxLifetimeSeconds = nil
		}
		if !set.Has(capability.IdleTimeout) {
			decl.Session.IdleTimeoutSeconds = nil
		}
	}
	if !set.Has(capability.Labels) {
		decl.Labels = nil
	}
	if err := runcode.Check(ctx, s.backend, decl, in.Network); err != nil {
		return sessionInfo{}, "", err
	}
	decl = plan.Defaults(s.backend.Platform(), set, decl)
	mem, cpu, procs := string(decl.Limits.Memory), string(decl.Limits.CPU), int64(0)
	if mem == "" {
		mem = set.PlatformValues[capability.PropMemory]
	}
	if cpu == "" {
		cpu = set.PlatformValues[capability.PropCPU]
	}
	if decl.Limits.MaxProcesses != nil {
		procs = *decl.Limits.MaxProcesses
	}

	// A slot is reserved before the (slow) create, so concurrent creates cannot overshoot.
	s.mu.Lock()
	if n := len(s.sessions) + s.pending; n >= s.opts.MaxSessions {
		s.mu.Unlock()
		return sessionInfo{}, "", fmt.Errorf("%w: %d sandbox sessions are live, the most this server keeps: end one with sandbox_terminate first", sandbox.ErrRefused, n)
	}
	s.pending++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.pending--
		s.mu.Unlock()
	}()

	sess, err := s.backend.Create(ctx, decl)
	if err != nil {
		return sessionInfo{}, "", fmt.Errorf("creating the sandbox: %w", err)
	}
	// A backend that publishes no expiry ends the session at its declared lifetime; one left
	// to the platform is not known here.
	expires := ""
	if decl.Session.MaxLifetimeSeconds != nil {
		expires = sess.CreatedAt.Add(time.Duration(*decl.Session.MaxLifetimeSeconds) * time.Second).UTC().Format(time.RFC3339)
	}
	se, err := s.adopt(ctx, sess, sessionInfo{
		Workdir: decl.Workdir, Network: in.Network, Memory: mem, CPU: cpu, MaxProcesses: procs,
		ExpiresAt: expires, PreviewPorts: in.PreviewPorts,
	})
	if err != nil {
		return sessionInfo{}, "", err
	}
	s.log.Info("sandbox session created", "session", sess.ID, "sandbox", decl.ID)

	network := "no network"
	if in.Network {
		network = "public internet allowed"
	}
	ends := "ends by itself at " + se.info.ExpiresAt
	if se.info.ExpiresAt == "" {
		ends = "lives " + set.PlatformValues[capability.PropLifetime]
	}
	text := fmt.Sprintf("Created sandbox session %s (workdir %s, %s memory, %s cpu, %s, %s).\nUse sandbox_exec with session_id %q; end it with sandbox_terminate.",
		sess.ID, decl.Workdir, mem, cpu, network, ends, sess.ID)
	return se.info, text, nil
}

// lookup returns the session created through this server with id.
func (s *Server) lookup(id string) (*session, error) {
	if strings.TrimSpace(id) == "" {
		return nil, fmt.Errorf("%w: session_id is empty: give the session_id sandbox_create returned", sandbox.ErrInvalid)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	se, ok := s.sessions[id]
	if !ok {
		return nil, fmt.Errorf("%w: no live sandbox session %q on this server (sandbox_list shows the live ones)", sandbox.ErrNotFound, id)
	}
	return se, nil
}

// wasTerminated reports whether sandbox_terminate ended session id on this server.
func (s *Server) wasTerminated(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.terminated[id]
}

// resolvePath makes p absolute against workdir, refusing ".." rather than resolving it.
func resolvePath(field, p, workdir string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("%w: %s is empty", sandbox.ErrInvalid, field)
	}
	if slices.Contains(strings.Split(p, "/"), "..") {
		return "", fmt.Errorf("%w: %s %q contains '..': give the path without it", sandbox.ErrInvalid, field, p)
	}
	if !path.IsAbs(p) {
		p = path.Join(workdir, p)
	}
	return path.Clean(p), nil
}

func (s *Server) exec(ctx context.Context, in execInput) (execOutput, string, error) {
	se, err := s.lookup(in.SessionID)
	if err != nil {
		return execOutput{}, "", err
	}
	if strings.TrimSpace(in.Command) == "" {
		return execOutput{}, "", fmt.Errorf("%w: command is empty: give a shell command line", sandbox.ErrInvalid)
	}
	timeout, cappedFrom := in.TimeoutSeconds, 0
	switch {
	case timeout == 0:
		timeout = runcode.DefaultTimeoutSeconds
	case timeout < 0:
		return execOutput{}, "", fmt.Errorf("%w: timeout_seconds %d must be at least 1", sandbox.ErrInvalid, timeout)
	case timeout > runcode.MaxTimeoutSeconds && !in.Background:
		timeout, cappedFrom = runcode.MaxTimeoutSeconds, timeout
	}
	cwd := se.info.Workdir
	if in.Cwd != "" {
		if cwd, err = resolvePath("cwd", in.Cwd, se.info.Workdir); err != nil {
			return execOutput{}, "", err
		}
	}
	if in.Background {
		return s.startBackground(ctx, se, in, cwd, timeout, cappedFrom)
	}
	var stdin io.Reader
	if in.Stdin != "" {
		stdin = strings.NewReader(in.Stdin)
	}
	res, err := runcode.Exec(ctx, se.agent, sandbox.ExecRequest{
		Shell: in.Command, Cwd: cwd, Env: in.Env, Timeout: time.Duration(timeout) * time.Second, Stdin: stdin,
	}, runcode.Options{ViewBytes: s.viewBytes()})
	if err != nil {
		return execOutput{}, "", fmt.Errorf("running the command: %w", err)
	}
	res.TimeoutCappedFrom = cappedFrom
	res.SandboxID = se.info.SandboxID
	res.Memory = se.info.Memory
	return execOutput{Result: res}, res.Text(), nil
}

func (s *Server) readFile(ctx context.Context, in readInput) (readOutput, string, error) {
	se, err := s.lookup(in.SessionID)
	if err != nil {
		return readOutput{}, "", err
	}
	p, err := resolvePath("path", in.Path, se.info.Workdir)
	if err != nil {
		return readOutput{}, "", err
	}
	max := in.MaxBytes
	switch {
	case max == 0:
		max = DefaultReadBytes
	case max < 0:
		return readOutput{}, "", fmt.Errorf("%w: max_bytes %d must be at least 1", sandbox.ErrInvalid, max)
	case max > MaxReadBytes:
		return readOutput{}, "", fmt.Errorf("%w: max_bytes %d is over the cap of %d bytes", sandbox.ErrInvalid, max, MaxReadBytes)
	}
	fi, err := se.agent.Stat(ctx, p)
	if err != nil {
		return readOutput{}, "", fmt.Errorf("reading %s: %w", p, err)
	}
	if fi.Type != "file" {
		return readOutput{}, "", fmt.Errorf("%w: %s is a %s, not a regular file", sandbox.ErrInvalid, p, fi.Type)
	}
	rc, err := se.agent.ReadFile(ctx, p, 0, max)
	if err != nil {
		return readOutput{}, "", fmt.Errorf("reading %s: %w", p, err)
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, max))
	if err != nil {
		return readOutput{}, "", fmt.Errorf("reading %s: %w", p, err)
	}
	out := readOutput{Path: p, Size: fi.Size, Truncated: fi.Size > int64(len(data)), Encoding: "utf-8"}
	var text string
	if utf8.Valid(data) {
		out.Content = string(data)
		text = out.Content
	} else {
		out.Encoding = "base64"
		out.Content = base64.StdEncoding.EncodeToString(data)
		text = fmt.Sprintf("%s is not UTF-8 text; its %d bytes in base64:\n%s", p, len(data), out.Content)
	}
	if out.Truncated {
		text = fmt.Sprintf("(the first %d of %d bytes of %s)\n%s", len(data), fi.Size, p, text)
	}
	return out, text, nil
}

func (s *Server) writeFile(ctx context.Context, in writeInput) (writeOutput, string, error) {
	se, err := s.lookup(in.SessionID)
	if err != nil {
		return writeOutput{}, "", err
	}
	p, err := resolvePath("path", in.Path, se.info.Workdir)
	if err != nil {
		return writeOutput{}, "", err
	}
	var data []byte
	switch strings.ToLower(in.Encoding) {
	case "", "utf-8", "utf8":
		data = []byte(in.Content)
	case "base64":
		if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return writeOutput{}, "", fmt.Errorf("%w: content is not valid base64: %v", sandbox.ErrInvalid, err)
		}
	default:
		return writeOutput{}, "", fmt.Errorf("%w: encoding %q is not supported: allowed are utf-8, base64", sandbox.ErrInvalid, in.Encoding)
	}
	mode := uint64(0o644)
	if in.Mode != "" {
		mode, err = strconv.ParseUint(in.Mode, 8, 32)
		if err != nil || mode > 0o777 {
			return writeOutput{}, "", fmt.Errorf("%w: mode %q is not octal permission bits 000 to 777 (e.g. 644, 755)", sandbox.ErrInvalid, in.Mode)
		}
	}
	if dir := path.Dir(p); dir != "/" && dir != se.info.Workdir {
		if err := se.agent.Mkdir(ctx, dir, 0o755); err != nil {
			return writeOutput{}, "", fmt.Errorf("creating directory %s: %w", dir, err)
		}
	}
	if err := se.agent.WriteFile(ctx, p, bytes.NewReader(data), uint32(mode)); err != nil {
		return writeOutput{}, "", fmt.Errorf("writing %s: %w", p, err)
	}
	return writeOutput{Path: p, Bytes: int64(len(data))}, fmt.Sprintf("Wrote %d bytes to %s.", len(data), p), nil
}

func (s *Server) list(context.Context, struct{}) (listOutput, string, error) {
	s.mu.Lock()
	out := listOutput{Sandboxes: []sessionInfo{}}
	for _, se := range s.sessions {
		out.Sandboxes = append(out.Sandboxes, se.info)
	}
	s.mu.Unlock()
	sort.Slice(out.Sandboxes, func(i, j int) bool {
		a, b := out.Sandboxes[i], out.Sandboxes[j]
		if a.CreatedAt != b.CreatedAt {
			return a.CreatedAt < b.CreatedAt
		}
		return a.SessionID < b.SessionID
	})
	if len(out.Sandboxes) == 0 {
		return out, "No live sandbox sessions.", nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d live sandbox session(s):\n", len(out.Sandboxes))
	for _, x := range out.Sandboxes {
		fmt.Fprintf(&b, "%s  network=%v memory=%s cpu=%s created %s, ends %s\n", x.SessionID, x.Network, x.Memory, x.CPU, x.CreatedAt, x.ExpiresAt)
	}
	return out, b.String(), nil
}

func (s *Server) terminate(ctx context.Context, in sessionInput) (terminateOutput, string, error) {
	se, err := s.lookup(in.SessionID)
	if errors.Is(err, sandbox.ErrNotFound) && s.wasTerminated(in.SessionID) {
		// Idempotent, as advertised: the session is gone, which is what was asked.
		return terminateOutput{SessionID: in.SessionID, Terminated: true}, fmt.Sprintf("Sandbox session %s was already terminated.", in.SessionID), nil
	}
	if err != nil {
		return terminateOutput{}, "", err
	}
	// A terminate outlives a cancelled call: a half-terminated session is worse than a late answer.
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := se.terminate(tctx, s.backend); err != nil {
		return terminateOutput{}, "", err
	}
	s.mu.Lock()
	delete(s.sessions, in.SessionID)
	s.terminated[in.SessionID] = true
	s.mu.Unlock()
	return terminateOutput{SessionID: in.SessionID, Terminated: true}, fmt.Sprintf("Terminated sandbox session %s.", in.SessionID), nil
}

// viewNote says how a tool result's output is shortened, for a tool's description.
func (s *Server) viewNote() string {
	if v := s.viewBytes(); v > 0 {
		return fmt.Sprintf(" (each stream longer than %d bytes keeps its first and last %d bytes, the cut marked)", v, v/2)
	}
	return ""
}

// viewBytes is the per-stream view of a tool result (0: all of it, up to the output cap).
func (s *Server) viewBytes() int64 { return max(s.opts.OutputViewBytes, 0) }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b)
}
