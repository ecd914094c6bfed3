package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/token"
)

// previewingFake implements Previewer and Snapshotter; what its capability set says decides
// whether the server may use them.
type previewingFake struct {
	*fakeBackend
	refuse capability.Name // this capability is unsupported, with a reason
	calls  []string
	ttls   []time.Duration // of each Preview
}

func (f *previewingFake) Capabilities(ctx context.Context) capability.Set {
	s := f.fakeBackend.Capabilities(ctx)
	if f.refuse != "" {
		s.Entries[f.refuse] = capability.Status{Reason: "the platform has no such thing"}
	}
	return s
}
func (f *previewingFake) Preview(ctx context.Context, id string, port int, ttl time.Duration) (sandbox.PreviewInfo, error) {
	f.calls = append(f.calls, "preview")
	f.ttls = append(f.ttls, ttl)
	return sandbox.PreviewInfo{Port: port, Addr: "127.0.0.1:1", URL: "http://127.0.0.1:1/", Token: "t", ExpiresAt: time.Now().Add(ttl)}, nil
}
func (f *previewingFake) Snapshot(ctx context.Context, id, name string) (sandbox.SnapshotInfo, error) {
	f.calls = append(f.calls, "snapshot")
	return sandbox.SnapshotInfo{Name: name, SessionID: id}, nil
}
func (f *previewingFake) ListSnapshots(context.Context) ([]sandbox.SnapshotInfo, error) {
	f.calls = append(f.calls, "list")
	return nil, nil
}
func (f *previewingFake) DeleteSnapshot(context.Context, string) error {
	f.calls = append(f.calls, "delete")
	return nil
}
func (f *previewingFake) Fork(ctx context.Context, id string, n int) ([]*sandbox.Session, error) {
	f.calls = append(f.calls, "fork")
	return nil, nil
}

var featureRoutes = []struct {
	method, path, body string
	capability         capability.Name
}{
	{"POST", "/v1/sandboxes/s-1/previews", `{"port":8080}`, capability.Preview},
	{"POST", "/v1/sandboxes/s-1/snapshots", `{"name":"n"}`, capability.Snapshot},
	{"POST", "/v1/sandboxes/s-1/fork", `{"count":1}`, capability.Snapshot},
	{"GET", "/v1/snapshots", "", capability.Snapshot},
	{"DELETE", "/v1/snapshots/n", "", capability.Snapshot},
	{"GET", "/v1/sandboxes/s-1/stats", "", capability.Stats},
	{"POST", "/v1/sandboxes/s-1/pause", "", capability.SuspendResume},
	{"PUT", "/v1/sandboxes/s-1/egress", `{"mode":"deny"}`, capability.LiveEgress},
}

// TestOptionalFeaturesAreFoundByCapability: a backend without the interface, or whose
// capability set says no, answers 501 naming the capability; one with both is called.
func TestOptionalFeaturesAreFoundByCapability(t *testing.T) {
	sess := &sandbox.Session{ID: "s-1", SandboxID: "sb", Generation: 1, State: sandbox.StateRunning}
	plain, _ := newTestServer(t, newFake(sess))
	for _, rt := range featureRoutes {
		w, e := serve(plain.Handler(Unix), rt.method, rt.path, "", strings.NewReader(rt.body))
		if w.Code != 501 || e.Code != "unsupported" || !strings.Contains(e.Message, string(rt.capability)+" on local") {
			t.Errorf("%s %s without the interface: %d %+v", rt.method, rt.path, w.Code, e)
		}
	}
	for _, rt := range featureRoutes[:5] {
		f := &previewingFake{fakeBackend: newFake(sess), refuse: rt.capability}
		s, _ := newTestServer(t, f)
		w, e := serve(s.Handler(Unix), rt.method, rt.path, "", strings.NewReader(rt.body))
		if w.Code != 501 || e.Code != "unsupported" || !strings.Contains(e.Message, string(rt.capability)) ||
			!strings.Contains(e.Message, "the platform has no such thing") || len(f.calls) != 0 {
			t.Errorf("%s %s with %s unsupported: %d %+v, calls %v", rt.method, rt.path, rt.capability, w.Code, e, f.calls)
		}
		f.refuse = ""
		if w, e := serve(s.Handler(Unix), rt.method, rt.path, "", strings.NewReader(rt.body)); w.Code >= 300 || len(f.calls) != 1 {
			t.Errorf("%s %s supported: %d %+v, calls %v", rt.method, rt.path, w.Code, e, f.calls)
		}
	}
}

func TestFeatureRequestsAndAccess(t *testing.T) {
	sess := &sandbox.Session{ID: "s-1", SandboxID: "sb", Generation: 1, State: sandbox.StateRunning}
	f := &previewingFake{fakeBackend: newFake(sess)}
	s, key := newTestServer(t, f)
	h := s.Handler(TCP)
	const apiKey = "key-0123456789abcdef"
	for _, tc := range []struct {
		method, path, body string
		status             int
		msg                string
	}{
		{"POST", "/v1/sandboxes/s-1/previews", `{"port":0}`, 400, "port 0"},
		{"POST", "/v1/sandboxes/s-1/previews", `{"port":70000}`, 400, "port 70000"},
		{"POST", "/v1/sandboxes/s-1/previews", `{"port":80,"ttlSeconds":-1}`, 400, "ttlSeconds -1"},
		{"POST", "/v1/sandboxes/s-1/previews", `{"port":80,"ttl":5}`, 400, "unknown field"},
		{"POST", "/v1/sandboxes/s-1/previews", `{"port":80,"ttlSeconds":90}`, 201, ""},
		{"POST", "/v1/sandboxes/s-1/fork", `{"count":0}`, 400, "count 0"},
		{"POST", "/v1/sandboxes/s-1/fork", `{}`, 400, "count 0"},
		{"POST", "/v1/sandboxes/s-1/snapshots", `{"name":"a","extra":1}`, 400, "unknown field"},
		{"GET", "/v1/snapshots", "", 200, ""},
		{"DELETE", "/v1/snapshots/a", "", 204, ""},
	} {
		w, e := serve(h, tc.method, tc.path, apiKey, strings.NewReader(tc.body))
		if w.Code != tc.status || !strings.Contains(e.Message, tc.msg) {
			t.Errorf("%s %s %s: %d %+v", tc.method, tc.path, tc.body, w.Code, e)
		}
	}
	if w, _ := serve(h, "GET", "/v1/snapshots", apiKey, nil); strings.TrimSpace(w.Body.String()) != `{"snapshots":[]}` {
		t.Errorf("empty snapshot list: %s", w.Body)
	}

	// Delegated tokens: an execute token may open a preview of its own session (it can reach
	// the port by exec already); snapshots and forks are the daemon's.
	mint := func(class token.Class) string {
		tok, err := token.Mint(key, token.Claims{Sandbox: "sb", Session: "s-1", Generation: 1, Class: class, Expiry: time.Now().Add(time.Minute).Unix()})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	exec, manage := mint(token.Execute), mint(token.Manage)
	f.ttls = nil
	for _, tc := range []struct {
		cred, method, path, body string
		status                   int
		reason                   string
	}{
		{exec, "POST", "/v1/sandboxes/s-1/previews", `{"port":80}`, 201, ""},
		{manage, "POST", "/v1/sandboxes/s-1/previews", `{"port":80}`, 403, "wrongClass"},
		{exec, "POST", "/v1/sandboxes/s-2/previews", `{"port":80}`, 403, "wrongSession"},
		{exec, "POST", "/v1/sandboxes/s-1/snapshots", `{"name":"a"}`, 403, "delegated"},
		{manage, "POST", "/v1/sandboxes/s-1/fork", `{"count":1}`, 403, "delegated"},
		{exec, "GET", "/v1/snapshots", "", 403, "delegated"},
		{manage, "DELETE", "/v1/snapshots/a", "", 403, "delegated"},
		{exec, "POST", "/v1/sandboxes/s-1/previews", `{"port":80,"ttlSeconds":3600}`, 400, ""},
		{exec, "GET", "/v1/sandboxes/s-1/stats", "", 501, ""},
		{manage, "GET", "/v1/sandboxes/s-1/stats", "", 501, ""},
	} {
		w, e := serve(h, tc.method, tc.path, tc.cred, strings.NewReader(tc.body))
		if w.Code != tc.status || e.Reason != tc.reason {
			t.Errorf("%s %s with a %s token: %d %+v", tc.method, tc.path, tc.cred[:8], w.Code, e)
		}
	}
	// A delegated preview never outlives the token that asked for it (a minute here).
	if len(f.ttls) != 1 || f.ttls[0] > time.Minute || f.ttls[0] < 50*time.Second {
		t.Errorf("the delegated preview's ttl: %v", f.ttls)
	}
}
