package server

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"sigs.k8s.io/yaml"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/server/api"
	"github.com/airlock-sandbox/airlock/spec"
	"github.com/airlock-sandbox/airlock/token"
)

// fakeBackend holds sessions in memory; it is enough for everything the server decides itself
// (auth, routing, errors, metrics). Exec and files need the real agent: see e2e_test.go.
type fakeBackend struct {
	mu       sync.Mutex
	sessions map[string]*sandbox.Session
	getErr   map[string]error // Get(id) fails with this
	paused   map[string]bool
	stats    map[string]sandbox.Stats
}

func newFake(sessions ...*sandbox.Session) *fakeBackend {
	f := &fakeBackend{sessions: map[string]*sandbox.Session{}, getErr: map[string]error{}, paused: map[string]bool{}}
	for _, s := range sessions {
		f.sessions[s.ID] = s
	}
	return f
}

func (f *fakeBackend) Platform() capability.Platform { return capability.Local }

// Capabilities: everything but the host image, so a create can be refused or go through.
func (f *fakeBackend) Capabilities(context.Context) capability.Set {
	s := capability.Set{Platform: capability.Local, Entries: map[capability.Name]capability.Status{}}
	for _, n := range capability.Names {
		s.Entries[n] = capability.Status{Supported: n != capability.ImageHost, Reason: "the fake says so"}
	}
	return s
}
func (f *fakeBackend) Create(ctx context.Context, d spec.Sandbox) (*sandbox.Session, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := &sandbox.Session{ID: fmt.Sprintf("s-%016d", len(f.sessions)+1), SandboxID: d.ID, State: sandbox.StateRunning, Labels: d.Labels, Spec: d}
	f.sessions[s.ID] = s
	return s, nil
}
func (f *fakeBackend) Get(ctx context.Context, id string) (*sandbox.Session, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.getErr[id]; err != nil {
		return nil, err
	}
	s, ok := f.sessions[id]
	if !ok {
		return nil, fmt.Errorf("%w: session %s", sandbox.ErrNotFound, id)
	}
	c := *s
	if f.paused[id] {
		c.State = sandbox.StatePaused
	}
	return &c, nil
}
func (f *fakeBackend) List(ctx context.Context) ([]*sandbox.Session, error) {
	f.mu.Lock()
	ids := make([]string, 0, len(f.sessions))
	for id := range f.sessions {
		ids = append(ids, id)
	}
	f.mu.Unlock()
	var out []*sandbox.Session
	for _, id := range ids {
		s, _ := f.Get(ctx, id)
		out = append(out, s)
	}
	return out, nil
}
func (f *fakeBackend) Connect(context.Context, string) (sandbox.Agent, error) {
	return nil, fmt.Errorf("%w: the fake has no agents", sandbox.ErrUnsupported)
}
func (f *fakeBackend) Terminate(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.sessions, id)
	return nil
}

// pausingFake adds what the local backend lacks today: pause, stats, egress counts.
type pausingFake struct{ *fakeBackend }

func (f pausingFake) Pause(ctx context.Context, id string) error {
	if _, err := f.Get(ctx, id); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.paused[id] = true
	return nil
}
func (f pausingFake) Resume(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.paused, id)
	return nil
}
func (f pausingFake) Stats(ctx context.Context, id string) (sandbox.Stats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, ok := f.stats[id]
	if !ok {
		return sandbox.Stats{}, sandbox.ErrNotFound
	}
	return st, nil
}
func (f pausingFake) EgressCounts() (uint64, uint64) { return 7, 3 }

func newTestServer(t *testing.T, b sandbox.Backend) (*Server, ed25519.PrivateKey) {
	t.Helper()
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	s, err := New(Options{Backend: b, SigningKey: key, APIKeys: []string{"key-0123456789abcdef"}, Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	return s, key
}

func TestParseBearer(t *testing.T) {
	for _, tc := range []struct {
		h, want, reason string
	}{
		{"Bearer abc", "abc", ""},
		{"bearer abc", "abc", ""},
		{"Bearer   abc", "abc", ""},
		{"Basic abc", "", "scheme"},
		{"Bearer", "", "scheme"},
		{"Bearer ", "", "malformed"},
		{"Bearer a b", "", "malformed"},
		{"Bearer a\tb", "", "malformed"},
		{"abc", "", "scheme"},
	} {
		got, err := parseBearer(tc.h)
		var re *reasonError
		switch {
		case tc.reason == "" && (err != nil || got != tc.want):
			t.Errorf("parseBearer(%q) = %q, %v; want %q", tc.h, got, err, tc.want)
		case tc.reason != "" && (!errors.As(err, &re) || re.reason != tc.reason || !errors.Is(err, sandbox.ErrUnauthenticated)):
			t.Errorf("parseBearer(%q) = %q, %v; want reason %s", tc.h, got, err, tc.reason)
		}
	}
}

func TestAuthenticate(t *testing.T) {
	sess := &sandbox.Session{ID: "s-1", SandboxID: "sb", Generation: 2}
	s, key := newTestServer(t, newFake(sess))
	tok, err := token.Mint(key, token.Claims{Sandbox: "sb", Session: "s-1", Generation: 2, Class: token.Execute, Expiry: time.Now().Add(time.Minute).Unix()})
	if err != nil {
		t.Fatal(err)
	}
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	foreign, _ := token.Mint(other, token.Claims{Sandbox: "sb", Session: "s-1", Generation: 2, Class: token.Execute, Expiry: time.Now().Add(time.Minute).Unix()})
	for _, tc := range []struct {
		name    string
		t       Transport
		headers []string
		via     string // success
		reason  string // failure
	}{
		{"socket, nothing", Unix, nil, viaSocket, ""},
		{"tcp, nothing", TCP, nil, "", "missing"},
		{"tcp, key", TCP, []string{"Bearer key-0123456789abcdef"}, viaAPIKey, ""},
		{"socket, key", Unix, []string{"Bearer key-0123456789abcdef"}, viaAPIKey, ""},
		{"tcp, wrong key", TCP, []string{"Bearer key-0123456789abcdeX"}, "", "unknownKey"},
		{"socket, wrong key", Unix, []string{"Bearer key-0123456789abcdeX"}, "", "unknownKey"},
		{"tcp, key prefix", TCP, []string{"Bearer key-0123456789abcde"}, "", "unknownKey"},
		{"tcp, token", TCP, []string{"Bearer " + tok}, viaToken, ""},
		{"tcp, foreign token", TCP, []string{"Bearer " + foreign}, "", "badSignature"},
		{"tcp, token garbage", TCP, []string{"Bearer a.b"}, "", "malformed"},
		{"tcp, two headers", TCP, []string{"Bearer key-0123456789abcdef", "Bearer key-0123456789abcdef"}, "", "ambiguous"},
		{"tcp, basic", TCP, []string{"Basic a2V5"}, "", "scheme"},
	} {
		r := httptest.NewRequest("GET", "/v1/sandboxes", nil)
		for _, h := range tc.headers {
			r.Header.Add("Authorization", h)
		}
		p, err := s.authenticate(r, tc.t)
		var re *reasonError
		switch {
		case tc.via != "" && (err != nil || p.via != tc.via):
			t.Errorf("%s: %+v, %v; want via %s", tc.name, p, err, tc.via)
		case tc.via == "" && (!errors.As(err, &re) || re.reason != tc.reason || !errors.Is(err, sandbox.ErrUnauthenticated)):
			t.Errorf("%s: %+v, %v; want 401 %s", tc.name, p, err, tc.reason)
		}
	}

	s2, _ := newTestServer(t, newFake())
	s2.opts.RequireAPIKeyOnUnix = true
	if _, err := s2.authenticate(httptest.NewRequest("GET", "/", nil), Unix); !errors.Is(err, sandbox.ErrUnauthenticated) {
		t.Fatalf("socket with a required key, nothing sent: %v", err)
	}
}

// serve runs one request through the full handler.
func serve(h http.Handler, method, path, cred string, body io.Reader) (*httptest.ResponseRecorder, api.Error) {
	r := httptest.NewRequest(method, path, body)
	if cred != "" {
		r.Header.Set("Authorization", "Bearer "+cred)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	var e api.Error
	if w.Code >= 300 {
		_ = json.Unmarshal(w.Body.Bytes(), &e)
	}
	return w, e
}

func TestPauseResumeStatsAndMetrics(t *testing.T) {
	f := newFake(&sandbox.Session{ID: "s-1", SandboxID: "a", State: sandbox.StateRunning},
		&sandbox.Session{ID: "s-2", SandboxID: "b", State: sandbox.StateRunning})
	f.stats = map[string]sandbox.Stats{"s-1": {CPUSeconds: 1.5, MemoryBytes: 4096}, "s-2": {CPUSeconds: 2, MemoryBytes: 8192}}
	s, _ := newTestServer(t, pausingFake{f})
	h := s.Handler(Unix)

	if w, e := serve(h, "POST", "/v1/sandboxes/s-1/pause", "", nil); w.Code != 200 || !strings.Contains(w.Body.String(), `"state":"paused"`) {
		t.Fatalf("pause: %d %s %+v", w.Code, w.Body, e)
	}
	if w, e := serve(h, "POST", "/v1/sandboxes/s-9/pause", "", nil); w.Code != 404 || e.Code != "not_found" {
		t.Fatalf("pause unknown: %d %+v", w.Code, e)
	}
	if w, _ := serve(h, "POST", "/v1/sandboxes/s-1/resume", "", nil); w.Code != 200 || !strings.Contains(w.Body.String(), `"state":"running"`) {
		t.Fatalf("resume: %d %s", w.Code, w.Body)
	}
	if w, _ := serve(h, "GET", "/v1/sandboxes/s-2/stats", "", nil); w.Code != 200 || !strings.Contains(w.Body.String(), `"memoryBytes":8192`) {
		t.Fatalf("stats: %d %s", w.Code, w.Body)
	}
	_ = s.backend.(sandbox.Pauser).Pause(context.Background(), "s-2")

	want := `
# HELP airlock_egress_connections_total Egress connections by policy decision.
# TYPE airlock_egress_connections_total counter
airlock_egress_connections_total{decision="allowed"} 7
airlock_egress_connections_total{decision="denied"} 3
# HELP airlock_sandbox_cpu_seconds_total CPU time a sandbox has used (its cgroup's count).
# TYPE airlock_sandbox_cpu_seconds_total counter
airlock_sandbox_cpu_seconds_total{sandbox="a",session="s-1"} 1.5
airlock_sandbox_cpu_seconds_total{sandbox="b",session="s-2"} 2
# HELP airlock_sandbox_memory_bytes Memory a sandbox uses now (its cgroup's count).
# TYPE airlock_sandbox_memory_bytes gauge
airlock_sandbox_memory_bytes{sandbox="a",session="s-1"} 4096
airlock_sandbox_memory_bytes{sandbox="b",session="s-2"} 8192
# HELP airlock_sandboxes Sandboxes by state.
# TYPE airlock_sandboxes gauge
airlock_sandboxes{state="paused"} 1
airlock_sandboxes{state="running"} 1
airlock_sandboxes{state="terminated"} 0
`
	if err := testutil.GatherAndCompare(s.metrics.reg, strings.NewReader(want),
		"airlock_egress_connections_total", "airlock_sandbox_cpu_seconds_total", "airlock_sandbox_memory_bytes", "airlock_sandboxes"); err != nil {
		t.Fatal(err)
	}
	// Without the optional interfaces: 501 for pause and stats, zero egress, no per-sandbox series.
	plain, _ := newTestServer(t, f)
	if w, e := serve(plain.Handler(Unix), "POST", "/v1/sandboxes/s-1/pause", "", nil); w.Code != 501 || e.Code != "unsupported" {
		t.Fatalf("pause without a Pauser: %d %+v", w.Code, e)
	}
	if n, _ := testutil.GatherAndCount(plain.metrics.reg, "airlock_sandbox_cpu_seconds_total"); n != 0 {
		t.Fatalf("cpu series without stats: %d", n)
	}
}

// TestErrorClassesOverHTTP: what the backend says is the status the caller gets.
func TestErrorClassesOverHTTP(t *testing.T) {
	f := newFake()
	s, _ := newTestServer(t, f)
	h := s.Handler(Unix)
	for _, class := range []error{sandbox.ErrNotFound, sandbox.ErrUnreachable, sandbox.ErrOutcomeUnknown, sandbox.ErrDeadlineExceeded, sandbox.ErrConflict} {
		f.getErr["s-x"] = fmt.Errorf("backend: %w", class)
		want, status := api.CodeOf(class)
		w, e := serve(h, "GET", "/v1/sandboxes/s-x", "", nil)
		if w.Code != status || e.Code != want || !strings.Contains(e.Message, class.Error()) || e.RequestID == "" || w.Header().Get(api.RequestIDHeader) != e.RequestID {
			t.Errorf("%v: %d %+v", class, w.Code, e)
		}
	}
}

func TestCreateBodies(t *testing.T) {
	f := newFake()
	s, _ := newTestServer(t, f)
	s.opts.Templates = map[string]spec.Sandbox{"t": {ID: "tmpl", Image: spec.Image{Host: true}, Labels: map[string]string{"a": "1"}}}
	h := s.Handler(Unix)
	// The fake cannot run the host image.
	w, e := serve(h, "POST", "/v1/sandboxes", "", strings.NewReader("id: yy\nimage: host\n"))
	if w.Code != 422 || e.Code != "refused" || len(e.Problems) == 0 || e.Problems[0].Field != "image" || e.Problems[0].Capability != capability.ImageHost {
		t.Fatalf("yaml declaration: %d %+v", w.Code, e)
	}
	for _, tc := range []struct {
		body, field string
		status      int
	}{
		{`{"id":"x","image":"./rootfs"}`, "", 400},
		{`{"id":"x","image":"docker.io/library/python:3.12","limits":{"memory":"1Ki"}}`, "limits.memory", 400},
		{`{"id":"x","image":"docker.io/library/python:3.12","bogus":1}`, "", 400},
		{`{"template":"t","labels":{"b":"2"},"extra":1}`, "", 400},
		{`{"template":"nope"}`, "", 400},
		{`{"id":"x","image":"docker.io/library/python:3.12"}`, "", 201},
		{`{"template":"t","labels":{"b":"2"}}`, "", 422}, // host image
	} {
		w, e := serve(h, "POST", "/v1/sandboxes", "", strings.NewReader(tc.body))
		if w.Code != tc.status || (tc.field != "" && (len(e.Problems) == 0 || e.Problems[0].Field != tc.field)) {
			t.Errorf("%s: %d %s", tc.body, w.Code, w.Body)
		}
	}
	big := `{"id":"x","image":"host","env":{"A":"` + strings.Repeat("a", DefaultMaxBodyBytes) + `"}}`
	if w, e := serve(h, "POST", "/v1/sandboxes", "", strings.NewReader(big)); w.Code != 413 || e.Code != "too_large" {
		t.Errorf("oversized body: %d %+v", w.Code, e)
	}
	if s.opts.Templates["t"].Labels["b"] != "" {
		t.Errorf("a create changed the template: %v", s.opts.Templates["t"].Labels)
	}
}

func TestTemplatesAreCheckedAtStart(t *testing.T) {
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	_, err := New(Options{Backend: newFake(), SigningKey: key, Templates: map[string]spec.Sandbox{
		"ok":  {ID: "ok", Image: spec.Image{Ref: "docker.io/library/python:3.12"}},
		"bad": {ID: "bad", Image: spec.Image{Host: true}, Limits: spec.Limits{Memory: "lots"}},
	}})
	var r *plan.Refusal
	if !errors.Is(err, sandbox.ErrRefused) || !errors.As(err, &r) || !strings.Contains(err.Error(), `template "bad"`) ||
		!strings.Contains(err.Error(), "imageHost") || !strings.Contains(err.Error(), "limits.memory") || strings.Contains(err.Error(), `"ok"`) {
		t.Fatalf("templates: %v", err)
	}
}

func TestValidRequestID(t *testing.T) {
	for id, ok := range map[string]bool{
		"abc-123": true, "trace:1.2_3": true, "": false, "a b": false, "a\nb": false,
		strings.Repeat("a", 128): true, strings.Repeat("a", 129): false, "é": false,
	} {
		if validRequestID(id) != ok {
			t.Errorf("validRequestID(%q) != %v", id, ok)
		}
	}
}

func TestLabelSelector(t *testing.T) {
	sel, err := parseLabelSelector([]string{"a=1", "b=", "c=x=y"})
	if err != nil || sel["a"] != "1" || sel["b"] != "" || sel["c"] != "x=y" {
		t.Fatalf("%v %v", sel, err)
	}
	for _, bad := range [][]string{{"a"}, {"=1"}, {"a=1", "a=2"}} {
		if _, err := parseLabelSelector(bad); !errors.Is(err, sandbox.ErrInvalid) {
			t.Errorf("%v: %v", bad, err)
		}
	}
	if !matchLabels(map[string]string{"a": "1"}, map[string]string{}) {
		t.Error("an empty selector matches everything")
	}
	if matchLabels(map[string]string{"a": "1"}, map[string]string{"b": ""}) || !matchLabels(map[string]string{"b": ""}, map[string]string{"b": ""}) {
		t.Error("an empty value matches only a label that is there")
	}
}

// TestOpenAPICoversRoutes holds docs/openapi.yaml to the served routes: the same endpoints, and
// the daemon-only ones documented as not taking capability tokens.
func TestOpenAPICoversRoutes(t *testing.T) {
	b, err := os.ReadFile("../docs/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	documented := map[string]*[]map[string][]string{}
	for path, ops := range doc.Paths {
		for method, raw := range ops {
			if method == "parameters" {
				continue
			}
			var op struct {
				Security *[]map[string][]string `json:"security"`
			}
			if err := json.Unmarshal(raw, &op); err != nil {
				t.Fatalf("%s %s: %v", method, path, err)
			}
			documented[strings.ToUpper(method)+" "+path] = op.Security
		}
	}
	s, _ := newTestServer(t, newFake())
	for _, rt := range s.routes() {
		sec, ok := documented[rt.pattern]
		if !ok {
			t.Errorf("%s is served but not in docs/openapi.yaml", rt.pattern)
			continue
		}
		delete(documented, rt.pattern)
		switch rt.need {
		case accessNone:
			if sec == nil || len(*sec) != 0 {
				t.Errorf("%s needs no credential; document security: []", rt.pattern)
			}
		case accessAdmin:
			if sec == nil || slices.ContainsFunc(*sec, func(m map[string][]string) bool { _, tok := m["capabilityToken"]; return tok }) {
				t.Errorf("%s is daemon-only; document security without capabilityToken", rt.pattern)
			}
		default:
			if sec != nil {
				t.Errorf("%s takes tokens; leave the global security", rt.pattern)
			}
		}
	}
	for p := range documented {
		t.Errorf("%s is documented but not served", p)
	}
}
