// Package aws is the sandbox.Backend on AWS Lambda MicroVMs: one MicroVM per sandbox, our agent inside, reached through its authenticated endpoint.
package aws

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"

	"github.com/airlock-sandbox/airlock/agent"
	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
	"github.com/airlock-sandbox/airlock/token"
)

// Fixed values of the binding.
const (
	// AgentPort is the guest port our agent serves its protocol on (X-aws-proxy-port).
	AgentPort = 8971
	// GuestSession is the session every guest agent is configured with: a MicroVM's id is
	// known only after RunMicrovm returns, after its run hook has the configuration, so tokens
	// are bound to the sandbox id and the MicroVM's endpoint credentials bind them to one MicroVM.
	GuestSession = "microvm"
	// MaxRunHookPayload is RunMicrovm's runHookPayload limit (the API reference's 4096).
	MaxRunHookPayload = 4096
	// DefaultReadyTimeout bounds waiting for a new MicroVM's agent (notes: alien waits 60 s).
	DefaultReadyTimeout = 90 * time.Second
	// tokenLifetime bounds each capability token; one is minted per request.
	tokenLifetime = 60 * time.Second
	// proxyTokenMinutes is the endpoint credential's lifetime; renewed with proxyMargin left.
	proxyTokenMinutes = 30
	proxyMargin       = 2 * time.Minute
	// defaultTerminateWait bounds confirming a terminate when ctx has no deadline.
	defaultTerminateWait = 5 * time.Minute
)

// DefaultStateDir holds the binding's master secret (tokens for our agent are derived from it).
func DefaultStateDir() string {
	if os.Geteuid() == 0 {
		return "/var/lib/airlock-aws"
	}
	if d, err := os.UserConfigDir(); err == nil {
		return filepath.Join(d, "airlock", "aws")
	}
	return filepath.Join(os.TempDir(), "airlock-aws-"+strconv.Itoa(os.Geteuid()))
}

// Config says where the MicroVMs run and from what.
type Config struct {
	// Region is the image's region (required); Endpoint overrides the API's URL (a fake).
	Region   string
	Endpoint string
	// Image is the MicroVM image's ARN (required), ImageVersion its version ("" the latest
	// active), ImageRef the reference the image was built from: a declared image.ref must be it.
	Image        string
	ImageVersion string
	ImageRef     string
	// EgressConnector is the ARN of a VPC egress connector whose security group lets nothing
	// out; a sandbox with egress deny runs behind it. Empty: deny is refused.
	EgressConnector string
	// StateDir holds the master secret (default DefaultStateDir()).
	StateDir string
	// Credentials sign the API calls (default: the SDK's default chain for Region).
	Credentials awssdk.CredentialsProvider
	// HTTPClient carries API calls; AgentHTTPClient calls through MicroVM endpoints (defaults: own).
	HTTPClient      *http.Client
	AgentHTTPClient *http.Client
	ReadyTimeout    time.Duration
	Logger          *slog.Logger
}

// Backend runs sandboxes as Lambda MicroVMs.
type Backend struct {
	cfg     Config
	api     *Client
	master  []byte
	caps    capability.Set
	agentHC *http.Client
	log     *slog.Logger

	mu       sync.Mutex
	sessions map[string]*known // by MicroVM id: what this process created or found
}

// known is what this process holds about a MicroVM.
type known struct {
	sandboxID string
	spec      spec.Sandbox
	hasSpec   bool
	created   time.Time
	expires   time.Time
	// proxy are the endpoint credential's headers, valid until proxyExpiry.
	proxy       map[string]string
	proxyExpiry time.Time
	endpoint    string
}

var (
	_ sandbox.Backend = (*Backend)(nil)
	_ sandbox.Pauser  = (*Backend)(nil)
)

// New checks cfg, loads the credentials chain and the master secret. It makes no API call.
func New(ctx context.Context, cfg Config) (*Backend, error) {
	if cfg.Image == "" {
		return nil, fmt.Errorf("%w: aws.image is empty: name the MicroVM image's ARN (arn:aws:lambda:<region>:<account>:microvm-image:<name>)", sandbox.ErrInvalid)
	}
	if !strings.HasPrefix(cfg.Image, "arn:") {
		return nil, fmt.Errorf("%w: aws.image %q is not an ARN: RunMicrovm refuses a bare name", sandbox.ErrInvalid, cfg.Image)
	}
	if cfg.EgressConnector != "" && !strings.HasPrefix(cfg.EgressConnector, "arn:") {
		return nil, fmt.Errorf("%w: aws.egressConnector %q is not an ARN", sandbox.ErrInvalid, cfg.EgressConnector)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = DefaultReadyTimeout
	}
	if cfg.StateDir == "" {
		cfg.StateDir = DefaultStateDir()
	}
	if cfg.Credentials == nil {
		ac, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRegion(cfg.Region))
		if err != nil {
			return nil, fmt.Errorf("%w: aws credentials chain: %v", sandbox.ErrUnauthenticated, err)
		}
		cfg.Credentials = ac.Credentials
	}
	api, err := NewClient(cfg.Region, cfg.Endpoint, cfg.Credentials, cfg.HTTPClient)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("aws state dir: %w", err)
	}
	master, err := statedir.LoadMaster(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("aws state dir: %w", err)
	}
	hc := cfg.AgentHTTPClient
	if hc == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		// The agent's frame streams and full-duplex stdin rely on HTTP/1.1.
		tr.ForceAttemptHTTP2 = false
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
		tr.DisableCompression = true
		hc = &http.Client{Transport: tr}
	}
	return &Backend{cfg: cfg, api: api, master: master, caps: capabilities(cfg.EgressConnector != ""),
		agentHC: hc, log: cfg.Logger.With("backend", "aws"), sessions: map[string]*known{}}, nil
}

// Close releases idle connections; MicroVMs live on.
func (b *Backend) Close() error {
	b.agentHC.CloseIdleConnections()
	b.api.HTTP.CloseIdleConnections()
	return nil
}

// Platform is aws.
func (b *Backend) Platform() capability.Platform { return capability.AWS }

// Capabilities is what this backend enforces as configured: Published, less egress deny when
// no connector is configured.
func (b *Backend) Capabilities(context.Context) capability.Set { return b.caps }

// API is the backend's MicroVM client (tests, and image tooling).
func (b *Backend) API() *Client { return b.api }

// checkID refuses what cannot be a MicroVM id before it goes into a path.
func checkID(id string) error {
	if id == "" || len(id) > 128 {
		return fmt.Errorf("%w: session id %q: a MicroVM id is 1 to 128 characters", sandbox.ErrInvalid, id)
	}
	for _, c := range id {
		if !(c == '-' || c == '_' || c == '.' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
			return fmt.Errorf("%w: session id %q: a MicroVM id holds only letters, digits, '-', '_' and '.'", sandbox.ErrInvalid, id)
		}
	}
	return nil
}

// resolved is a declaration turned into RunMicrovm's terms.
type resolved struct {
	lifetime  time.Duration
	workdir   string
	connector string
}

func (b *Backend) resolve(decl spec.Sandbox) (*resolved, error) {
	bad := func(field, value, msg string) error {
		return fmt.Errorf("%w: %s %q: %s", sandbox.ErrInvalid, field, value, msg)
	}
	if err := spec.ValidateID(decl.ID); err != nil {
		return nil, err
	}
	if decl.Image.Kind() != spec.ImageRef {
		return nil, fmt.Errorf("%w: image %s: a MicroVM runs the image it was built from: declare image.ref", sandbox.ErrUnsupported, decl.Image.Kind())
	}
	if b.cfg.ImageRef == "" {
		return nil, fmt.Errorf("%w: image.ref %q: aws.imageRef is not configured, so nothing says MicroVM image %s was built from it; set aws.imageRef to the reference its Dockerfile starts FROM", sandbox.ErrRefused, decl.Image.Ref, b.cfg.Image)
	}
	if decl.Image.Ref != b.cfg.ImageRef {
		return nil, fmt.Errorf("%w: image.ref %q: the configured MicroVM image %s was built from %q (aws.imageRef); build and configure an image for this reference ('airlock image push --platform aws')", sandbox.ErrRefused, decl.Image.Ref, b.cfg.Image, b.cfg.ImageRef)
	}
	switch decl.Runtime {
	case "", spec.RuntimeNative:
	default:
		return nil, fmt.Errorf("%w: runtime %q: a MicroVM is its own boundary (allowed: native)", sandbox.ErrUnsupported, decl.Runtime)
	}
	r := &resolved{}
	switch decl.Egress.Mode {
	case "", spec.EgressDeny:
		if b.cfg.EgressConnector == "" {
			return nil, fmt.Errorf("%w: egress mode deny: %s (capability %s)", sandbox.ErrRefused, reasonNoConnector, capability.EgressDeny)
		}
		r.connector = b.cfg.EgressConnector
	case spec.EgressOpen:
	default:
		return nil, fmt.Errorf("%w: egress mode %s: a MicroVM runs with a deny connector or none (allowed: deny, open)", sandbox.ErrUnsupported, decl.Egress.Mode)
	}
	if len(decl.PreviewPorts) > 0 {
		return nil, fmt.Errorf("%w: previewPorts: %s (capability %s)", sandbox.ErrUnsupported, unsupported[capability.Preview], capability.Preview)
	}
	life := decl.Session.Lifetime()
	if life < 1 || life > capability.AWSMaxLifetimeSeconds {
		return nil, bad("session.maxLifetimeSeconds", strconv.FormatInt(life, 10), fmt.Sprintf("a MicroVM lives 1 to %d s", capability.AWSMaxLifetimeSeconds))
	}
	r.lifetime = time.Duration(life) * time.Second
	r.workdir = decl.Workdir
	if r.workdir == "" {
		r.workdir = spec.DefaultWorkdir
	}
	if !path.IsAbs(r.workdir) || path.Clean(r.workdir) != r.workdir || r.workdir == "/" {
		return nil, bad("workdir", r.workdir, "must be an absolute, clean path other than /")
	}
	return r, nil
}

// key is the signing key of a sandbox's tokens.
func (b *Backend) key(sandboxID string) (ed25519.PrivateKey, error) {
	return token.DeriveKey(b.master, "aws/"+sandboxID)
}

// GuestConfig is the run hook's payload: what our agent in the guest needs to serve one
// session (the guest fills in where it listens and the code's uid).
func (b *Backend) guestConfig(decl spec.Sandbox, r *resolved, expires time.Time) (string, error) {
	k, err := b.key(decl.ID)
	if err != nil {
		return "", err
	}
	ring, err := token.NewKeyRing(k.Public().(ed25519.PublicKey)).MarshalText()
	if err != nil {
		return "", err
	}
	// The run policy is the guest's to make (wire.NewPolicy, with the image's environment
	// only it sees): the payload carries the declaration's env and the lifetime it is made of.
	cfg := agent.Config{
		SandboxID: decl.ID, SessionID: GuestSession, Generation: 1, KeyRing: string(ring),
		Workdir: r.workdir, Policy: wire.Policy{Env: decl.Env, MaxTimeout: r.lifetime}, Deadline: expires,
	}
	js, err := json.Marshal(cfg)
	if err != nil {
		return "", err
	}
	if len(js) > MaxRunHookPayload {
		return "", fmt.Errorf("%w: env: the sandbox's configuration is %d bytes as the run hook's payload, RunMicrovm takes at most %d: declare less environment", sandbox.ErrInvalid, len(js), MaxRunHookPayload)
	}
	return string(js), nil
}

// ParseGuestConfig reads a run hook payload (the guest's side, and the fake's).
func ParseGuestConfig(payload string) (agent.Config, error) {
	var c agent.Config
	if err := json.Unmarshal([]byte(payload), &c); err != nil {
		return c, fmt.Errorf("%w: run hook payload: %v", sandbox.ErrInvalid, err)
	}
	if c.SandboxID == "" || c.SessionID == "" || c.KeyRing == "" {
		return c, fmt.Errorf("%w: run hook payload: sandboxId, sessionId and keyRing are required", sandbox.ErrInvalid)
	}
	return c, nil
}

func newClientToken() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

// Create runs a MicroVM and returns once our agent answers through its endpoint. A MicroVM
// that does not become servable in time is terminated (confirmed) before Create returns, so no
// id nobody received keeps running.
func (b *Backend) Create(ctx context.Context, decl spec.Sandbox) (*sandbox.Session, error) {
	if err := plan.CheckSandbox(decl, b.caps); err != nil {
		return nil, err
	}
	r, err := b.resolve(decl)
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	expires := now.Add(r.lifetime)
	payload, err := b.guestConfig(decl, r, expires)
	if err != nil {
		return nil, err
	}
	tok, err := newClientToken()
	if err != nil {
		return nil, err
	}
	// The idle policy is turned off: the idle time is the lifetime (the floor is 60 s), which
	// ends the MicroVM first. No auto-resume: a paused sandbox stays paused until Resume, not
	// until the next request reaches its endpoint.
	idle := max(int64(r.lifetime/time.Second), 60)
	req := RunRequest{
		ImageIdentifier: b.cfg.Image, ImageVersion: b.cfg.ImageVersion, ClientToken: tok,
		IdlePolicy:               &IdlePolicy{MaxIdleDurationSeconds: idle, SuspendedDurationSeconds: idle, AutoResumeEnabled: false},
		MaximumDurationInSeconds: int64(r.lifetime / time.Second),
		RunHookPayload:           payload,
	}
	if r.connector != "" {
		req.EgressNetworkConnectors = []string{r.connector}
	}
	m, err := b.api.Run(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := checkID(m.MicrovmID); err != nil {
		return nil, fmt.Errorf("%w: RunMicrovm answered MicroVM id %q", sandbox.ErrOutcomeUnknown, m.MicrovmID)
	}
	k := &known{sandboxID: decl.ID, spec: decl, hasSpec: true, created: now, expires: expires}
	b.mu.Lock()
	b.sessions[m.MicrovmID] = k
	b.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, b.cfg.ReadyTimeout)
	err = b.waitServable(rctx, m.MicrovmID, decl.ID)
	cancel()
	if err != nil {
		tctx, tcancel := context.WithTimeout(context.WithoutCancel(ctx), defaultTerminateWait)
		defer tcancel()
		if terr := b.Terminate(tctx, m.MicrovmID); terr != nil {
			return nil, fmt.Errorf("%w; and terminating MicroVM %s failed: %v", err, m.MicrovmID, terr)
		}
		return nil, err
	}
	b.log.Debug("sandbox created", "session", m.MicrovmID, "sandbox", decl.ID)
	return &sandbox.Session{ID: m.MicrovmID, SandboxID: decl.ID, Platform: string(capability.AWS), State: sandbox.StateRunning,
		Generation: 1, CreatedAt: now, ExpiresAt: expires, Labels: decl.Labels, Spec: decl}, nil
}

// waitServable polls GetMicrovm until the MicroVM has an endpoint, then our agent's health
// through it until it answers for this sandbox (the proxy answers 502 while the snapshot
// restores).
func (b *Backend) waitServable(ctx context.Context, id, sandboxID string) error {
	var last error
	for delay := 50 * time.Millisecond; ; delay = min(delay*2, 500*time.Millisecond) {
		m, err := b.api.Get(ctx, id)
		switch {
		case err == nil && (m.State == StateTerminating || m.State == StateTerminated):
			return fmt.Errorf("%w: MicroVM %s is %s before its agent answered: %s", sandbox.ErrUnreachable, id, m.State, m.StateReason)
		case err == nil && m.Endpoint != "":
			b.setEndpoint(id, m.Endpoint)
			a, cerr := b.agentClient(ctx, id, sandboxID)
			if cerr != nil {
				last = cerr
				break
			}
			h, herr := a.Health(ctx)
			a.Close()
			if herr == nil {
				if h.SandboxID != sandboxID {
					return fmt.Errorf("%w: the agent of MicroVM %s answered for sandbox %q, not %q", sandbox.ErrUnreachable, id, h.SandboxID, sandboxID)
				}
				return nil
			}
			last = herr
		case err != nil:
			last = err
		default:
			last = fmt.Errorf("MicroVM %s is %s without an endpoint", id, m.State)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w: MicroVM %s was not servable in %v: %v", sandbox.ErrDeadlineExceeded, id, b.cfg.ReadyTimeout, last)
		case <-t.C:
		}
	}
}

func (b *Backend) setEndpoint(id, ep string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	k := b.sessions[id]
	if k == nil {
		k = &known{}
		b.sessions[id] = k
	}
	if k.endpoint != ep {
		k.endpoint, k.proxy = ep, nil
	}
}

// endpointURL is the base URL of an endpoint the API gave as a bare host or a URL.
func endpointURL(ep string) string {
	if strings.HasPrefix(ep, "https://") || strings.HasPrefix(ep, "http://") {
		return strings.TrimSuffix(ep, "/")
	}
	return "https://" + strings.TrimSuffix(ep, "/")
}

// proxyHeaders returns the endpoint credential for id's agent port, minting one when none is
// held or it is about to expire.
func (b *Backend) proxyHeaders(ctx context.Context, id string) (map[string]string, string, error) {
	b.mu.Lock()
	k := b.sessions[id]
	var ep string
	if k != nil && k.proxy != nil && time.Until(k.proxyExpiry) > proxyMargin {
		h, ep := k.proxy, k.endpoint
		b.mu.Unlock()
		return h, ep, nil
	}
	if k != nil {
		ep = k.endpoint
	}
	b.mu.Unlock()
	if ep == "" {
		m, err := b.live(ctx, id)
		if err != nil {
			return nil, "", err
		}
		if m.Endpoint == "" {
			return nil, "", fmt.Errorf("%w: MicroVM %s has no endpoint (%s)", sandbox.ErrUnreachable, id, m.State)
		}
		b.setEndpoint(id, m.Endpoint)
		ep = m.Endpoint
	}
	h, err := b.api.AuthToken(ctx, id, AgentPort, proxyTokenMinutes)
	if err != nil {
		return nil, "", err
	}
	b.mu.Lock()
	if k := b.sessions[id]; k != nil {
		k.proxy, k.proxyExpiry = h, time.Now().Add(proxyTokenMinutes*time.Minute)
	}
	b.mu.Unlock()
	return h, ep, nil
}

// agentClient is an agent client for MicroVM id whose requests carry the endpoint credential,
// the agent port and a fresh capability token each.
func (b *Backend) agentClient(ctx context.Context, id, sandboxID string) (*client.Client, error) {
	h, ep, err := b.proxyHeaders(ctx, id)
	if err != nil {
		return nil, err
	}
	key, err := b.key(sandboxID)
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Transport: &proxyTransport{base: b.agentHC.Transport, headers: h}}
	return client.NewHTTP(endpointURL(ep), hc, func() string {
		now := time.Now()
		tok, err := token.Mint(key, token.Claims{Sandbox: sandboxID, Session: GuestSession, Generation: 1, Class: token.Execute,
			IssuedAt: now.Unix(), Expiry: now.Add(tokenLifetime).Unix()})
		if err != nil {
			return "" // the agent refuses an empty token
		}
		return tok
	}), nil
}

// proxyTransport adds the endpoint's headers and moves our bearer token out of Authorization,
// which the endpoint's proxy reads as its own.
type proxyTransport struct {
	base    http.RoundTripper
	headers map[string]string
}

func (t *proxyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if a := r.Header.Get("Authorization"); a != "" {
		r.Header.Del("Authorization")
		r.Header.Set(wire.HeaderAuthorization, a)
	}
	for k, v := range t.headers {
		r.Header.Set(k, v)
	}
	r.Header.Set(ProxyPortHeader, strconv.Itoa(AgentPort))
	base := t.base
	if base == nil {
		base = http.DefaultTransport
	}
	return base.RoundTrip(r)
}

// live is GetMicrovm of one of our MicroVMs, ErrNotFound when it is gone or another image's.
func (b *Backend) live(ctx context.Context, id string) (*Microvm, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	m, err := b.api.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if m.ImageArn != "" && m.ImageArn != b.cfg.Image {
		// The IAM scope of one image prefix also matches siblings: a MicroVM of another image is
		// not this backend's.
		return nil, fmt.Errorf("%w: session %s is a MicroVM of image %s, not %s", sandbox.ErrNotFound, id, m.ImageArn, b.cfg.Image)
	}
	if m.State == StateTerminating || m.State == StateTerminated {
		b.forget(id)
		return nil, fmt.Errorf("%w: session %s (MicroVM %s)", sandbox.ErrNotFound, id, m.State)
	}
	return m, nil
}

func (b *Backend) forget(id string) {
	b.mu.Lock()
	delete(b.sessions, id)
	b.mu.Unlock()
}

func stateOf(s string) sandbox.State {
	switch s {
	case StateSuspending, StateSuspended:
		return sandbox.StatePaused
	case StateTerminating, StateTerminated:
		return sandbox.StateTerminated
	}
	return sandbox.StateRunning
}

// session builds a Session from the API's view and what this process knows; with ask, a
// running MicroVM this process did not create is asked its sandbox id through its agent.
func (b *Backend) session(ctx context.Context, m *Microvm, ask bool) (*sandbox.Session, error) {
	b.mu.Lock()
	k := b.sessions[m.MicrovmID]
	var cp known
	if k != nil {
		cp = *k
	}
	b.mu.Unlock()
	s := &sandbox.Session{ID: m.MicrovmID, Platform: string(capability.AWS), State: stateOf(m.State), Generation: 1}
	if m.StartedAt > 0 {
		s.CreatedAt = time.Unix(0, int64(m.StartedAt*1e9)).UTC()
	}
	if m.MaximumDurationInSeconds > 0 && !s.CreatedAt.IsZero() {
		s.ExpiresAt = s.CreatedAt.Add(time.Duration(m.MaximumDurationInSeconds) * time.Second)
	}
	if k != nil && cp.hasSpec {
		s.SandboxID, s.Spec, s.Labels, s.CreatedAt, s.ExpiresAt = cp.sandboxID, cp.spec, cp.spec.Labels, cp.created, cp.expires
		return s, nil
	}
	if !ask || s.State != sandbox.StateRunning {
		return s, nil
	}
	sid, err := b.askSandboxID(ctx, m)
	if err != nil {
		return nil, err
	}
	s.SandboxID, s.Spec.ID = sid, sid
	return s, nil
}

// askSandboxID reads the sandbox id from the agent's unauthenticated health.
func (b *Backend) askSandboxID(ctx context.Context, m *Microvm) (string, error) {
	b.mu.Lock()
	if k := b.sessions[m.MicrovmID]; k != nil && k.sandboxID != "" {
		sid := k.sandboxID
		b.mu.Unlock()
		return sid, nil
	}
	b.mu.Unlock()
	if m.Endpoint != "" {
		b.setEndpoint(m.MicrovmID, m.Endpoint)
	}
	// Health needs no capability token.
	h0, ep, err := b.proxyHeaders(ctx, m.MicrovmID)
	if err != nil {
		return "", err
	}
	a := client.NewHTTP(endpointURL(ep), &http.Client{Transport: &proxyTransport{base: b.agentHC.Transport, headers: h0}}, func() string { return "" })
	defer a.Close()
	h, err := a.Health(ctx)
	if err != nil {
		return "", fmt.Errorf("session %s: its agent does not answer: %w", m.MicrovmID, err)
	}
	b.mu.Lock()
	if k := b.sessions[m.MicrovmID]; k != nil {
		k.sandboxID = h.SandboxID
	}
	b.mu.Unlock()
	return h.SandboxID, nil
}

// Get is the session as GetMicrovm has it now; ErrNotFound once it is terminated.
func (b *Backend) Get(ctx context.Context, id string) (*sandbox.Session, error) {
	m, err := b.live(ctx, id)
	if err != nil {
		return nil, err
	}
	return b.session(ctx, m, true)
}

// List is every live MicroVM of the configured image (ListMicrovms: an account-wide grant).
func (b *Backend) List(ctx context.Context) ([]*sandbox.Session, error) {
	items, err := b.api.List(ctx, b.cfg.Image)
	if err != nil {
		return nil, err
	}
	var out []*sandbox.Session
	for _, it := range items {
		if it.State == StateTerminating || it.State == StateTerminated || (it.ImageArn != "" && it.ImageArn != b.cfg.Image) {
			continue
		}
		s, err := b.session(ctx, &Microvm{MicrovmID: it.MicrovmID, State: it.State, ImageArn: it.ImageArn, StartedAt: it.StartedAt}, false)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// Connect is an agent client for a live session.
func (b *Backend) Connect(ctx context.Context, id string) (sandbox.Agent, error) {
	m, err := b.live(ctx, id)
	if err != nil {
		return nil, err
	}
	if m.Endpoint != "" {
		b.setEndpoint(id, m.Endpoint)
	}
	sid, err := b.askSandboxID(ctx, m)
	if err != nil {
		return nil, err
	}
	return b.agentClient(ctx, id, sid)
}

// Terminate calls TerminateMicrovm, then polls GetMicrovm until the MicroVM is TERMINATED or
// the API says it does not exist. Throttles, 5xx and timeouts are errors (outcome unknown),
// never "gone".
func (b *Backend) Terminate(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultTerminateWait)
		defer cancel()
	}
	if err := b.api.Terminate(ctx, id); err != nil && !IsNotFound(err) {
		return fmt.Errorf("%w: terminate %s: %w", sandbox.ErrOutcomeUnknown, id, err)
	}
	for delay := 100 * time.Millisecond; ; delay = min(delay*2, time.Second) {
		m, err := b.api.Get(ctx, id)
		switch {
		case IsNotFound(err):
			b.forget(id)
			return nil
		case err != nil:
			return fmt.Errorf("%w: terminate %s: confirming: %w", sandbox.ErrOutcomeUnknown, id, err)
		case m.State == StateTerminated:
			b.forget(id)
			return nil
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w: terminate %s: MicroVM still %s: %v", sandbox.ErrOutcomeUnknown, id, m.State, ctx.Err())
		case <-t.C:
		}
	}
}

// Pause suspends the MicroVM (memory and disk kept) and returns once it is SUSPENDED.
func (b *Backend) Pause(ctx context.Context, id string) error {
	if _, err := b.live(ctx, id); err != nil {
		return err
	}
	if err := b.api.Suspend(ctx, id); err != nil {
		return err
	}
	return b.waitState(ctx, id, StateSuspended)
}

// Resume resumes a suspended MicroVM and returns once our agent answers again.
func (b *Backend) Resume(ctx context.Context, id string) error {
	if _, err := b.live(ctx, id); err != nil {
		return err
	}
	if err := b.api.Resume(ctx, id); err != nil {
		return err
	}
	if err := b.waitState(ctx, id, StateRunning); err != nil {
		return err
	}
	m, err := b.live(ctx, id)
	if err != nil {
		return err
	}
	sid, err := b.askSandboxID(ctx, m)
	if err != nil {
		return err
	}
	return b.waitServable(ctx, id, sid)
}

func (b *Backend) waitState(ctx context.Context, id, want string) error {
	for delay := 50 * time.Millisecond; ; delay = min(delay*2, time.Second) {
		m, err := b.live(ctx, id)
		if err != nil {
			return err
		}
		if m.State == want {
			return nil
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w: MicroVM %s is %s, waiting for %s: %v", sandbox.ErrDeadlineExceeded, id, m.State, want, ctx.Err())
		case <-t.C:
		}
	}
}
