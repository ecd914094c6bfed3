package preview

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/airlock-sandbox/airlock/token"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newKey(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func pub(k ed25519.PrivateKey) []ed25519.PublicKey {
	return []ed25519.PublicKey{k.Public().(ed25519.PublicKey)}
}

func claims(port int, exp time.Time) Claims {
	return Claims{Sandbox: "box", Session: "s-1", Generation: 1, Port: port, IssuedAt: exp.Add(-2 * time.Hour).Unix(), Expiry: exp.Unix()}
}

func TestTokenVerify(t *testing.T) {
	k := newKey(t)
	other := newKey(t)
	future := time.Now().Add(time.Hour)
	good, err := Mint(k, claims(8080, future))
	if err != nil {
		t.Fatal(err)
	}
	want := Expect{Sandbox: "box", Session: "s-1", Generation: 1, Port: 8080}
	if c, err := Verify(pub(k), good, want); err != nil || c.Port != 8080 || c.KeyID != token.KeyID(pub(k)[0]) {
		t.Fatalf("good token: %+v %v", c, err)
	}
	mint := func(key ed25519.PrivateKey, c Claims) string {
		tok, err := Mint(key, c)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	withSession := claims(8080, future)
	withSession.Session = "s-2"
	withGen := claims(8080, future)
	withGen.Generation = 2
	payload, sig, _ := strings.Cut(strings.TrimPrefix(good, Prefix), ".")
	agentTok, err := token.Mint(k, token.Claims{Sandbox: "box", Session: "s-1", Generation: 1, Class: token.Execute, Expiry: future.Unix()})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		tok  string
		want error
	}{
		{"other key", mint(other, claims(8080, future)), token.ErrBadSignature},
		{"expired", mint(k, claims(8080, time.Now().Add(-time.Second))), token.ErrExpired},
		{"other port", mint(k, claims(9090, future)), ErrWrongPort},
		{"other session", mint(k, withSession), token.ErrWrongSession},
		{"other generation", mint(k, withGen), token.ErrStaleGeneration},
		{"no prefix", strings.TrimPrefix(good, Prefix), token.ErrMalformed},
		{"agent token", agentTok, token.ErrMalformed},
		{"tampered claims", Prefix + payload[:len(payload)-2] + "x" + payload[len(payload)-1:] + "." + sig, token.ErrBadSignature},
		{"padded", good + "=", token.ErrMalformed},
		{"empty", "", token.ErrMalformed},
		{"huge", Prefix + strings.Repeat("a", token.MaxTokenSize), token.ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Verify(pub(k), tc.tok, want); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
	// A preview token is never an agent token.
	if _, err := token.Verify(token.NewKeyRing(pub(k)...), good, token.Expect{Sandbox: "box", Session: "s-1", Generation: 1, Class: token.Execute}); err == nil {
		t.Fatal("the agent's verifier accepted a preview token")
	}
	if _, err := Mint(k, claims(0, future)); !errors.Is(err, token.ErrInvalid) {
		t.Fatalf("port 0: %v", err)
	}
}

// app is the sandbox's server stand-in: it records what reached it.
type app struct {
	srv  *httptest.Server
	last chan *http.Request
}

func newApp(t *testing.T) *app {
	a := &app{last: make(chan *http.Request, 16)}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.last <- r.Clone(context.Background())
		io.WriteString(w, "app:"+r.URL.Path)
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *app) dial(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", a.srv.Listener.Addr().String())
}

func listen(t *testing.T, k ed25519.PrivateKey, a *app, avail func() error) *Listener {
	t.Helper()
	l, err := Listen("127.0.0.1:0", Target{SandboxID: "box", SessionID: "s-1", Generation: 1, Port: 8080, Keys: pub(k), Dial: a.dial, Available: avail}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func noRedirect() *http.Client {
	return &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func do(t *testing.T, c *http.Client, req *http.Request) (int, string, *http.Response) {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp
}

func TestProxyAuth(t *testing.T) {
	k := newKey(t)
	a := newApp(t)
	l := listen(t, k, a, nil)
	future := time.Now().Add(time.Hour)
	good, _ := Mint(k, claims(8080, future))
	expired, _ := Mint(k, claims(8080, time.Now().Add(-time.Minute)))
	otherPort, _ := Mint(k, claims(9090, future))
	forged, _ := Mint(newKey(t), claims(8080, future))
	exec, _ := token.Mint(k, token.Claims{Sandbox: "box", Session: "s-1", Generation: 1, Class: token.Execute, Expiry: future.Unix()})
	manage, _ := token.Mint(k, token.Claims{Sandbox: "box", Session: "s-1", Generation: 1, Class: token.Manage, Expiry: future.Unix()})
	base := "http://" + l.Addr()
	c := noRedirect()
	for _, tc := range []struct {
		name string
		tok  string
		code int
	}{
		{"preview token", good, 200},
		{"execute token", exec, 200},
		{"none", "", 401},
		{"garbage", "nope", 401},
		{"forged", forged, 401},
		{"expired", expired, 401},
		{"other port", otherPort, 403},
		{"manage token", manage, 403},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("GET", base+"/page?x=1", nil)
			if tc.tok != "" {
				req.Header.Set("Authorization", "Bearer "+tc.tok)
			}
			code, body, _ := do(t, c, req)
			if code != tc.code {
				t.Fatalf("status %d (%s), want %d", code, body, tc.code)
			}
			if code == 200 {
				if body != "app:/page" {
					t.Fatalf("body %q", body)
				}
				if r := <-a.last; r.Header.Get("Authorization") != "" || r.URL.RawQuery != "x=1" {
					t.Fatalf("the credential reached the app: %v %q", r.Header, r.URL.RawQuery)
				}
			} else if strings.Contains(body, tc.tok) && tc.tok != "" {
				t.Fatal("the refusal echoes the token")
			}
		})
	}
	select {
	case r := <-a.last:
		t.Fatalf("a refused request reached the app: %s", r.URL)
	default:
	}
}

func TestProxyLinkFlow(t *testing.T) {
	k := newKey(t)
	a := newApp(t)
	l := listen(t, k, a, nil)
	good, _ := Mint(k, claims(8080, time.Now().Add(time.Hour)))
	c := noRedirect()
	// Opening the link: a cookie and a redirect to the same URL without the token.
	req, _ := http.NewRequest("GET", l.URL(good)+"&keep=1", nil)
	code, _, resp := do(t, c, req)
	if code != http.StatusSeeOther {
		t.Fatalf("link: %d", code)
	}
	loc, _ := url.Parse(resp.Header.Get("Location"))
	if loc.Query().Has(QueryParam) || loc.Query().Get("keep") != "1" {
		t.Fatalf("redirect to %s", loc)
	}
	var cookie *http.Cookie
	for _, ck := range resp.Cookies() {
		if strings.HasPrefix(ck.Name, cookiePrefix) {
			cookie = ck
		}
	}
	if cookie == nil || !cookie.HttpOnly || cookie.Value != good {
		t.Fatalf("cookie %+v", resp.Cookies())
	}
	// Following it with the cookie (and the app's own cookie, and another preview's).
	req, _ = http.NewRequest("GET", "http://"+l.Addr()+loc.String(), nil)
	req.AddCookie(cookie)
	req.AddCookie(&http.Cookie{Name: "appsession", Value: "42"})
	req.AddCookie(&http.Cookie{Name: cookiePrefix + "s-9_80", Value: "someone-elses"})
	if code, body, _ := do(t, c, req); code != 200 || body != "app:/" {
		t.Fatalf("with the cookie: %d %q", code, body)
	}
	r := <-a.last
	if got := r.Header.Get("Cookie"); got != "appsession=42" {
		t.Fatalf("cookies reaching the app: %q", got)
	}
	// A POST with the token in the query is served directly, token removed.
	req, _ = http.NewRequest("POST", l.URL(good), strings.NewReader("body"))
	if code, _, _ := do(t, c, req); code != 200 {
		t.Fatalf("post: %d", code)
	}
	if r := <-a.last; r.URL.Query().Has(QueryParam) {
		t.Fatalf("the token reached the app in %q", r.URL.RawQuery)
	}
}

func TestProxyUnavailable(t *testing.T) {
	k := newKey(t)
	a := newApp(t)
	l := listen(t, k, a, func() error { return errors.New("session s-1 is paused") })
	good, _ := Mint(k, claims(8080, time.Now().Add(time.Hour)))
	req, _ := http.NewRequest("GET", "http://"+l.Addr()+"/", nil)
	req.Header.Set(HeaderName, good)
	if code, body, _ := do(t, noRedirect(), req); code != 503 || !strings.Contains(body, "paused") {
		t.Fatalf("%d %q", code, body)
	}
	// Unauthenticated callers learn nothing about the sandbox's state.
	req, _ = http.NewRequest("GET", "http://"+l.Addr()+"/", nil)
	if code, _, _ := do(t, noRedirect(), req); code != 401 {
		t.Fatalf("unauthenticated: %d", code)
	}
}

func TestListenLoopbackOnly(t *testing.T) {
	k := newKey(t)
	a := newApp(t)
	for _, addr := range []string{"0.0.0.0:0", ":0", "192.0.2.1:0", "localhost:0"} {
		if l, err := Listen(addr, Target{SandboxID: "box", SessionID: "s-1", Port: 1, Keys: pub(k), Dial: a.dial}, nil); err == nil {
			l.Close()
			t.Errorf("%s: listening allowed", addr)
		}
	}
}
