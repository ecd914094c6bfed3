// Package kubernetes is the sandbox.Backend for applications in a cluster: the airlock broker's client plus the agent client.
package kubernetes

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/operator/brokerapi"
	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// DefaultTokenFile is where a pod's projected ServiceAccount token for the broker is mounted
// (see docs/kubernetes.md: a projected volume with audience airlock-broker).
const DefaultTokenFile = "/var/run/secrets/airlock/token"

// Config says how to reach the broker and who the caller is.
type Config struct {
	// BrokerURL is the broker's base URL, e.g. http://airlock-broker.airlock-system.svc.
	BrokerURL string
	// Namespace holds the Sandboxes this backend claims from.
	Namespace string
	// Token returns the caller's ServiceAccount token (audience airlock-broker). Default: read
	// TokenFile on every call, so a rotated projected token is picked up.
	Token func(ctx context.Context) (string, error)
	// TokenFile is read when Token is nil (default DefaultTokenFile).
	TokenFile string
	// CAFile is a PEM bundle the broker's certificate must chain to (an https BrokerURL; default:
	// the system roots). ServerName is the name the certificate must carry when BrokerURL's host
	// is not it (e.g. a pod IP; default: the URL's host). Both apply when HTTPClient is nil.
	CAFile     string
	ServerName string
	// HTTPClient talks to the broker (default: a client with a 90 s timeout).
	HTTPClient *http.Client
	// AgentBase returns the base URL of a claimed pod's agent (default: http:// and the grant's
	// endpoint; Discover sets the API server's pod proxy when pod addresses do not route), and
	// AgentHTTPClient carries those calls (default: direct, AgentDialTimeout).
	AgentBase       func(g *brokerapi.Grant) (string, error)
	AgentHTTPClient *http.Client

	// Sandbox, when set, serves declarations whose id is not its own (airlock run and
	// run_code generate theirs) if they fit it; see Create.
	Sandbox string

	// closers release what Discover made for this Config (its API server clients).
	closers []func()
}

// Backend implements sandbox.Backend against the broker. Create claims a warm pod of the Sandbox
// named like the declaration's id; the declaration must equal the Sandbox's.
type Backend struct {
	cfg   Config
	base  *url.URL
	hc    *http.Client
	ownHC bool

	// agentHC is shared by every agent client: one connection pool, and a dial timeout, because
	// a deleted pod's address silently drops SYNs and the kernel's retries take minutes.
	agentHC *http.Client

	mu     sync.Mutex
	grants map[string]*brokerapi.Grant // by session id: endpoint and tokens
}

// AgentDialTimeout bounds connecting to a pod's agent.
const AgentDialTimeout = 5 * time.Second

var _ sandbox.Backend = (*Backend)(nil)

// New checks cfg and returns a backend.
func New(cfg Config) (*Backend, error) {
	u, err := url.Parse(cfg.BrokerURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: kubernetes backend: broker URL %q is not http(s)://host[:port]", sandbox.ErrInvalid, cfg.BrokerURL)
	}
	if cfg.Namespace == "" {
		return nil, fmt.Errorf("%w: kubernetes backend: namespace is empty", sandbox.ErrInvalid)
	}
	if cfg.Token == nil {
		f := cfg.TokenFile
		if f == "" {
			f = DefaultTokenFile
		}
		cfg.Token = func(context.Context) (string, error) {
			b, err := os.ReadFile(f)
			if err != nil {
				return "", fmt.Errorf("%w: broker token: %v", sandbox.ErrUnauthenticated, err)
			}
			return strings.TrimSpace(string(b)), nil
		}
	}
	if (cfg.CAFile != "" || cfg.ServerName != "") && (u.Scheme != "https" || cfg.HTTPClient != nil) {
		return nil, fmt.Errorf("%w: kubernetes backend: CAFile and ServerName need an https broker URL and no HTTPClient", sandbox.ErrInvalid)
	}
	hc, ownHC := cfg.HTTPClient, false
	if hc == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: cfg.ServerName}
		if cfg.CAFile != "" {
			pem, err := os.ReadFile(cfg.CAFile)
			if err != nil {
				return nil, fmt.Errorf("%w: kubernetes backend: CA file: %v", sandbox.ErrInvalid, err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("%w: kubernetes backend: CA file %s holds no PEM certificate", sandbox.ErrInvalid, cfg.CAFile)
			}
			tr.TLSClientConfig.RootCAs = pool
		}
		hc, ownHC = &http.Client{Timeout: 90 * time.Second, Transport: tr}, true
	}
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: AgentDialTimeout}).DialContext,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		// The agent speaks HTTP/1.1; frame streams and full-duplex stdin rely on it.
		ForceAttemptHTTP2: false,
		Proxy:             nil,
	}
	agentHC := cfg.AgentHTTPClient
	if agentHC == nil {
		agentHC = &http.Client{Transport: tr}
	}
	return &Backend{cfg: cfg, base: u, hc: hc, ownHC: ownHC, agentHC: agentHC, grants: map[string]*brokerapi.Grant{}}, nil
}

// Close releases idle connections (the broker's only if New created its client).
func (b *Backend) Close() error {
	b.agentHC.CloseIdleConnections()
	if b.ownHC {
		b.hc.CloseIdleConnections()
	}
	for _, c := range b.cfg.closers {
		c()
	}
	return nil
}

// Platform implements sandbox.Backend.
func (b *Backend) Platform() capability.Platform { return capability.Kubernetes }

// Capabilities implements sandbox.Backend: the operator's published set.
func (b *Backend) Capabilities(context.Context) capability.Set { return Published() }

// Error is a broker answer other than success. errors.Is matches the sandbox error class of its code.
type Error struct {
	Status     int
	Code       string
	Message    string
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	return fmt.Sprintf("airlock broker: HTTP %d %s: %s", e.Status, e.Code, e.Message)
}

// Unwrap returns the sandbox error class of the code.
func (e *Error) Unwrap() error { return brokerapi.ClassOf(e.Code) }

// call sends one broker request and decodes a 2xx JSON answer into out (if non-nil).
func (b *Backend) call(ctx context.Context, method, path string, query url.Values, body, out any) error {
	tok, err := b.cfg.Token(ctx)
	if err != nil {
		return err
	}
	u := *b.base
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	u.RawQuery = query.Encode()
	var rd io.Reader
	if body != nil {
		js, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("%w: %v", sandbox.ErrInvalid, err)
		}
		rd = bytes.NewReader(js)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return fmt.Errorf("%w: %v", sandbox.ErrInvalid, err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := b.hc.Do(req)
	if err != nil {
		if method == http.MethodGet {
			return fmt.Errorf("%w: broker %s %s: %w", sandbox.ErrUnreachable, method, path, err)
		}
		return fmt.Errorf("%w: broker %s %s: %w", sandbox.ErrOutcomeUnknown, method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var be brokerapi.Error
		if json.Unmarshal(raw, &be) != nil || be.Code == "" {
			be = brokerapi.Error{Code: brokerapi.CodeInternal, Message: strings.TrimSpace(string(raw))}
		}
		e := &Error{Status: resp.StatusCode, Code: be.Code, Message: be.Message}
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
			e.RetryAfter = time.Duration(s) * time.Second
		}
		return e
	}
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(out); err != nil {
		return fmt.Errorf("%w: broker %s %s: decode answer: %v", sandbox.ErrOutcomeUnknown, method, path, err)
	}
	return nil
}

// Claim asks the broker once for a session of Sandbox name (the declaration, if non-nil, must
// match it). An empty pool is an *Error with Status 503 and RetryAfter set.
func (b *Backend) Claim(ctx context.Context, name string, decl *spec.Sandbox) (*brokerapi.Grant, error) {
	var g brokerapi.Grant
	err := b.call(ctx, http.MethodPost, brokerapi.PathClaim, nil,
		brokerapi.ClaimRequest{Namespace: b.cfg.Namespace, Sandbox: name, Declaration: decl}, &g)
	if err != nil {
		return nil, err
	}
	b.remember(&g)
	return &g, nil
}

func (b *Backend) remember(g *brokerapi.Grant) {
	b.mu.Lock()
	b.grants[g.Session.ID] = g
	b.mu.Unlock()
}

func toSession(s brokerapi.Session) *sandbox.Session {
	return &sandbox.Session{
		ID: s.ID, SandboxID: s.Spec.ID, Platform: string(capability.Kubernetes), State: sandbox.StateRunning,
		Generation: s.Generation, CreatedAt: s.CreatedAt, ExpiresAt: s.ExpiresAt, Labels: s.Spec.Labels, Spec: s.Spec,
	}
}

// Create claims a warm pod of the Sandbox named decl.ID, waiting (as Retry-After says) while the
// pool is empty, and returns once the pod's agent answers. With Config.Sandbox set, a
// declaration with another id (airlock run's and run_code's are generated) is served by that
// Sandbox if it fits (see fits); one that does not is refused and the claimed pod released.
func (b *Backend) Create(ctx context.Context, decl spec.Sandbox) (*sandbox.Session, error) {
	// What the set says no to is refused here, naming the capability, before the broker is asked.
	if err := plan.CheckSandbox(decl, b.Capabilities(ctx)); err != nil {
		return nil, err
	}
	if b.cfg.Sandbox == "" || decl.ID == b.cfg.Sandbox {
		g, err := b.claimWaiting(ctx, decl.ID, &decl)
		if err != nil {
			return nil, err
		}
		return toSession(g.Session), nil
	}
	g, err := b.claimWaiting(ctx, b.cfg.Sandbox, nil)
	if err != nil {
		return nil, err
	}
	if why := fits(decl, g.Session.Spec); why != "" {
		err := fmt.Errorf("%w: kubernetes: sandbox %s does not fit Sandbox %s/%s (kubernetes.sandbox): %s", sandbox.ErrRefused, decl.ID, b.cfg.Namespace, b.cfg.Sandbox, why)
		if terr := b.Terminate(ctx, g.Session.ID); terr != nil {
			err = errors.Join(err, fmt.Errorf("releasing session %s: %w", g.Session.ID, terr))
		}
		return nil, err
	}
	return toSession(g.Session), nil
}

// claimWaiting claims from Sandbox name, waiting while its pool is empty, until the agent answers.
func (b *Backend) claimWaiting(ctx context.Context, name string, decl *spec.Sandbox) (*brokerapi.Grant, error) {
	for {
		g, err := b.Claim(ctx, name, decl)
		var be *Error
		if errors.As(err, &be) && be.Status == http.StatusServiceUnavailable && be.RetryAfter > 0 {
			t := time.NewTimer(be.RetryAfter)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, fmt.Errorf("%w: waiting for a warm pod of %s: %w (last: %v)", sandbox.ErrDeadlineExceeded, name, ctx.Err(), err)
			case <-t.C:
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		a, err := b.agent(g)
		if err != nil {
			return nil, err
		}
		defer a.Close()
		// The pod was ready when claimed; one health call proves the agent answers this caller.
		if _, err := a.Health(ctx); err != nil {
			return nil, fmt.Errorf("session %s claimed but its agent does not answer: %w", g.Session.ID, err)
		}
		return g, nil
	}
}

// fits says why a sandbox declared as decl may not be served by a pod of a Sandbox declared as
// pool ("" when it may): image, limits, egress, runtime, working directory, environment and
// ports must be the same after defaults (runcode.Fits' rule for parked sandboxes); ids and labels may
// differ, and the pool's lifetime must be at least the declared one (the caller terminates
// the session when done; the pool's idle timeout applies).
func fits(decl, pool spec.Sandbox) string {
	decl.ApplyDefaults()
	pool.ApplyDefaults()
	var why []string
	if decl.Session.Lifetime() > pool.Session.Lifetime() {
		why = append(why, fmt.Sprintf("session.maxLifetimeSeconds %d, the Sandbox's is %d", decl.Session.Lifetime(), pool.Session.Lifetime()))
	}
	norm := func(s spec.Sandbox) map[string]json.RawMessage {
		s.ID, s.Labels, s.Session = "", nil, spec.Session{}
		if len(s.Env) == 0 {
			s.Env = nil
		}
		js, _ := json.Marshal(s)
		var m map[string]json.RawMessage
		_ = json.Unmarshal(js, &m)
		return m
	}
	d, p := norm(decl), norm(pool)
	keys := map[string]bool{}
	for k := range d {
		keys[k] = true
	}
	for k := range p {
		keys[k] = true
	}
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		if string(d[k]) != string(p[k]) {
			why = append(why, fmt.Sprintf("%s %s, the Sandbox's %s", k, orNone(d[k]), orNone(p[k])))
		}
	}
	return strings.Join(why, "; ")
}

func orNone(v json.RawMessage) string {
	if len(v) == 0 {
		return "(none)"
	}
	return string(v)
}

// reconnect fetches fresh tokens for session id.
func (b *Backend) reconnect(ctx context.Context, id string) (*brokerapi.Grant, error) {
	if id == "" || strings.ContainsAny(id, "/?#") {
		return nil, fmt.Errorf("%w: session id %q", sandbox.ErrInvalid, id)
	}
	var g brokerapi.Grant
	if err := b.call(ctx, http.MethodGet, brokerapi.PathSessions+b.cfg.Namespace+"/"+id, nil, nil, &g); err != nil {
		if errors.Is(err, sandbox.ErrNotFound) {
			// The session ended (idle timeout, lifetime, release elsewhere): Connect must not
			// hand out its old grant again.
			b.mu.Lock()
			delete(b.grants, id)
			b.mu.Unlock()
		}
		return nil, err
	}
	b.remember(&g)
	return &g, nil
}

// Get implements sandbox.Backend: the session as the cluster has it now.
func (b *Backend) Get(ctx context.Context, id string) (*sandbox.Session, error) {
	g, err := b.reconnect(ctx, id)
	if err != nil {
		return nil, err
	}
	return toSession(g.Session), nil
}

// List implements sandbox.Backend: the caller's sessions in the namespace.
func (b *Backend) List(ctx context.Context) ([]*sandbox.Session, error) {
	var ss []brokerapi.Session
	if err := b.call(ctx, http.MethodGet, brokerapi.PathSessions, url.Values{"namespace": {b.cfg.Namespace}}, nil, &ss); err != nil {
		return nil, err
	}
	out := make([]*sandbox.Session, 0, len(ss))
	for _, s := range ss {
		out = append(out, toSession(s))
	}
	return out, nil
}

// tokenMargin: a token this close to expiry is renewed before use.
const tokenMargin = 30 * time.Second

// Connect implements sandbox.Backend: an agent client carrying the session's execute token.
func (b *Backend) Connect(ctx context.Context, id string) (sandbox.Agent, error) {
	b.mu.Lock()
	g := b.grants[id]
	b.mu.Unlock()
	if g == nil || time.Until(g.TokenExpiresAt) < tokenMargin {
		var err error
		if g, err = b.reconnect(ctx, id); err != nil {
			return nil, err
		}
	}
	return b.agent(g)
}

func (b *Backend) agent(g *brokerapi.Grant) (*client.Client, error) {
	hostport, ok := strings.CutPrefix(g.Endpoint, "tcp:")
	if !ok || hostport == "" {
		return nil, fmt.Errorf("%w: broker gave agent endpoint %q, want tcp:host:port", sandbox.ErrOutcomeUnknown, g.Endpoint)
	}
	base := "http://" + hostport
	if b.cfg.AgentBase != nil {
		var err error
		if base, err = b.cfg.AgentBase(g); err != nil {
			return nil, err
		}
	}
	tok := g.ExecuteToken
	return client.NewHTTP(base, b.agentHC, func() string { return tok }), nil
}

// Terminate implements sandbox.Backend: the broker deletes the pod and answers once it is gone.
func (b *Backend) Terminate(ctx context.Context, id string) error {
	if id == "" || strings.ContainsAny(id, "/?#") {
		return fmt.Errorf("%w: session id %q", sandbox.ErrInvalid, id)
	}
	if err := b.call(ctx, http.MethodDelete, brokerapi.PathSessions+b.cfg.Namespace+"/"+id, nil, nil, nil); err != nil {
		return err
	}
	b.mu.Lock()
	delete(b.grants, id)
	b.mu.Unlock()
	return nil
}
