package agent_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
	"github.com/airlock-sandbox/airlock/token"
)

// TestTokenRefusals: every call but health needs a valid token for this sandbox, session,
// generation and class; each refusal names its reason.
func TestTokenRefusals(t *testing.T) {
	h := newHarness(t).start()
	_, otherKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := token.Mint(otherKey, token.Claims{Sandbox: h.cfg.SandboxID, Session: h.cfg.SessionID, Generation: h.cfg.Generation, Class: token.Execute, Expiry: time.Now().Add(time.Hour).Unix()})
	if err != nil {
		t.Fatal(err)
	}
	good := h.token(token.Execute, nil)
	// One character in the middle of the signature changed (every bit there is significant).
	i := strings.IndexByte(good, '.') + 20
	flip := byte('A')
	if good[i] == 'A' {
		flip = 'B'
	}
	tampered := good[:i] + string(flip) + good[i+1:]
	tests := []struct {
		name   string
		header string // full Authorization header; "" sends none
		status int
		reason string
	}{
		{"missing", "", 401, ""},
		{"wrong scheme", "Basic " + good, 401, ""},
		{"empty bearer", "Bearer ", 401, ""},
		{"garbage", "Bearer not-a-token", 403, string(token.ReasonMalformed)},
		{"key not in ring", "Bearer " + foreign, 403, string(token.ReasonBadSignature)},
		{"tampered signature", "Bearer " + tampered, 403, string(token.ReasonBadSignature)},
		{"wrong sandbox", "Bearer " + h.token(token.Execute, func(c *token.Claims) { c.Sandbox = "other" }), 403, string(token.ReasonWrongSandbox)},
		{"wrong session", "Bearer " + h.token(token.Execute, func(c *token.Claims) { c.Session = "other" }), 403, string(token.ReasonWrongSession)},
		{"older generation", "Bearer " + h.token(token.Execute, func(c *token.Claims) { c.Generation-- }), 403, string(token.ReasonStaleGeneration)},
		{"newer generation", "Bearer " + h.token(token.Execute, func(c *token.Claims) { c.Generation++ }), 403, string(token.ReasonStaleGeneration)},
		{"expired", "Bearer " + h.token(token.Execute, func(c *token.Claims) { c.Expiry = time.Now().Add(-time.Minute).Unix() }), 403, string(token.ReasonExpired)},
		{"manage token for execute calls", "Bearer " + h.token(token.Manage, nil), 403, string(token.ReasonWrongClass)},
	}
	calls := []struct{ method, path, body string }{
		{"POST", "/v1/exec", `{"argv":["true"],"timeoutMs":1000}`},
		{"GET", "/v1/files?path=/", ""},
		{"PUT", "/v1/files?path=/x", "data"},
		{"GET", "/v1/files/list?path=/", ""},
		{"GET", "/v1/files/stat?path=/", ""},
		{"POST", "/v1/files/mkdir", `{"path":"/d"}`},
		{"POST", "/v1/files/remove", `{"path":"/d"}`},
		{"POST", "/v1/files/rename", `{"from":"/a","to":"/b"}`},
		{"GET", "/v1/processes", ""},
		{"POST", "/v1/processes", `{"argv":["true"],"timeoutMs":1000}`},
	}
	for _, tc := range tests {
		for _, call := range calls {
			t.Run(tc.name+" "+call.method+" "+call.path, func(t *testing.T) {
				status, body := h.rawHeader(call.method, call.path, tc.header, strings.NewReader(call.body))
				var we wire.Error
				if err := json.Unmarshal(body, &we); err != nil {
					t.Fatalf("status %d, body %q is not an error object", status, body)
				}
				if status != tc.status || we.Reason != tc.reason {
					t.Errorf("status %d reason %q (%s), want %d %q", status, we.Reason, body, tc.status, tc.reason)
				}
				wantCode := map[int]string{401: "unauthenticated", 403: "forbidden"}[tc.status]
				if we.Code != wantCode {
					t.Errorf("code %q, want %q", we.Code, wantCode)
				}
			})
		}
	}
	// Nothing refused above may have acted.
	if _, err := h.cl.Stat(context.Background(), "/x"); !errors.Is(err, sbtypes.ErrNotFound) {
		t.Errorf("a refused PUT wrote /x: stat error %v", err)
	}
	if _, err := h.cl.Stat(context.Background(), "/d"); !errors.Is(err, sbtypes.ErrNotFound) {
		t.Errorf("a refused mkdir made /d: stat error %v", err)
	}
}

// TestTokenInProxyHeader: a Kubernetes API server's pod proxy consumes Authorization, so the
// agent takes the token from X-Airlock-Authorization when Authorization is absent, with the same
// checks; when both are sent Authorization is the one judged.
func TestTokenInProxyHeader(t *testing.T) {
	h := newHarness(t).start()
	good := "Bearer " + h.token(token.Execute, nil)
	bad := "Bearer " + h.token(token.Execute, func(c *token.Claims) { c.Session = "other" })
	tests := []struct {
		name        string
		auth, proxy string
		status      int
		reason      string
	}{
		{"proxy header only", "", good, 200, ""},
		{"proxy header, wrong session", "", bad, 403, string(token.ReasonWrongSession)},
		{"proxy header, not bearer", "", "Basic x", 401, ""},
		{"both: Authorization judged", bad, good, 403, string(token.ReasonWrongSession)},
		{"neither", "", "", 401, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hdr := http.Header{}
			if tc.auth != "" {
				hdr.Set("Authorization", tc.auth)
			}
			if tc.proxy != "" {
				hdr.Set(wire.HeaderAuthorization, tc.proxy)
			}
			status, body := h.rawHeaders("GET", "/v1/files/stat?path=/", hdr, nil)
			if status != tc.status {
				t.Fatalf("status %d (%s), want %d", status, body, tc.status)
			}
			if tc.status != 200 {
				var we wire.Error
				if err := json.Unmarshal(body, &we); err != nil || we.Reason != tc.reason {
					t.Errorf("body %s, want reason %q", body, tc.reason)
				}
			}
		})
	}
}

// TestTokenRefusalsThroughClient: the client maps refusals back to sandbox classes.
func TestTokenRefusalsThroughClient(t *testing.T) {
	h := newHarness(t).start()
	ctx := context.Background()
	_, err := h.clientWith("").Stat(ctx, "/")
	if !errors.Is(err, sbtypes.ErrUnauthenticated) {
		t.Errorf("no token: %v, want ErrUnauthenticated", err)
	}
	expired := h.clientWith(h.token(token.Execute, func(c *token.Claims) { c.Expiry = time.Now().Add(-time.Minute).Unix() }))
	_, err = expired.Exec(ctx, sbtypes.ExecRequest{Argv: []string{"true"}, Timeout: time.Second}, nil, nil)
	var ce *client.Error
	if !errors.Is(err, sbtypes.ErrForbidden) || !errors.As(err, &ce) || ce.Reason != string(token.ReasonExpired) {
		t.Errorf("expired token: %v, want ErrForbidden with reason expired", err)
	}
}

func TestShutdownNeedsManage(t *testing.T) {
	h := newHarness(t).start()
	ctx := context.Background()
	err := h.cl.Shutdown(ctx) // execute token
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Reason != string(token.ReasonWrongClass) {
		t.Fatalf("shutdown with execute token: %v, want wrongClass", err)
	}
	if _, err := h.cl.Health(ctx); err != nil {
		t.Fatalf("agent stopped after a refused shutdown: %v", err)
	}
	if err := h.clientWith(h.token(token.Manage, nil)).Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	<-h.exited
	if code := h.proc.ProcessState.ExitCode(); code != 0 {
		t.Errorf("agent exit code %d after shutdown", code)
	}
}

func TestShutdownDisabled(t *testing.T) {
	h := newHarness(t)
	h.cfg.ShutdownOnManage = false
	h.start()
	err := h.clientWith(h.token(token.Manage, nil)).Shutdown(context.Background())
	if !errors.Is(err, sbtypes.ErrUnsupported) {
		t.Errorf("shutdown on an agent without shutdownOnManage: %v, want ErrUnsupported", err)
	}
}

// TestVerifiedTokenLimits: a token the agent accepted before (and remembers) still expires on
// time and still grants only its class.
func TestVerifiedTokenLimits(t *testing.T) {
	h := newHarness(t).start()
	exp := time.Now().Add(time.Second).Unix() + 1
	tok := h.token(token.Execute, func(c *token.Claims) { c.Expiry = exp })
	exec := func() (int, []byte) {
		return h.raw("POST", "/v1/exec", tok, strings.NewReader(`{"argv":["true"],"timeoutMs":1000}`))
	}
	for range 2 {
		if st, body := exec(); st != 200 {
			t.Fatalf("fresh token: %d %s", st, body)
		}
	}
	if st, body := h.raw("POST", "/v1/shutdown", tok, nil); st != 403 || !strings.Contains(string(body), string(token.ReasonWrongClass)) {
		t.Errorf("accepted execute token on a manage call: %d %s", st, body)
	}
	time.Sleep(time.Until(time.Unix(exp, 0).Add(50 * time.Millisecond)))
	if st, body := exec(); st != 403 || !strings.Contains(string(body), string(token.ReasonExpired)) {
		t.Errorf("remembered token past its expiry: %d %s", st, body)
	}
}
