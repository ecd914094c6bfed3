package preview

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/token"
)

// Where a request may carry its credential. The query parameter is for links a person opens:
// the proxy answers it with a cookie and a redirect to the same URL without it.
const (
	QueryParam   = "airlock_token"
	HeaderName   = "X-Airlock-Token"
	cookiePrefix = "airlock_preview_"
)

// Target is one declared port of one sandbox.
type Target struct {
	SandboxID  string
	SessionID  string
	Generation uint64
	Port       int
	// Keys are the session's public keys: they verify preview tokens and execute-class agent
	// tokens (an execute token already lets its holder run anything in the sandbox, so it
	// reaches the sandbox's declared ports too).
	Keys []ed25519.PublicKey
	// Dial connects to the port inside the sandbox.
	Dial func(ctx context.Context) (net.Conn, error)
	// Available, if set, is asked before each authenticated request; an error answers 503
	// with its text (a paused sandbox cannot answer).
	Available func() error
}

func (t *Target) cookieName() string {
	return cookiePrefix + t.SessionID + "_" + strconv.Itoa(t.Port)
}

type handler struct {
	t         Target
	ring      *token.KeyRing
	proxy     *httputil.ReverseProxy
	transport *http.Transport
	log       *slog.Logger
}

// NewHandler returns the proxy for t; close releases its idle connections into the sandbox.
// Every request must carry a token for t: a preview token for this session and port, or an
// execute token for this session. The credential (query parameter, header or cookie) is
// removed before the request reaches the sandbox, and so is every other preview cookie the
// browser sends along (cookies are shared by all ports of 127.0.0.1).
func NewHandler(t Target, log *slog.Logger) (h http.Handler, close func(), err error) {
	if t.Port < 1 || t.Port > 65535 || t.SandboxID == "" || t.SessionID == "" || t.Dial == nil || len(t.Keys) == 0 {
		return nil, nil, fmt.Errorf("%w: preview target needs a sandbox, a session, a port 1..65535, keys and a dialer", token.ErrInvalid)
	}
	ring := token.NewKeyRing()
	for _, k := range t.Keys {
		if err := token.CheckPublicKey(k); err != nil {
			return nil, nil, err
		}
		ring.Add(k)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	tr := &http.Transport{
		DialContext:           func(ctx context.Context, _, _ string) (net.Conn, error) { return t.Dial(ctx) },
		MaxIdleConns:          16,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 0, // long polls and streams are the app's business
	}
	target := &url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(t.Port))}
	x := &handler{t: t, ring: ring, transport: tr, log: log}
	x.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = pr.In.Host // the app builds its links for the address the browser uses
			pr.SetXForwarded()
		},
		Transport: tr,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			http.Error(w, fmt.Sprintf("airlock preview: the sandbox's port %d did not answer: %v", t.Port, err), http.StatusBadGateway)
		},
	}
	return x, tr.CloseIdleConnections, nil
}

type source int

const (
	fromNone source = iota
	fromQuery
	fromBearer
	fromHeader
	fromCookie
)

func (h *handler) credential(r *http.Request) (string, source) {
	if v := r.URL.Query().Get(QueryParam); v != "" {
		return v, fromQuery
	}
	if a := r.Header.Get("Authorization"); a != "" {
		if scheme, v, ok := strings.Cut(a, " "); ok && strings.EqualFold(scheme, "Bearer") {
			return strings.TrimSpace(v), fromBearer
		}
	}
	if v := r.Header.Get(HeaderName); v != "" {
		return v, fromHeader
	}
	if c, err := r.Cookie(h.t.cookieName()); err == nil && c.Value != "" {
		return c.Value, fromCookie
	}
	return "", fromNone
}

// verify accepts a preview token for this port or an execute token for this session.
func (h *handler) verify(tok string) (time.Time, error) {
	if strings.HasPrefix(tok, Prefix) {
		c, err := Verify(h.t.Keys, tok, Expect{Sandbox: h.t.SandboxID, Session: h.t.SessionID, Generation: h.t.Generation, Port: h.t.Port})
		return time.Unix(c.Expiry, 0), err
	}
	c, err := token.Verify(h.ring, tok, token.Expect{Sandbox: h.t.SandboxID, Session: h.t.SessionID, Generation: h.t.Generation, Class: token.Execute})
	return time.Unix(c.Expiry, 0), err
}

// statusFor is 401 for a credential that proves nothing, 403 for a valid one that does not
// grant this session and port.
func statusFor(err error) int {
	var te *token.Error
	if errors.As(err, &te) {
		switch te.Reason {
		case token.ReasonWrongSandbox, token.ReasonWrongSession, token.ReasonStaleGeneration, token.ReasonWrongClass, ReasonWrongPort:
			return http.StatusForbidden
		}
	}
	return http.StatusUnauthorized
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tok, src := h.credential(r)
	if src == fromNone {
		w.Header().Set("WWW-Authenticate", `Bearer realm="airlock-preview"`)
		http.Error(w, "airlock preview: no token: open the preview URL (?"+QueryParam+"=...) or send Authorization: Bearer <token>", http.StatusUnauthorized)
		return
	}
	exp, err := h.verify(tok)
	if err != nil {
		code := statusFor(err)
		if code == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", `Bearer realm="airlock-preview", error="invalid_token"`)
		}
		h.log.Debug("preview request refused", "session", h.t.SessionID, "port", h.t.Port, "err", err)
		// The token errors never hold token or key material.
		http.Error(w, "airlock preview: "+err.Error(), code)
		return
	}
	if h.t.Available != nil {
		if err := h.t.Available(); err != nil {
			http.Error(w, "airlock preview: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
	}
	if src == fromQuery && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		// A link a person opened: keep the credential in a cookie for this address and take it
		// out of the URL (history, Referer, the app's logs).
		http.SetCookie(w, &http.Cookie{
			Name: h.t.cookieName(), Value: tok, Path: "/", Expires: exp,
			HttpOnly: true, SameSite: http.SameSiteLaxMode,
		})
		u := *r.URL
		q := u.Query()
		q.Del(QueryParam)
		u.RawQuery = q.Encode()
		u.Scheme, u.Host = "", ""
		if u.Path == "" {
			u.Path = "/"
		}
		http.Redirect(w, r, u.String(), http.StatusSeeOther)
		return
	}
	out := r.Clone(r.Context())
	strip(out)
	h.proxy.ServeHTTP(w, out)
}

// strip removes every airlock credential from a request bound for the sandbox.
func strip(r *http.Request) {
	if q := r.URL.Query(); q.Has(QueryParam) {
		q.Del(QueryParam)
		r.URL.RawQuery = q.Encode()
	}
	r.Header.Del(HeaderName)
	if a := r.Header.Get("Authorization"); a != "" {
		if scheme, _, ok := strings.Cut(a, " "); ok && strings.EqualFold(scheme, "Bearer") {
			r.Header.Del("Authorization")
		}
	}
	if cs := r.Cookies(); len(cs) > 0 {
		var keep []string
		for _, c := range cs {
			if !strings.HasPrefix(c.Name, cookiePrefix) {
				keep = append(keep, c.Name+"="+c.Value)
			}
		}
		r.Header.Del("Cookie")
		if len(keep) > 0 {
			r.Header.Set("Cookie", strings.Join(keep, "; "))
		}
	}
}

// Listener serves one target on its own loopback address, so each preview is its own origin.
type Listener struct {
	t     Target
	srv   *http.Server
	ln    net.Listener
	done  chan struct{}
	close func()
}

// Listen serves t on addr, which must be a loopback address ("127.0.0.1:0" picks a port).
func Listen(addr string, t Target, log *slog.Logger) (*Listener, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("%w: preview address %q: %v", token.ErrInvalid, addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("%w: preview address %q: only a loopback IP address is allowed", token.ErrInvalid, addr)
	}
	h, closeIdle, err := NewHandler(t, log)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		closeIdle()
		return nil, err
	}
	l := &Listener{
		t:     t,
		srv:   &http.Server{Handler: h, ReadHeaderTimeout: 30 * time.Second, ErrorLog: slog.NewLogLogger(slog.DiscardHandler, slog.LevelError)},
		ln:    ln,
		done:  make(chan struct{}),
		close: closeIdle,
	}
	go func() {
		defer close(l.done)
		_ = l.srv.Serve(ln)
	}()
	return l, nil
}

// Addr is the listener's host:port.
func (l *Listener) Addr() string { return l.ln.Addr().String() }

// URL is the address to open, carrying tok.
func (l *Listener) URL(tok string) string {
	return "http://" + l.Addr() + "/?" + QueryParam + "=" + url.QueryEscape(tok)
}

// Close stops serving and closes every connection, and waits for the server to stop.
func (l *Listener) Close() error {
	err := l.srv.Close()
	<-l.done
	l.close()
	return err
}
