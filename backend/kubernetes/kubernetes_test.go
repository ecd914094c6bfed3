package kubernetes

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/airlock-sandbox/airlock/operator/brokerapi"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
	"github.com/airlock-sandbox/airlock/spec"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newTestBackend(t *testing.T, h http.Handler) *Backend {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	b, err := New(Config{BrokerURL: srv.URL, Namespace: "ns", Token: func(context.Context) (string, error) { return "tok", nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func writeErr(w http.ResponseWriter, status int, code string, retry string) {
	if retry != "" {
		w.Header().Set("Retry-After", retry)
	}
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(brokerapi.Error{Code: code, Message: "m"})
}

func TestNewRefusesBadConfig(t *testing.T) {
	for _, cfg := range []Config{
		{BrokerURL: "", Namespace: "ns"},
		{BrokerURL: "ftp://x", Namespace: "ns"},
		{BrokerURL: "http://", Namespace: "ns"},
		{BrokerURL: "http://broker", Namespace: ""},
	} {
		if _, err := New(cfg); !errors.Is(err, sandbox.ErrInvalid) {
			t.Errorf("New(%+v): %v, want invalid", cfg, err)
		}
	}
}

func TestBrokerErrorsMapToClasses(t *testing.T) {
	tests := []struct {
		status int
		code   string
		class  error
	}{
		{401, brokerapi.CodeUnauthenticated, sandbox.ErrUnauthenticated},
		{403, brokerapi.CodeForbidden, sandbox.ErrForbidden},
		{404, brokerapi.CodeNotFound, sandbox.ErrNotFound},
		{409, brokerapi.CodeRefused, sandbox.ErrRefused},
		{400, brokerapi.CodeInvalid, sandbox.ErrInvalid},
		{504, brokerapi.CodeOutcomeUnknown, sandbox.ErrOutcomeUnknown},
		{503, brokerapi.CodeUnavailable, sandbox.ErrUnreachable},
	}
	for _, tc := range tests {
		t.Run(tc.code, func(t *testing.T) {
			b := newTestBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("Authorization") != "Bearer tok" {
					t.Errorf("authorization header %q", r.Header.Get("Authorization"))
				}
				writeErr(w, tc.status, tc.code, "")
			}))
			err := b.Terminate(context.Background(), "sess")
			var be *Error
			if !errors.Is(err, tc.class) || !errors.As(err, &be) || be.Status != tc.status {
				t.Fatalf("Terminate: %v, want class %v status %d", err, tc.class, tc.status)
			}
		})
	}
}

func TestCreateWaitsForAnEmptyPoolThenGivesUp(t *testing.T) {
	var calls atomic.Int32
	b := newTestBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		var req brokerapi.ClaimRequest
		json.NewDecoder(r.Body).Decode(&req)
		if req.Namespace != "ns" || req.Sandbox != "box" || req.Declaration == nil || req.Declaration.ID != "box" {
			t.Errorf("claim request %+v", req)
		}
		writeErr(w, http.StatusServiceUnavailable, brokerapi.CodeUnavailable, "1")
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
	defer cancel()
	_, err := b.Create(ctx, spec.Sandbox{ID: "box", Image: spec.Image{Ref: "x"}})
	if !errors.Is(err, sandbox.ErrDeadlineExceeded) {
		t.Fatalf("Create on an empty pool: %v, want deadline exceeded", err)
	}
	if n := calls.Load(); n < 2 {
		t.Errorf("claimed %d times, want a retry after Retry-After", n)
	}
}

func TestCreateDoesNotRetryRefusals(t *testing.T) {
	var calls atomic.Int32
	b := newTestBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		writeErr(w, http.StatusForbidden, brokerapi.CodeForbidden, "1")
	}))
	if _, err := b.Create(context.Background(), spec.Sandbox{ID: "box"}); !errors.Is(err, sandbox.ErrForbidden) || calls.Load() != 1 {
		t.Fatalf("Create: %v after %d calls, want one forbidden", err, calls.Load())
	}
}

func TestConnectRenewsExpiringTokens(t *testing.T) {
	var reconnects atomic.Int32
	b := newTestBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != brokerapi.PathSessions+"ns/s1" {
			t.Errorf("%s %s", r.Method, r.URL.Path)
		}
		reconnects.Add(1)
		json.NewEncoder(w).Encode(brokerapi.Grant{Session: brokerapi.Session{ID: "s1"}, Endpoint: "tcp:127.0.0.1:1",
			ExecuteToken: "fresh", TokenExpiresAt: time.Now().Add(time.Hour)})
	}))
	b.remember(&brokerapi.Grant{Session: brokerapi.Session{ID: "s1"}, Endpoint: "tcp:127.0.0.1:1", ExecuteToken: "old",
		TokenExpiresAt: time.Now().Add(5 * time.Second)})
	a, err := b.Connect(context.Background(), "s1")
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	if reconnects.Load() != 1 {
		t.Fatalf("a token expiring in 5 s was used without renewal")
	}
	a, _ = b.Connect(context.Background(), "s1")
	a.Close()
	if reconnects.Load() != 1 {
		t.Fatalf("a fresh token was renewed again")
	}
	if _, err := b.Connect(context.Background(), "../x"); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("Connect with a path in the id: %v", err)
	}
}

// TestEndedSessionIsForgotten: once the broker says a session is gone (it idled out), Connect
// does not hand out its remembered grant.
func TestEndedSessionIsForgotten(t *testing.T) {
	b := newTestBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeErr(w, http.StatusNotFound, brokerapi.CodeNotFound, "")
	}))
	b.remember(&brokerapi.Grant{Session: brokerapi.Session{ID: "s1"}, Endpoint: "tcp:127.0.0.1:1", ExecuteToken: "tok",
		TokenExpiresAt: time.Now().Add(time.Hour)})
	if _, err := b.Get(context.Background(), "s1"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("Get: %v, want not found", err)
	}
	if _, err := b.Connect(context.Background(), "s1"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("Connect after the broker said not found: %v, want not found", err)
	}
}

func TestAgentEndpointMustBeTCP(t *testing.T) {
	b := newTestBackend(t, http.NotFoundHandler())
	if _, err := b.agent(&brokerapi.Grant{Endpoint: "unix:/run/agent.sock"}); !errors.Is(err, sandbox.ErrOutcomeUnknown) {
		t.Fatalf("agent for a unix endpoint: %v", err)
	}
}

// TestBrokerTLS: an https broker is verified against CAFile and ServerName; a certificate the CA
// did not issue, or that does not name ServerName, fails before any token is sent.
func TestBrokerTLS(t *testing.T) {
	var sawToken atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			sawToken.Add(1)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte("[]"))
	}))
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "ca.crt")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600)
	tok := func(context.Context) (string, error) { return "tok", nil }
	tests := []struct {
		name       string
		ca, server string
		ok         bool
	}{
		{"trusted CA, the URL's host", ca, "", true},
		{"trusted CA, the name the certificate carries", ca, "example.com", true},
		{"trusted CA, another name", ca, "airlock-broker.airlock-system.svc", false},
		{"system roots only", "", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := sawToken.Load()
			b, err := New(Config{BrokerURL: srv.URL, Namespace: "ns", Token: tok, CAFile: tc.ca, ServerName: tc.server})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			_, err = b.List(context.Background())
			if (err == nil) != tc.ok {
				t.Fatalf("List: %v, want ok %v", err, tc.ok)
			}
			if !tc.ok && sawToken.Load() != before {
				t.Fatal("the token reached a broker that failed verification")
			}
		})
	}
	if _, err := New(Config{BrokerURL: "http://broker", Namespace: "ns", CAFile: ca}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("CAFile with an http URL: %v, want invalid", err)
	}
}

// TestErrorUnwrap: a broker answer's code maps back to its sandbox class through the one
// table (sbtypes.Codes), and the broker's own unavailable to ErrUnreachable.
func TestErrorUnwrap(t *testing.T) {
	for _, c := range sbtypes.Codes {
		code, status := brokerapi.CodeOf(fmt.Errorf("broker: %w", c.Class))
		e := &Error{Status: status, Code: code, Message: "m"}
		if !errors.Is(e, c.Class) || status != c.Status {
			t.Errorf("%s (%d): errors.Is(%v) false, or status not %d", code, status, c.Class, c.Status)
		}
	}
	if !errors.Is(&Error{Status: 503, Code: brokerapi.CodeUnavailable}, sandbox.ErrUnreachable) {
		t.Error("unavailable is not ErrUnreachable")
	}
	if (&Error{Status: 500, Code: brokerapi.CodeInternal}).Unwrap() != nil {
		t.Error("internal has a class")
	}
}

// TestCreateFromConfiguredSandbox: with Config.Sandbox, a declaration with a generated id (a
// run's) is claimed from that Sandbox without a declaration and kept only if it fits; one that
// does not is refused naming what differs, and its session released.
func TestCreateFromConfiguredSandbox(t *testing.T) {
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"ok":true,"protocolVersion":1}`))
	}))
	defer agent.Close()
	pool := spec.Sandbox{ID: "run", Image: spec.Image{Ref: "python:3"}, Limits: spec.Limits{CPU: "1", Memory: "512Mi"}}
	var claims, released []string
	b := newTestBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete {
			released = append(released, r.URL.Path)
			w.WriteHeader(http.StatusNoContent)
			return
		}
		var req brokerapi.ClaimRequest
		json.NewDecoder(r.Body).Decode(&req)
		claims = append(claims, fmt.Sprintf("%s decl=%v", req.Sandbox, req.Declaration != nil))
		spec := pool
		spec.ApplyDefaults()
		json.NewEncoder(w).Encode(brokerapi.Grant{Session: brokerapi.Session{ID: "s1", Namespace: "ns", Sandbox: "run", Spec: spec},
			Endpoint: "tcp:" + strings.TrimPrefix(agent.URL, "http://"), ExecuteToken: "t", TokenExpiresAt: time.Now().Add(time.Hour)})
	}))
	b.cfg.Sandbox = "run"
	life := int64(60)
	tests := []struct {
		name string
		decl spec.Sandbox
		want string // "" fits; else named in the refusal
	}{
		{"fits: other id, labels, shorter lifetime", spec.Sandbox{ID: "run-1a2b", Image: pool.Image, Limits: pool.Limits,
			Labels: map[string]string{"purpose": "run-code"}, Session: spec.Session{MaxLifetimeSeconds: &life}}, ""},
		{"other image", spec.Sandbox{ID: "run-2", Image: spec.Image{Ref: "node:22"}, Limits: pool.Limits}, "image"},
		{"more memory", spec.Sandbox{ID: "run-3", Image: pool.Image, Limits: spec.Limits{CPU: "1", Memory: "1Gi"}}, "limits"},
		{"egress", spec.Sandbox{ID: "run-4", Image: pool.Image, Limits: pool.Limits, Egress: spec.Egress{Mode: spec.EgressAllow}}, "egress"},
		{"longer lifetime", spec.Sandbox{ID: "run-5", Image: pool.Image, Limits: pool.Limits, Session: spec.Session{MaxLifetimeSeconds: func() *int64 { v := int64(1 << 20); return &v }()}}, "maxLifetimeSeconds"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			claims, released = nil, nil
			s, err := b.Create(t.Context(), tc.decl)
			if len(claims) != 1 || claims[0] != "run decl=false" {
				t.Errorf("claims %q, want one from Sandbox run without a declaration", claims)
			}
			if tc.want == "" {
				if err != nil || s.ID != "s1" || len(released) != 0 {
					t.Fatalf("Create: %v, %v; released %q", s, err, released)
				}
				return
			}
			if !errors.Is(err, sandbox.ErrRefused) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "kubernetes.sandbox") {
				t.Fatalf("Create: %v, want ErrRefused naming %q", err, tc.want)
			}
			if len(released) != 1 || !strings.HasSuffix(released[0], "/ns/s1") {
				t.Errorf("released %q, want the claimed session", released)
			}
		})
	}
	// The Sandbox's own id: the exact claim, with the declaration.
	claims = nil
	if _, err := b.Create(t.Context(), pool); err != nil || len(claims) != 1 || claims[0] != "run decl=true" {
		t.Errorf("Create of the Sandbox itself: %v, claims %q", err, claims)
	}
}
