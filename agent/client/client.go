// Package client is the only client of the airlock agent protocol (docs/agent-protocol.md).
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/internal/jsonhttp"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

// Client talks to one agent. It implements sbtypes.Agent.
type Client struct {
	base    string // "http://host:port" or "http://airlock-agent" for a unix socket
	hc      *http.Client
	token   func() string
	ownsHC  bool
	initErr error
}

var _ sbtypes.Agent = (*Client)(nil)

// New returns a client for the agent at addr: "unix:/path/agent.sock", "tcp:host:port" or an
// http:// URL. tokenFn is called for every request and returns the capability token to send.
// An invalid addr makes every call fail with sbtypes.ErrInvalid.
func New(addr string, tokenFn func() string) *Client {
	c := &Client{token: tokenFn, ownsHC: true}
	network, rest, _ := strings.Cut(addr, ":")
	var dialNet, dialAddr string
	switch {
	case network == "unix" && strings.HasPrefix(rest, "/"):
		dialNet, dialAddr = "unix", rest
		c.base = "http://airlock-agent"
	case network == "tcp" && rest != "":
		dialNet, dialAddr = "tcp", rest
		c.base = "http://" + rest
	case network == "http" && strings.HasPrefix(rest, "//"):
		c.base = strings.TrimSuffix(addr, "/")
		u, err := url.Parse(c.base)
		if err != nil || u.Host == "" {
			c.initErr = fmt.Errorf("%w: agent address %q is not http://host:port", sbtypes.ErrInvalid, addr)
			break
		}
		dialNet, dialAddr = "tcp", u.Host
		if u.Port() == "" {
			dialAddr = net.JoinHostPort(u.Hostname(), "80")
		}
	default:
		c.initErr = fmt.Errorf("%w: agent address %q is not unix:/path, tcp:host:port or http://host:port", sbtypes.ErrInvalid, addr)
	}
	var d net.Dialer
	// HTTP/1.1 only (frame streams and full-duplex stdin rely on it), no proxy, no compression.
	c.hc = &http.Client{Transport: newTransport(func(ctx context.Context) (net.Conn, error) {
		return d.DialContext(ctx, dialNet, dialAddr)
	})}
	return c
}

// NewDial returns a client whose every connection to the agent is made by dial: for an agent
// reached through a launcher's stdio rather than an address (backend/gcp). A connection that
// is a unix socket (a socketpair end) is checked for staleness before reuse like any other.
func NewDial(dial func(ctx context.Context) (net.Conn, error), tokenFn func() string) *Client {
	return &Client{base: "http://airlock-agent", token: tokenFn, ownsHC: true,
		hc: &http.Client{Transport: newTransport(dial)}}
}

// NewHTTP returns a client that sends requests to baseURL with hc (which the caller owns).
func NewHTTP(baseURL string, hc *http.Client, tokenFn func() string) *Client {
	return &Client{base: strings.TrimSuffix(baseURL, "/"), hc: hc, token: tokenFn}
}

// Close releases idle connections.
func (c *Client) Close() error {
	if c.ownsHC {
		c.hc.CloseIdleConnections()
	}
	return nil
}

// Error is an error the agent answered with. errors.Is matches it against the sandbox error
// class its code maps to (sbtypes.ErrNotFound, sbtypes.ErrForbidden, ...).
type Error struct {
	Status  int    // HTTP status, 0 for a terminal error frame
	Code    string // wire code, e.g. "forbidden"
	Reason  string // e.g. the token refusal reason ("expired")
	Message string
}

func (e *Error) Error() string {
	s := "agent: " + e.Message
	if e.Reason != "" {
		s += " (" + e.Reason + ")"
	}
	return s
}

// Unwrap returns the sandbox error class of the code.
func (e *Error) Unwrap() error { return wire.ErrorOf(e.Code) }

func decodeError(status int, body io.Reader) error {
	b, _ := io.ReadAll(io.LimitReader(body, 64<<10))
	var we wire.Error
	if err := json.Unmarshal(b, &we); err != nil || we.Code == "" {
		return &Error{Status: status, Code: codeForStatus(status), Message: fmt.Sprintf("HTTP %d: %s", status, bytes.TrimSpace(b))}
	}
	return &Error{Status: status, Code: we.Code, Reason: we.Reason, Message: we.Message}
}

// codeForStatus classifies an answer that is not a protocol error body (a proxy, a 405).
func codeForStatus(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusMethodNotAllowed:
		return "invalid"
	case http.StatusUnauthorized:
		return "unauthenticated"
	case http.StatusForbidden:
		return "forbidden"
	case http.StatusNotFound:
		return "not_found"
	}
	return wire.CodeInternal
}

// transportError classifies a failed round trip: nothing sent (unreachable) or, for a call that
// changes state, possibly applied (outcome unknown).
func transportError(ctx context.Context, what string, mutating bool, err error) error {
	if ctx.Err() != nil {
		if mutating {
			return fmt.Errorf("%w: %s: %w", sbtypes.ErrOutcomeUnknown, what, ctx.Err())
		}
		return fmt.Errorf("%s: %w", what, ctx.Err())
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return fmt.Errorf("%w: %s: %w", sbtypes.ErrUnreachable, what, err)
	}
	if mutating {
		return fmt.Errorf("%w: %s: %w", sbtypes.ErrOutcomeUnknown, what, err)
	}
	return fmt.Errorf("%w: %s: %w", sbtypes.ErrUnreachable, what, err)
}

// do sends one request and returns the response when its status is want.
func (c *Client) do(ctx context.Context, method, path string, q url.Values, body io.Reader, want int, mutating bool) (*http.Response, error) {
	if c.initErr != nil {
		return nil, c.initErr
	}
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, fmt.Errorf("%w: %s %s: %v", sbtypes.ErrInvalid, method, path, err)
	}
	if c.token != nil {
		if t := c.token(); t != "" {
			req.Header.Set("Authorization", "Bearer "+t)
		}
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, transportError(ctx, method+" "+path, mutating, err)
	}
	if resp.StatusCode != want {
		defer resp.Body.Close()
		return nil, decodeError(resp.StatusCode, resp.Body)
	}
	return resp, nil
}

func (c *Client) doJSON(ctx context.Context, method, path string, q url.Values, in, out any, want int, mutating bool) error {
	body, err := jsonhttp.Body(path, in)
	if err != nil {
		return err
	}
	resp, err := c.do(ctx, method, path, q, body, want, mutating)
	if err != nil {
		return err
	}
	return jsonhttp.Answer(resp, out, method, path, mutating)
}

// Health reports the agent's version, features and kill scope. It needs no token.
func (c *Client) Health(ctx context.Context) (sbtypes.Health, error) {
	var h sbtypes.Health
	err := c.doJSON(ctx, http.MethodGet, "/v1/health", nil, nil, &h, http.StatusOK, false)
	return h, err
}

// AgentHealth is Health with the agent-only fields (idle timeout and the idle budget left).
func (c *Client) AgentHealth(ctx context.Context) (wire.Health, error) {
	var h wire.Health
	err := c.doJSON(ctx, http.MethodGet, "/v1/health", nil, nil, &h, http.StatusOK, false)
	return h, err
}

// Shutdown asks the agent to stop (manage class). As PID 1 that ends the sandbox.
func (c *Client) Shutdown(ctx context.Context) error {
	return c.doJSON(ctx, http.MethodPost, "/v1/shutdown", nil, nil, nil, http.StatusAccepted, true)
}

// ReadFile streams length bytes of path from offset (length <= 0: to the end). A file that
// changes size mid-read ends in io.ErrUnexpectedEOF, never a silently short read.
func (c *Client) ReadFile(ctx context.Context, path string, offset, length int64) (io.ReadCloser, error) {
	q := url.Values{"path": {path}}
	if offset != 0 {
		q.Set("offset", strconv.FormatInt(offset, 10))
	}
	if length > 0 {
		q.Set("length", strconv.FormatInt(length, 10))
	}
	resp, err := c.do(ctx, http.MethodGet, "/v1/files", q, nil, http.StatusOK, false)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// WriteFile atomically replaces path with r's bytes; mode 0 means 0644.
func (c *Client) WriteFile(ctx context.Context, path string, r io.Reader, mode uint32) error {
	q := url.Values{"path": {path}}
	if mode != 0 {
		q.Set("mode", strconv.FormatUint(uint64(mode), 8))
	}
	if r == nil {
		r = http.NoBody
	}
	resp, err := c.do(ctx, http.MethodPut, "/v1/files", q, r, http.StatusOK, true)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

// Mkdir creates path and its missing parents; mode 0 means 0755.
func (c *Client) Mkdir(ctx context.Context, path string, mode uint32) error {
	return c.doJSON(ctx, http.MethodPost, "/v1/files/mkdir", nil, wire.MkdirRequest{Path: path, Mode: mode}, nil, http.StatusOK, true)
}

// List returns the entries of a directory, sorted by name.
func (c *Client) List(ctx context.Context, path string) ([]sbtypes.FileInfo, error) {
	var out []sbtypes.FileInfo
	err := c.doJSON(ctx, http.MethodGet, "/v1/files/list", url.Values{"path": {path}}, nil, &out, http.StatusOK, false)
	return out, err
}

// Stat describes path without following a final symlink.
func (c *Client) Stat(ctx context.Context, path string) (sbtypes.FileInfo, error) {
	var out sbtypes.FileInfo
	err := c.doJSON(ctx, http.MethodGet, "/v1/files/stat", url.Values{"path": {path}}, nil, &out, http.StatusOK, false)
	return out, err
}

// Remove removes path; a non-empty directory needs recursive.
func (c *Client) Remove(ctx context.Context, path string, recursive bool) error {
	return c.doJSON(ctx, http.MethodPost, "/v1/files/remove", nil, wire.RemoveRequest{Path: path, Recursive: recursive}, nil, http.StatusNoContent, true)
}

// Rename renames from to to, replacing a file at to.
func (c *Client) Rename(ctx context.Context, from, to string) error {
	return c.doJSON(ctx, http.MethodPost, "/v1/files/rename", nil, wire.RenameRequest{From: from, To: to}, nil, http.StatusOK, true)
}
