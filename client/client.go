// Package client is the Go SDK for the airlock daemon (`airlock serve`): sandboxes, exec, files, processes and delegated tokens over its HTTP API.
package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/internal/jsonhttp"
	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/server/api"
	"github.com/airlock-sandbox/airlock/spec"
)

// Environment variables FromEnv reads.
const (
	EnvSocket = "AIRLOCK_SOCKET"
	EnvURL    = "AIRLOCK_URL"
	EnvAPIKey = "AIRLOCK_API_KEY"
	EnvToken  = "AIRLOCK_TOKEN"
)

// Options say where the daemon is and who is calling.
type Options struct {
	// Socket is the daemon's unix socket; it is the default (api.DefaultSocket) when BaseURL
	// is empty.
	Socket string
	// BaseURL is the daemon's TCP address, e.g. "https://airlock.internal:7443".
	BaseURL string
	// APIKey, or else Token (a delegated capability token from Sandbox.MintToken), is sent
	// as `Authorization: Bearer`. On the socket neither is needed unless the daemon asks.
	APIKey string
	Token  string
	// TLSConfig is used for an https BaseURL (e.g. a private CA in RootCAs).
	TLSConfig *tls.Config
	// HTTPClient, when set, carries every request as is; Socket and TLSConfig are then unused.
	HTTPClient *http.Client
}

// Client talks to one daemon. It is safe for concurrent use.
type Client struct {
	base   string
	hc     *http.Client
	cred   string
	ownsHC bool
}

// New returns a client; it does not connect until the first call.
func New(opts Options) (*Client, error) {
	if opts.APIKey != "" && opts.Token != "" {
		return nil, fmt.Errorf("%w: client: set APIKey or Token, not both", sandbox.ErrInvalid)
	}
	c := &Client{cred: opts.APIKey}
	if opts.Token != "" {
		c.cred = opts.Token
	}
	tr := &http.Transport{
		Proxy:               nil,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		TLSClientConfig:     opts.TLSConfig,
		// HTTP/1.1: exec sends stdin while its output streams back on one request.
		ForceAttemptHTTP2: false,
	}
	switch {
	case opts.BaseURL != "" && opts.Socket != "":
		return nil, fmt.Errorf("%w: client: set Socket or BaseURL, not both", sandbox.ErrInvalid)
	case opts.BaseURL != "":
		u, err := url.Parse(opts.BaseURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("%w: client: base URL %q: want http(s)://host[:port]", sandbox.ErrInvalid, opts.BaseURL)
		}
		c.base = strings.TrimSuffix(opts.BaseURL, "/")
	default:
		sock := opts.Socket
		if sock == "" {
			sock = api.DefaultSocket
		}
		var d net.Dialer
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", sock)
		}
		c.base = "http://airlock"
	}
	if opts.HTTPClient != nil {
		c.hc = opts.HTTPClient
	} else {
		c.hc = &http.Client{Transport: tr}
		c.ownsHC = true
	}
	return c, nil
}

// Dial returns a client for the daemon's unix socket at path.
func Dial(socketPath string) (*Client, error) { return New(Options{Socket: socketPath}) }

// FromEnv returns a client configured by AIRLOCK_SOCKET or AIRLOCK_URL, and AIRLOCK_API_KEY
// or AIRLOCK_TOKEN; with none set, the default socket.
func FromEnv() (*Client, error) {
	return New(Options{
		Socket: os.Getenv(EnvSocket), BaseURL: os.Getenv(EnvURL),
		APIKey: os.Getenv(EnvAPIKey), Token: os.Getenv(EnvToken),
	})
}

// Close releases idle connections.
func (c *Client) Close() error {
	if c.ownsHC {
		c.hc.CloseIdleConnections()
	}
	return nil
}

// Error is an error the daemon answered with. errors.Is matches it against the sandbox error
// class of its code (sandbox.ErrNotFound, sandbox.ErrRefused, ...); errors.As finds each
// *plan.Refusal of a refused create and each *spec.FieldError of an invalid one.
type Error struct {
	Status    int
	Code      string
	Reason    string
	Message   string
	RequestID string
	Problems  []api.Problem
}

func (e *Error) Error() string {
	s := e.Message
	if s == "" {
		s = e.Code
	}
	if e.Reason != "" && !strings.Contains(s, e.Reason) {
		s += " (" + e.Reason + ")"
	}
	return s
}

// Unwrap returns the error class, then the problems.
func (e *Error) Unwrap() []error {
	var out []error
	if class := api.ClassOf(e.Code); class != nil {
		out = append(out, class)
	}
	for _, p := range e.Problems {
		switch e.Code {
		case "refused":
			out = append(out, &plan.Refusal{SandboxID: p.SandboxID, Field: p.Field, Value: p.Value, Capability: p.Capability, Rule: p.Rule, Message: p.Message})
		case "invalid":
			out = append(out, &spec.FieldError{SandboxID: p.SandboxID, Path: p.Field, Value: p.Value, Rule: p.Rule, Message: p.Message})
		}
	}
	return out
}

func errorOf(b api.Error, status int) *Error {
	return &Error{Status: status, Code: b.Code, Reason: b.Reason, Message: b.Message, RequestID: b.RequestID, Problems: b.Problems}
}

func decodeError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var ae api.Error
	if err := json.Unmarshal(b, &ae); err != nil || ae.Code == "" {
		return &Error{Status: resp.StatusCode, Code: api.CodeForStatus(resp.StatusCode), RequestID: resp.Header.Get(api.RequestIDHeader),
			Message: fmt.Sprintf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(b))}
	}
	return errorOf(ae, resp.StatusCode)
}

// transportError classifies a failed round trip: nothing sent (unreachable) or, for a call
// that changes state, possibly applied (outcome unknown).
func transportError(ctx context.Context, what string, mutating bool, err error) error {
	var op *net.OpError
	switch {
	case ctx.Err() != nil && mutating:
		return fmt.Errorf("%w: %s: %w", sandbox.ErrOutcomeUnknown, what, ctx.Err())
	case ctx.Err() != nil:
		return fmt.Errorf("%s: %w", what, ctx.Err())
	case errors.As(err, &op) && op.Op == "dial":
		return fmt.Errorf("%w: %s: %w", sandbox.ErrUnreachable, what, err)
	case mutating:
		return fmt.Errorf("%w: %s: %w", sandbox.ErrOutcomeUnknown, what, err)
	}
	return fmt.Errorf("%w: %s: %w", sandbox.ErrUnreachable, what, err)
}

// do sends one request and returns the response when its status is 2xx.
func (c *Client) do(ctx context.Context, method, path string, q url.Values, body io.Reader, contentType string, mutating bool) (*http.Response, error) {
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, fmt.Errorf("%w: %s %s: %v", sandbox.ErrInvalid, method, path, err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if c.cred != "" {
		req.Header.Set("Authorization", "Bearer "+c.cred)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, transportError(ctx, method+" "+path, mutating, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

func (c *Client) doJSON(ctx context.Context, method, path string, q url.Values, in, out any, mutating bool) error {
	body, err := jsonhttp.Body(path, in)
	if err != nil {
		return err
	}
	ct := ""
	if body != nil {
		ct = api.ContentTypeJSON
	}
	resp, err := c.do(ctx, method, path, q, body, ct, mutating)
	if err != nil {
		return err
	}
	return jsonhttp.Answer(resp, out, method, path, mutating)
}

func sandboxPath(id string, suffix string) string {
	return api.Version + "/sandboxes/" + url.PathEscape(id) + suffix
}

// Health checks that the daemon answers.
func (c *Client) Health(ctx context.Context) (api.Health, error) {
	var h api.Health
	err := c.doJSON(ctx, http.MethodGet, "/healthz", nil, nil, &h, false)
	return h, err
}

// Capabilities reports what the daemon's backend enforces on its host.
func (c *Client) Capabilities(ctx context.Context) (capability.Set, error) {
	var s capability.Set
	err := c.doJSON(ctx, http.MethodGet, api.Version+"/capabilities", nil, nil, &s, false)
	return s, err
}

// Create creates a sandbox from a declaration. A declaration the daemon's platform cannot
// enforce fails with sandbox.ErrRefused, every refusal reachable with errors.As.
func (c *Client) Create(ctx context.Context, decl spec.Sandbox) (*Sandbox, error) {
	return c.create(ctx, decl)
}

// CreateFromTemplate creates a sandbox from one of the daemon's named templates, with labels
// added over the template's.
func (c *Client) CreateFromTemplate(ctx context.Context, name string, labels map[string]string) (*Sandbox, error) {
	return c.create(ctx, api.CreateRequest{Template: name, Labels: labels})
}

func (c *Client) create(ctx context.Context, body any) (*Sandbox, error) {
	sb := &Sandbox{c: c}
	if err := c.doJSON(ctx, http.MethodPost, api.Version+"/sandboxes", nil, body, &sb.Session, true); err != nil {
		return nil, err
	}
	return sb, nil
}

// Get returns the sandbox with session id id.
func (c *Client) Get(ctx context.Context, id string) (*Sandbox, error) {
	sb := c.Sandbox(id)
	if err := sb.Refresh(ctx); err != nil {
		return nil, err
	}
	return sb, nil
}

// Sandbox returns a handle on session id without asking the daemon (its Session holds only
// the id until Refresh); a delegated caller that may not Get can still Exec through it.
func (c *Client) Sandbox(id string) *Sandbox {
	return &Sandbox{c: c, Session: sandbox.Session{ID: id}}
}

// List returns the sandboxes carrying every label in labels (nil: all). A delegated caller
// sees at most its own session.
func (c *Client) List(ctx context.Context, labels map[string]string) ([]*Sandbox, error) {
	q := url.Values{}
	for k, v := range labels {
		q.Add("label", k+"="+v)
	}
	var out api.SandboxList
	if err := c.doJSON(ctx, http.MethodGet, api.Version+"/sandboxes", q, nil, &out, false); err != nil {
		return nil, err
	}
	sbs := make([]*Sandbox, len(out.Sandboxes))
	for i, s := range out.Sandboxes {
		sbs[i] = &Sandbox{c: c, Session: *s}
	}
	return sbs, nil
}
