package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/server/api"
	"github.com/airlock-sandbox/airlock/token"
)

// Sandbox is one session on the daemon. Session is what the daemon last said of it.
type Sandbox struct {
	sandbox.Session
	c *Client
}

// Token is a delegated capability token and what it grants.
type Token = api.TokenResponse

func (sb *Sandbox) path(suffix string) string { return sandboxPath(sb.ID, suffix) }

// Refresh reloads the session from the daemon.
func (sb *Sandbox) Refresh(ctx context.Context) error {
	var s sandbox.Session
	if err := sb.c.doJSON(ctx, http.MethodGet, sb.path(""), nil, nil, &s, false); err != nil {
		return err
	}
	sb.Session = s
	return nil
}

// Terminate destroys the sandbox; it is done when this returns nil.
func (sb *Sandbox) Terminate(ctx context.Context) error {
	return sb.c.doJSON(ctx, http.MethodDelete, sb.path(""), nil, nil, nil, true)
}

// Pause freezes the sandbox (sandbox.ErrUnsupported where the backend cannot).
func (sb *Sandbox) Pause(ctx context.Context) error {
	return sb.c.doJSON(ctx, http.MethodPost, sb.path("/pause"), nil, nil, &sb.Session, true)
}

// Resume thaws a paused sandbox.
func (sb *Sandbox) Resume(ctx context.Context) error {
	return sb.c.doJSON(ctx, http.MethodPost, sb.path("/resume"), nil, nil, &sb.Session, true)
}

// Stats reads the sandbox's resource usage (sandbox.ErrUnsupported where the backend cannot).
func (sb *Sandbox) Stats(ctx context.Context) (sandbox.Stats, error) {
	var st sandbox.Stats
	err := sb.c.doJSON(ctx, http.MethodGet, sb.path("/stats"), nil, nil, &st, false)
	return st, err
}

// MintToken asks the daemon for a capability token limited to this session and class, valid
// for ttl (0: the daemon's default). Hand it to a less trusted caller, who uses it as
// Options.Token.
func (sb *Sandbox) MintToken(ctx context.Context, class token.Class, ttl time.Duration) (Token, error) {
	req := api.TokenRequest{Class: class}
	if ttl != 0 {
		req.TTLSeconds = int64((ttl + time.Second - 1) / time.Second)
	}
	var t Token
	err := sb.c.doJSON(ctx, http.MethodPost, sb.path("/tokens"), nil, req, &t, true)
	return t, err
}

// ExecOptions are exec settings beyond sandbox.ExecRequest.
type ExecOptions struct {
	// Rows and Cols set the terminal size of a TTY exec.
	Rows, Cols int
}

func toAPI(req sandbox.ExecRequest, opts ExecOptions) (api.ExecRequest, error) {
	if req.Timeout < 0 {
		return api.ExecRequest{}, fmt.Errorf("%w: timeout %s: must be positive (0 means %s)", sandbox.ErrInvalid, req.Timeout, api.DefaultExecTimeout)
	}
	ms := req.Timeout.Milliseconds()
	if time.Duration(ms)*time.Millisecond < req.Timeout {
		ms++ // never shorten a deadline by rounding
	}
	return api.ExecRequest{
		Argv: req.Argv, Shell: req.Shell, Cwd: req.Cwd, Env: req.Env, TimeoutMs: ms, Stdin: req.Stdin != nil,
		MaxStdout: req.MaxStdout, MaxStderr: req.MaxStderr, TTY: req.TTY, Rows: opts.Rows, Cols: opts.Cols,
	}, nil
}

// Exec runs a command to completion, writing its output to stdout and stderr (nil discards)
// as the daemon streams it, and req.Stdin (when set) to the command while it runs; its end
// closes the command's stdin. The error is nil whenever the command ran to an end, whatever
// its exit code; a deadline shows as TimedOut in the result. Like any net/http request body,
// req.Stdin is read from another goroutine, which a Read that never returns keeps alive.
func (sb *Sandbox) Exec(ctx context.Context, req sandbox.ExecRequest, stdout, stderr io.Writer) (sandbox.ExecResult, error) {
	return sb.ExecWith(ctx, req, ExecOptions{}, stdout, stderr)
}

// ExecWith is Exec with options.
func (sb *Sandbox) ExecWith(ctx context.Context, req sandbox.ExecRequest, opts ExecOptions, stdout, stderr io.Writer) (sandbox.ExecResult, error) {
	hdr, err := toAPI(req, opts)
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	b, err := json.Marshal(hdr)
	if err != nil {
		return sandbox.ExecResult{}, fmt.Errorf("%w: encode exec request: %v", sandbox.ErrInvalid, err)
	}
	var body io.Reader = bytes.NewReader(b)
	if req.Stdin != nil {
		// The JSON header, one newline, then stdin for as long as it lasts.
		body = io.MultiReader(bytes.NewReader(append(b, '\n')), req.Stdin)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // leaving early (a writer failed) hangs up, which kills the command
	resp, err := sb.c.do(ctx, http.MethodPost, sb.path("/exec"), nil, body, api.ContentTypeJSON, true)
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	defer resp.Body.Close()
	return readEvents(resp, stdout, stderr)
}

// maxEventLine bounds one NDJSON line: a 1 MiB output chunk in base64 plus its envelope.
const maxEventLine = 2 << 20

// readEvents copies an NDJSON event stream to stdout and stderr until its terminal event.
func readEvents(resp *http.Response, stdout, stderr io.Writer) (sandbox.ExecResult, error) {
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), maxEventLine)
	var last uint64
	for sc.Scan() {
		var ev api.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return sandbox.ExecResult{}, fmt.Errorf("%w: exec stream: bad event: %v", sandbox.ErrOutcomeUnknown, err)
		}
		switch {
		case ev.Exit != nil:
			return *ev.Exit, nil
		case ev.Error != nil:
			return sandbox.ExecResult{}, errorOf(*ev.Error, resp.StatusCode)
		}
		if ev.Seq <= last {
			return sandbox.ExecResult{}, fmt.Errorf("%w: exec stream: sequence %d after %d", sandbox.ErrOutcomeUnknown, ev.Seq, last)
		}
		last = ev.Seq
		w := stdout
		if ev.Stream == sandbox.Stderr {
			w = stderr
		}
		if w == nil {
			continue
		}
		if _, err := w.Write(ev.Data); err != nil {
			return sandbox.ExecResult{}, fmt.Errorf("exec: write %s: %w (the command was killed)", ev.Stream, err)
		}
	}
	if err := sc.Err(); err != nil {
		return sandbox.ExecResult{}, fmt.Errorf("%w: exec stream: %w", sandbox.ErrOutcomeUnknown, err)
	}
	return sandbox.ExecResult{}, fmt.Errorf("%w: exec stream ended without a terminal event", sandbox.ErrOutcomeUnknown)
}

// ReadFile streams a file out of the sandbox. A transfer cut short fails the read with an
// error; it never looks like a complete, shorter file.
func (sb *Sandbox) ReadFile(ctx context.Context, path string) (io.ReadCloser, error) {
	return sb.ReadFileRange(ctx, path, 0, 0)
}

// ReadFileRange streams length bytes (<= 0: to the end) of a file from offset.
func (sb *Sandbox) ReadFileRange(ctx context.Context, path string, offset, length int64) (io.ReadCloser, error) {
	q := url.Values{"path": {path}}
	if offset != 0 {
		q.Set("offset", strconv.FormatInt(offset, 10))
	}
	if length > 0 {
		q.Set("length", strconv.FormatInt(length, 10))
	}
	resp, err := sb.c.do(ctx, http.MethodGet, sb.path("/files"), q, nil, "", false)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// WriteFile streams r into a file in the sandbox, replacing it atomically; mode 0 means 0644.
func (sb *Sandbox) WriteFile(ctx context.Context, path string, r io.Reader, mode uint32) error {
	q := url.Values{"path": {path}}
	if mode != 0 {
		q.Set("mode", strconv.FormatUint(uint64(mode), 8))
	}
	if r == nil {
		r = http.NoBody
	}
	resp, err := sb.c.do(ctx, http.MethodPut, sb.path("/files"), q, r, api.ContentTypeBytes, true)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// Stat describes a path without following a final symlink.
func (sb *Sandbox) Stat(ctx context.Context, path string) (sandbox.FileInfo, error) {
	var fi sandbox.FileInfo
	err := sb.c.doJSON(ctx, http.MethodGet, sb.path("/files/stat"), url.Values{"path": {path}}, nil, &fi, false)
	return fi, err
}

// ListFiles returns a directory's entries, sorted by name.
func (sb *Sandbox) ListFiles(ctx context.Context, path string) ([]sandbox.FileInfo, error) {
	var out api.FileList
	err := sb.c.doJSON(ctx, http.MethodGet, sb.path("/files/list"), url.Values{"path": {path}}, nil, &out, false)
	return out.Files, err
}

// Mkdir creates a directory and its missing parents; mode 0 means 0755.
func (sb *Sandbox) Mkdir(ctx context.Context, path string, mode uint32) error {
	return sb.c.doJSON(ctx, http.MethodPost, sb.path("/files/mkdir"), nil, api.MkdirRequest{Path: path, Mode: mode}, nil, true)
}

// Remove removes a path; a non-empty directory needs recursive.
func (sb *Sandbox) Remove(ctx context.Context, path string, recursive bool) error {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "true")
	}
	return sb.c.doJSON(ctx, http.MethodDelete, sb.path("/files"), q, nil, nil, true)
}
