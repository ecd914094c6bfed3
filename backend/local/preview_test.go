package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/preview"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/token"
)

// freeHostPort is a loopback port nothing on the host listens on right now.
func freeHostPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// webSandbox starts a sandbox declaring port, running python's http.server on it (and on
// undeclared) serving a page that names the sandbox.
func webSandbox(t *testing.T, b *Backend, id string, port, undeclared int) *sandbox.Session {
	t.Helper()
	ctx := context.Background()
	d := hostDecl(id)
	d.PreviewPorts = []int{port}
	s, err := b.Create(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	sh(t, b, s.ID, fmt.Sprintf(`mkdir -p "$HOME/site" && echo "hello from %s" > "$HOME/site/index.html"`, id))
	a, err := b.Connect(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ps := a.(processStarter)
	for _, p := range []int{port, undeclared} {
		if _, err := ps.StartProcess(ctx, client.ProcessRequest{ExecRequest: sandbox.ExecRequest{
			Argv:    []string{"python3", "-m", "http.server", fmt.Sprint(p), "--bind", "127.0.0.1", "--directory", "site"},
			Timeout: 10 * time.Minute,
		}}); err != nil {
			t.Fatal(err)
		}
	}
	// Up when it answers inside the sandbox.
	probe := fmt.Sprintf(`for i in $(seq 200); do python3 -c 'import urllib.request,sys; urllib.request.urlopen("http://127.0.0.1:%d/"); urllib.request.urlopen("http://127.0.0.1:%d/")' 2>/dev/null && exit 0; sleep 0.05; done; exit 1`, port, undeclared)
	sh(t, b, s.ID, probe)
	return s
}

type httpResult struct {
	code int
	body string
}

func get(t *testing.T, c *http.Client, url, bearer string) httpResult {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return httpResult{resp.StatusCode, string(body)}
}

func TestPreview(t *testing.T) {
	b := newTestBackend(t)
	ctx := context.Background()
	if st := b.Capabilities(ctx).Entries[capability.Preview]; !st.Supported {
		t.Fatalf("capability preview: %+v", st)
	}
	port, undeclared := freeHostPort(t), freeHostPort(t)
	a := webSandbox(t, b, "web-a", port, undeclared)
	other := webSandbox(t, b, "web-b", port, undeclared)

	info, err := b.Preview(ctx, a.ID, port, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(info.Addr, "127.0.0.1:") || info.Port != port || !strings.Contains(info.URL, info.Token) {
		t.Fatalf("preview %+v", info)
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Transport: tr, Jar: jar}
	plain := &http.Client{Transport: tr}

	// A person opening the URL: redirected with a cookie, then the sandbox's page.
	if r := get(t, browser, info.URL, ""); r.code != 200 || r.body != "hello from web-a\n" {
		t.Fatalf("opening the preview URL: %+v", r)
	}
	base := "http://" + info.Addr + "/"
	if r := get(t, plain, base, info.Token); r.code != 200 || r.body != "hello from web-a\n" {
		t.Fatalf("bearer preview token: %+v", r)
	}
	b.mu.Lock()
	s := b.sessions[a.ID]
	b.mu.Unlock()
	now := time.Now()
	exec, err := token.Mint(s.key, token.Claims{Sandbox: "web-a", Session: a.ID, Generation: 1, Class: token.Execute, Expiry: now.Add(time.Minute).Unix()})
	if err != nil {
		t.Fatal(err)
	}
	if r := get(t, plain, base, exec); r.code != 200 {
		t.Fatalf("execute token: %+v", r)
	}
	// Asking again gives the same address.
	if again, err := b.Preview(ctx, a.ID, port, time.Minute); err != nil || again.Addr != info.Addr {
		t.Fatalf("second preview: %+v %v", again, err)
	}

	mint := func(c preview.Claims) string {
		tok, err := preview.Mint(s.key, c)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	claims := func(session string, p int, exp time.Time) preview.Claims {
		return preview.Claims{Sandbox: "web-a", Session: session, Generation: 1, Port: p, IssuedAt: exp.Add(-time.Hour).Unix(), Expiry: exp.Unix()}
	}
	otherInfo, err := b.Preview(ctx, other.ID, port, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		tok  string
		code int
	}{
		{"no token", "", 401},
		{"garbage", "garbage", 401},
		{"expired", mint(claims(a.ID, port, now.Add(-time.Second))), 401},
		{"another session's token", otherInfo.Token, 401},
		{"this key, another session", mint(claims(other.ID, port, now.Add(time.Hour))), 403},
		{"an undeclared port", mint(claims(a.ID, undeclared, now.Add(time.Hour))), 403},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := get(t, plain, base, tc.tok)
			if r.code != tc.code || strings.Contains(r.body, "hello from") {
				t.Fatalf("got %+v, want %d", r, tc.code)
			}
		})
	}
	// The other sandbox's preview serves the other sandbox, with its own token only.
	if r := get(t, plain, "http://"+otherInfo.Addr+"/", otherInfo.Token); r.body != "hello from web-b\n" {
		t.Fatalf("other preview: %+v", r)
	}
	if r := get(t, plain, "http://"+otherInfo.Addr+"/", info.Token); r.code != 401 {
		t.Fatalf("a's token at b's preview: %+v", r)
	}

	// An undeclared port is never exposed.
	if _, err := b.Preview(ctx, a.ID, undeclared, 0); !errors.Is(err, sandbox.ErrRefused) {
		t.Fatalf("undeclared port: %v", err)
	}
	if _, err := b.Preview(ctx, a.ID, port, 48*time.Hour); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("ttl too long: %v", err)
	}
	// Nothing of the sandbox listens on the host: both servers answer inside it only.
	for _, p := range []int{port, undeclared} {
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", p), 2*time.Second); err == nil {
			c.Close()
			t.Fatalf("port %d is reachable from the host without the proxy", p)
		}
	}

	// Paused: refused with 503 rather than hanging; resumed: served again.
	if err := b.Pause(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if r := get(t, plain, base, info.Token); r.code != 503 {
		t.Fatalf("paused: %+v", r)
	}
	if err := b.Resume(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if r := get(t, plain, base, info.Token); r.code != 200 {
		t.Fatalf("resumed: %+v", r)
	}

	// The session ends, and its preview address with it.
	if err := b.Terminate(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	tr.CloseIdleConnections()
	waitFor(t, "the preview listener to close", func() bool {
		c, err := net.DialTimeout("tcp", info.Addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	if _, err := b.Preview(ctx, a.ID, port, 0); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("preview of a terminated session: %v", err)
	}
}
