package local

// Preview ports (capability preview).
//
// A port the declaration lists in previewPorts can be exposed on host loopback, behind an
// authenticated reverse proxy (package preview): Preview opens (once per session and port) a
// listener on 127.0.0.1 with a port of its own, so each preview is its own browser origin, and
// returns its URL with a preview token. The proxy reaches the sandbox's port by dialing
// 127.0.0.1:<port> inside the sandbox's own network namespace (setns on a locked thread, for
// the dial only): the sandbox keeps only loopback and egress stays denied, nothing is
// listening for it on the host, and a port not declared is never exposed.
//
// Credentials (see preview/token.go): a preview token, minted by Preview with the session's
// key, for one session and one port, expiring (default 1 hour, at most the session's end);
// or an execute-class agent token of the session (its holder can already run anything in the
// sandbox). Presented as ?airlock_token= (answered with an HttpOnly cookie for that address
// and a redirect without it), Authorization: Bearer, X-Airlock-Token, or that cookie. A
// missing, malformed, forged or expired token gets 401; a valid token of another session,
// sandbox generation or port, or a token of the manage class, gets 403. While the sandbox is
// paused requests get 503. The listener closes when the session ends or the backend closes.
// gVisor sandboxes have their own network stack and are refused previewPorts at create.

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/vishvananda/netns"

	"github.com/airlock-sandbox/airlock/preview"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// Preview token lifetimes.
const (
	defaultPreviewTTL = time.Hour
	maxPreviewTTL     = 24 * time.Hour
)

var _ sandbox.Previewer = (*Backend)(nil)

// previews are a backend's open preview listeners, by session and port.
type previews struct {
	mu sync.Mutex
	m  map[previewKey]*preview.Listener
}

type previewKey struct {
	session string
	port    int
}

// Preview exposes a declared port of the session on host loopback and returns its URL and a
// preview token valid for ttl (0: defaultPreviewTTL; capped at the session's expiry).
func (b *Backend) Preview(ctx context.Context, sessionID string, port int, ttl time.Duration) (sandbox.PreviewInfo, error) {
	s, err := b.lookup(ctx, sessionID)
	if err != nil {
		return sandbox.PreviewInfo{}, err
	}
	if s.rec.Runtime != "" {
		return sandbox.PreviewInfo{}, fmt.Errorf("%w: preview ports of %s sandboxes are not implemented (native only)", sandbox.ErrUnsupported, s.rec.Runtime)
	}
	if !slices.Contains(s.rec.Spec.PreviewPorts, port) {
		return sandbox.PreviewInfo{}, fmt.Errorf("%w: port %d is not declared in previewPorts %v of sandbox %q", sandbox.ErrRefused, port, s.rec.Spec.PreviewPorts, s.rec.SandboxID)
	}
	switch {
	case ttl == 0:
		ttl = defaultPreviewTTL
	case ttl < time.Second || ttl > maxPreviewTTL:
		return sandbox.PreviewInfo{}, fmt.Errorf("%w: preview ttl %s: must be 1s..%s", sandbox.ErrInvalid, ttl, maxPreviewTTL)
	}
	now := time.Now()
	exp := now.Add(ttl)
	if exp.After(s.rec.ExpiresAt) {
		exp = s.rec.ExpiresAt
	}
	l, err := b.previewListener(s, port)
	if err != nil {
		return sandbox.PreviewInfo{}, err
	}
	tok, err := preview.Mint(s.key, preview.Claims{
		Sandbox: s.rec.SandboxID, Session: s.rec.ID, Generation: s.rec.Generation, Port: port,
		IssuedAt: now.Unix(), Expiry: exp.Unix(),
	})
	if err != nil {
		return sandbox.PreviewInfo{}, err
	}
	return sandbox.PreviewInfo{URL: l.URL(tok), Addr: l.Addr(), Port: port, Token: tok, ExpiresAt: time.Unix(exp.Unix(), 0).UTC()}, nil
}

// previewListener returns the session's listener for port, opening it on first use.
func (b *Backend) previewListener(s *session, port int) (*preview.Listener, error) {
	key := previewKey{s.rec.ID, port}
	b.previews.mu.Lock()
	defer b.previews.mu.Unlock()
	if l := b.previews.m[key]; l != nil {
		return l, nil
	}
	b.mu.Lock()
	closed := b.closed
	if !closed {
		b.watchers.Add(1) // released by the watcher below; Close waits for it
	}
	b.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("%w: the backend is closed", sandbox.ErrRefused)
	}
	ns, err := netns.GetFromPath(fmt.Sprintf("/proc/%d/ns/net", s.rec.InitPID))
	if err == nil && !alive(s.rec.InitPID, s.rec.InitStart) {
		ns.Close()
		err = fmt.Errorf("init %d has exited", s.rec.InitPID)
	}
	if err != nil {
		b.watchers.Done()
		return nil, fmt.Errorf("%w: session %s: its network namespace: %v", sandbox.ErrNotFound, s.rec.ID, err)
	}
	t := preview.Target{
		SandboxID: s.rec.SandboxID, SessionID: s.rec.ID, Generation: s.rec.Generation, Port: port,
		Keys: []ed25519.PublicKey{s.key.Public().(ed25519.PublicKey)},
		Dial: func(ctx context.Context) (net.Conn, error) { return dialInNetns(ctx, ns, port) },
		Available: func() error {
			if s.exited() {
				return fmt.Errorf("session %s has ended", s.rec.ID)
			}
			if s.paused() {
				return fmt.Errorf("session %s is paused: resume it first", s.rec.ID)
			}
			return nil
		},
	}
	l, err := preview.Listen("127.0.0.1:0", t, b.log.With("session", s.rec.ID, "previewPort", port))
	if err != nil {
		ns.Close()
		b.watchers.Done()
		return nil, err
	}
	if b.previews.m == nil {
		b.previews.m = map[previewKey]*preview.Listener{}
	}
	b.previews.m[key] = l
	go func() {
		defer b.watchers.Done()
		select {
		case <-s.done:
		case <-b.stop:
		}
		b.previews.mu.Lock()
		if b.previews.m[key] == l {
			delete(b.previews.m, key)
		}
		b.previews.mu.Unlock()
		l.Close()
		ns.Close()
	}()
	b.log.Debug("preview port exposed", "session", s.rec.ID, "port", port, "addr", l.Addr())
	return l, nil
}

// dialInNetns connects to 127.0.0.1:port inside the network namespace ns. The socket is made
// on a thread locked to this goroutine and moved into ns, and the thread is moved back before
// it runs anything else; a thread that cannot be moved back is never reused (the goroutine
// ends locked, and the runtime discards its thread).
func dialInNetns(ctx context.Context, ns netns.NsHandle, port int) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, err}
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, fmt.Errorf("enter the sandbox's network namespace: %w", err)}
			return
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if rerr := netns.Set(orig); rerr != nil {
			if c != nil {
				c.Close()
			}
			ch <- result{nil, fmt.Errorf("leave the sandbox's network namespace: %w", rerr)}
			return // still locked: the thread goes with the goroutine
		}
		runtime.UnlockOSThread()
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}
