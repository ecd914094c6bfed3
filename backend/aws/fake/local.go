package fake

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/agent/wire"
	awsb "github.com/airlock-sandbox/airlock/backend/aws"
	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
	"github.com/airlock-sandbox/airlock/token"
)

// LocalGuests start each MicroVM's guest as a sandbox of the local runtime, running our agent:
// exec and files go through the same protocol bytes as to a guest in AWS. The capability tokens
// the binding sends are verified against the run hook's key ring (what our agent in a MicroVM
// checks) and passed on re-minted for the local sandbox's own agent.
type LocalGuests struct {
	Backend *local.Backend
	// StateDir is the local backend's state dir (its master secret mints the re-minted tokens).
	StateDir string
	// Images maps an image ARN to the local image its MicroVMs start from.
	Images map[string]spec.Image
	// FromRef maps the FROM of a bundle the fake built an image from to the local image that
	// stands for it (this machine pulls from no registry): a pushed image's guests start from
	// what its Dockerfile names.
	FromRef map[string]spec.Image
}

// Start is a Starter.
func (g *LocalGuests) Start(ctx context.Context, info RunInfo) (Guest, error) {
	img, ok := g.Images[info.ImageArn]
	if !ok && info.BuiltFrom != "" {
		if img, ok = g.FromRef[info.BuiltFrom]; !ok {
			return nil, fmt.Errorf("no local image stands for %s (FROM of image %s)", info.BuiltFrom, info.ImageArn)
		}
	}
	if !ok {
		return nil, fmt.Errorf("no local image for %s", info.ImageArn)
	}
	ring, err := token.ParseKeyRing([]byte(info.Guest.KeyRing))
	if err != nil {
		return nil, fmt.Errorf("run hook key ring: %w", err)
	}
	life := int64(info.Lifetime / time.Second)
	decl := spec.Sandbox{ID: info.Guest.SandboxID, Image: img, Env: info.Guest.Env, Workdir: info.Guest.Workdir,
		Session: spec.Session{MaxLifetimeSeconds: &life, IdleTimeoutSeconds: &life}}
	decl.Egress.Mode = spec.EgressOpen
	if info.Connector {
		decl.Egress.Mode = spec.EgressDeny
	}
	decl.ApplyDefaults()
	sess, err := g.Backend.Create(ctx, decl)
	if err != nil {
		return nil, err
	}
	master, err := statedir.LoadMaster(g.StateDir)
	if err != nil {
		return nil, err
	}
	key, err := token.DeriveKey(master, sess.ID)
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(g.StateDir, sess.ID, "run", "agent.sock")
	lg := &localGuest{lb: g.Backend, sess: sess, key: key, ring: ring, cfg: info}
	lg.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = "http", "airlock-agent", "airlock-agent"
		},
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}, DisableCompression: true},
		FlushInterval: -1,
	}
	return lg, nil
}

type localGuest struct {
	lb   *local.Backend
	sess *sandbox.Session
	key  ed25519.PrivateKey
	ring *token.KeyRing
	cfg  RunInfo
	rp   *httputil.ReverseProxy
}

// Serve passes a request for the agent's port on, its capability token checked against the
// run hook's key ring and re-minted for the local agent. Nothing listens on other ports.
func (g *localGuest) Serve(port int, w http.ResponseWriter, r *http.Request) {
	if port != awsb.AgentPort {
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	auth := r.Header.Get(wire.HeaderAuthorization)
	if auth == "" {
		auth = r.Header.Get("Authorization")
	}
	r.Header.Del(wire.HeaderAuthorization)
	r.Header.Del("Authorization")
	if scheme, tok, ok := strings.Cut(auth, " "); ok && strings.EqualFold(scheme, "Bearer") {
		tok = strings.TrimSpace(tok)
		fwd := tok // refused by the local agent as it would be by the guest's
		for _, class := range []token.Class{token.Execute, token.Manage} {
			c, err := token.Verify(g.ring, tok, token.Expect{Sandbox: g.cfg.Guest.SandboxID, Session: g.cfg.Guest.SessionID,
				Generation: g.cfg.Guest.Generation, Class: class})
			if err != nil {
				continue
			}
			if t, err := token.Mint(g.key, token.Claims{Sandbox: g.sess.SandboxID, Session: g.sess.ID, Generation: g.sess.Generation,
				Class: class, IssuedAt: c.IssuedAt, Expiry: c.Expiry}); err == nil {
				fwd = t
			}
			break
		}
		r.Header.Set("Authorization", "Bearer "+fwd)
	}
	_ = http.NewResponseController(w).EnableFullDuplex()
	g.rp.ServeHTTP(w, r)
}

func (g *localGuest) Pause(ctx context.Context) error  { return g.lb.Pause(ctx, g.sess.ID) }
func (g *localGuest) Resume(ctx context.Context) error { return g.lb.Resume(ctx, g.sess.ID) }
func (g *localGuest) Close(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return g.lb.Terminate(ctx, g.sess.ID)
}
