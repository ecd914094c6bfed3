package operator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/airlock-sandbox/airlock/operator/api/v1alpha1"
	"github.com/airlock-sandbox/airlock/operator/brokerapi"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
	"github.com/airlock-sandbox/airlock/token"
)

// fakeReviewer: tokens are "user:<name>"; allowed lists "user ns/name" pairs.
type fakeReviewer struct {
	mu      sync.Mutex
	allowed map[string]bool
	calls   []string
}

func (f *fakeReviewer) Authenticate(_ context.Context, bearer string) (authnv1.UserInfo, error) {
	name, ok := strings.CutPrefix(bearer, "user:")
	if !ok {
		return authnv1.UserInfo{}, fmt.Errorf("%w: invalid bearer token", sandbox.ErrUnauthenticated)
	}
	return authnv1.UserInfo{Username: name}, nil
}

func (f *fakeReviewer) Authorize(_ context.Context, u authnv1.UserInfo, ns, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, u.Username+" "+ns+"/"+name)
	if !f.allowed[u.Username+" "+ns+"/"+name] {
		return fmt.Errorf("%w: %s may not claim %s/%s", sandbox.ErrForbidden, u.Username, ns, name)
	}
	return nil
}

const testMaster = "0123456789abcdef0123456789abcdef"

type brokerFixture struct {
	t   *testing.T
	c   client.Client
	rev *fakeReviewer
	srv *httptest.Server
}

func newScheme(t *testing.T) *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

// newBrokerFixture holds Sandbox ns/box with n idle ready pods built like the controller builds them.
func newBrokerFixture(t *testing.T, n int) *brokerFixture {
	t.Helper()
	sb := sbx("box", nil)
	objs := []client.Object{sb, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "airlock-system", Name: "airlock-master"},
		Data:       map[string][]byte{MasterSecretKey: []byte(testMaster)},
	}}
	c := fake.NewClientBuilder().WithScheme(newScheme(t)).WithObjects(objs...).Build()
	f := &brokerFixture{t: t, c: c, rev: &fakeReviewer{allowed: map[string]bool{"alice ns/box": true, "bob ns/box": true}}}
	for i := range n {
		f.addPod(sb, fmt.Sprintf("box-%d", i), fmt.Sprintf("10.0.0.%d", i+10))
	}
	f.srv = httptest.NewServer(f.broker().Handler())
	t.Cleanup(f.srv.Close)
	return f
}

func (f *brokerFixture) keys() *Keys {
	return &Keys{Reader: f.c, Namespace: "airlock-system", Secret: "airlock-master"}
}

func (f *brokerFixture) broker() *Broker {
	return &Broker{Client: f.c, APIReader: f.c, Reviewer: f.rev, Keys: f.keys(), AgentPort: DefaultAgentPort,
		TokenTTL: time.Hour, RetryAfter: 2 * time.Second, DeleteTimeout: 5 * time.Second,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

func (f *brokerFixture) addPod(sb *v1alpha1.Sandbox, name, ip string) {
	f.t.Helper()
	d, err := Accept(sb)
	if err != nil {
		f.t.Fatal(err)
	}
	ring, err := f.keys().Ring(context.Background(), sb.Namespace, sb.Name)
	if err != nil {
		f.t.Fatal(err)
	}
	p, err := BuildPod(sb, d, testPodOpts, ring, "sess-"+name, "tmpl", uint32(2_000_000+len(name)))
	if err != nil {
		f.t.Fatal(err)
	}
	p.GenerateName, p.Name = "", name
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, StartTime: &metav1.Time{Time: time.Now().Add(-time.Minute)},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if err := f.c.Create(context.Background(), p); err != nil {
		f.t.Fatal(err)
	}
}

func (f *brokerFixture) do(method, path, bearer string, body any) (int, http.Header, []byte) {
	f.t.Helper()
	var rd io.Reader
	if body != nil {
		js, _ := json.Marshal(body)
		rd = bytes.NewReader(js)
	}
	req, _ := http.NewRequest(method, f.srv.URL+path, rd)
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

func (f *brokerFixture) claim(user string) (int, http.Header, *brokerapi.Grant) {
	code, h, b := f.do("POST", brokerapi.PathClaim, "user:"+user, brokerapi.ClaimRequest{Namespace: "ns", Sandbox: "box"})
	if code != http.StatusOK {
		return code, h, nil
	}
	var g brokerapi.Grant
	if err := json.Unmarshal(b, &g); err != nil {
		f.t.Fatal(err)
	}
	return code, h, &g
}

func (f *brokerFixture) pod(name string) *corev1.Pod {
	var p corev1.Pod
	if err := f.c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: name}, &p); err != nil {
		return nil
	}
	return &p
}

func TestClaimMintsTokensThePodAccepts(t *testing.T) {
	f := newBrokerFixture(t, 1)
	code, _, g := f.claim("alice")
	if code != http.StatusOK {
		t.Fatalf("claim: HTTP %d", code)
	}
	p := f.pod("box-0")
	if p.Labels[LabelState] != StateClaimed || p.Annotations[AnnotationOwner] != "alice" {
		t.Fatalf("pod after claim: labels %v annotations owner %q", p.Labels, p.Annotations[AnnotationOwner])
	}
	if p.Spec.ActiveDeadlineSeconds == nil || *p.Spec.ActiveDeadlineSeconds < 3600 {
		t.Errorf("activeDeadlineSeconds %v, want the lifetime (3600 s) past the pod's age", p.Spec.ActiveDeadlineSeconds)
	}
	if g.Endpoint != "tcp:10.0.0.10:7070" || g.Session.ID != "sess-box-0" || g.Session.Owner != "alice" {
		t.Errorf("grant %+v", g)
	}
	// The pod's own agent config (public keys only) verifies both tokens.
	var cfg struct {
		KeyRing   string `json:"keyRing"`
		SessionID string `json:"sessionId"`
		SandboxID string `json:"sandboxId"`
	}
	json.Unmarshal([]byte(p.Annotations[AnnotationAgentConfig]), &cfg)
	ring, err := token.ParseKeyRing([]byte(cfg.KeyRing))
	if err != nil {
		t.Fatal(err)
	}
	for tok, class := range map[string]token.Class{g.ExecuteToken: token.Execute, g.ManageToken: token.Manage} {
		if _, err := token.Verify(ring, tok, token.Expect{Sandbox: cfg.SandboxID, Session: cfg.SessionID, Generation: 1, Class: class}); err != nil {
			t.Errorf("%s token does not verify on its pod: %v", class, err)
		}
	}
}

func TestTokenOfOneSandboxFailsOnAnother(t *testing.T) {
	f := newBrokerFixture(t, 1)
	// The same name in another namespace derives another key.
	other := sbx("box", nil)
	other.Namespace = "ns2"
	f.c.Create(context.Background(), other)
	ring, err := f.keys().Ring(context.Background(), "ns2", "box")
	if err != nil {
		t.Fatal(err)
	}
	_, _, g := f.claim("alice")
	r, _ := token.ParseKeyRing([]byte(ring))
	if _, err := token.Verify(r, g.ExecuteToken, token.Expect{Sandbox: "box", Session: g.Session.ID, Generation: 1, Class: token.Execute}); err == nil {
		t.Fatal("a token for ns/box verifies against ns2/box's key ring")
	}
}

func TestClaimRefusals(t *testing.T) {
	f := newBrokerFixture(t, 1)
	tests := []struct {
		name   string
		bearer string
		body   any
		want   int
		code   string
	}{
		{"no token", "", brokerapi.ClaimRequest{Namespace: "ns", Sandbox: "box"}, 401, brokerapi.CodeUnauthenticated},
		{"garbage token", "garbage", brokerapi.ClaimRequest{Namespace: "ns", Sandbox: "box"}, 401, brokerapi.CodeUnauthenticated},
		{"no RBAC", "user:mallory", brokerapi.ClaimRequest{Namespace: "ns", Sandbox: "box"}, 403, brokerapi.CodeForbidden},
		// Authorisation first: an unauthorised caller cannot learn whether a Sandbox exists.
		{"no RBAC, absent Sandbox", "user:mallory", brokerapi.ClaimRequest{Namespace: "ns", Sandbox: "ghost"}, 403, brokerapi.CodeForbidden},
		{"bad namespace", "user:alice", brokerapi.ClaimRequest{Namespace: "NS!", Sandbox: "box"}, 400, brokerapi.CodeInvalid},
		{"unknown field", "user:alice", map[string]any{"namespace": "ns", "sandbox": "box", "owner": "x"}, 400, brokerapi.CodeInvalid},
		{"other declaration", "user:alice", brokerapi.ClaimRequest{Namespace: "ns", Sandbox: "box", Declaration: func() *spec.Sandbox {
			d := sbx("box", nil).Declaration()
			d.Env = map[string]string{"X": "1"}
			return &d
		}()}, 422, brokerapi.CodeRefused},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, _, body := f.do("POST", brokerapi.PathClaim, tc.bearer, tc.body)
			var e brokerapi.Error
			json.Unmarshal(body, &e)
			if code != tc.want || e.Code != tc.code {
				t.Fatalf("HTTP %d %s (%s), want %d %s", code, e.Code, e.Message, tc.want, tc.code)
			}
		})
	}
	if p := f.pod("box-0"); p.Labels[LabelState] != StateIdle {
		t.Fatal("a refused claim changed the pool")
	}
}

func TestEmptyPoolIs503WithRetryAfter(t *testing.T) {
	f := newBrokerFixture(t, 1)
	if code, _, _ := f.claim("alice"); code != 200 {
		t.Fatalf("first claim: %d", code)
	}
	code, h, _ := f.claim("alice")
	if code != http.StatusServiceUnavailable || h.Get("Retry-After") != "2" {
		t.Fatalf("claim of an empty pool: HTTP %d Retry-After %q, want 503 and 2", code, h.Get("Retry-After"))
	}
}

func TestConcurrentClaimsGetDistinctPods(t *testing.T) {
	f := newBrokerFixture(t, 3)
	const n = 12
	var wg sync.WaitGroup
	grants := make([]*brokerapi.Grant, n)
	codes := make([]int, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i], _, grants[i] = f.claim("alice")
		}()
	}
	wg.Wait()
	seen := map[string]bool{}
	ok := 0
	for i := range n {
		switch codes[i] {
		case 200:
			ok++
			if seen[grants[i].Session.ID] {
				t.Errorf("session %s handed out twice", grants[i].Session.ID)
			}
			seen[grants[i].Session.ID] = true
		case 503:
		default:
			t.Errorf("claim %d: HTTP %d", i, codes[i])
		}
	}
	if ok != 3 {
		t.Errorf("%d claims succeeded on a pool of 3", ok)
	}
}

func TestReconnectReleaseOwnership(t *testing.T) {
	f := newBrokerFixture(t, 1)
	_, _, g := f.claim("alice")
	path := brokerapi.PathSessions + "ns/" + g.Session.ID
	// A fresh broker (a restart): state comes from the pod.
	f.srv.Config.Handler = f.broker().Handler()
	if code, _, _ := f.do("GET", path, "user:alice", nil); code != 200 {
		t.Fatalf("owner reconnect: HTTP %d", code)
	}
	if code, _, _ := f.do("GET", path, "user:bob", nil); code != 403 {
		t.Fatalf("another claimer's reconnect: HTTP %d, want 403", code)
	}
	if code, _, _ := f.do("DELETE", path, "user:bob", nil); code != 403 {
		t.Fatalf("another claimer's release: HTTP %d, want 403", code)
	}
	if code, _, b := f.do("GET", brokerapi.PathSessions+"?namespace=ns", "user:bob", nil); code != 200 || strings.Contains(string(b), g.Session.ID) {
		t.Fatalf("bob's list: HTTP %d %s", code, b)
	}
	if code, _, b := f.do("GET", brokerapi.PathSessions+"?namespace=ns", "user:alice", nil); code != 200 || !strings.Contains(string(b), g.Session.ID) {
		t.Fatalf("alice's list: HTTP %d %s", code, b)
	}
	if code, _, _ := f.do("DELETE", path, "user:alice", nil); code != 204 {
		t.Fatalf("owner release: HTTP %d", code)
	}
	if f.pod("box-0") != nil {
		t.Fatal("pod still exists after release")
	}
	if code, _, _ := f.do("DELETE", path, "user:alice", nil); code != 204 {
		t.Fatalf("second release: HTTP %d, want 204 (idempotent)", code)
	}
	if code, _, _ := f.do("GET", path, "user:alice", nil); code != 404 {
		t.Fatalf("reconnect after release: HTTP %d, want 404", code)
	}
}

// A cache that has not seen the Sandbox or its pods yet must not turn into a 404 or a 503.
func TestClaimFallsBackToTheAPIWhenTheCacheIsBehind(t *testing.T) {
	f := newBrokerFixture(t, 1)
	br := f.broker()
	br.Reader = fake.NewClientBuilder().WithScheme(newScheme(t)).Build() // an empty cache
	f.srv.Config.Handler = br.Handler()
	if code, _, _ := f.claim("alice"); code != http.StatusOK {
		t.Fatalf("claim with an empty cache: HTTP %d, want 200 from the API fallback", code)
	}
}

// TestClaimMakesTheFirstCall: a claim calls the claimed pod's agent with the grant's execute
// token (the session's idle clock starts there); a pod whose agent does not answer is deleted
// and the claim gets another pod.
func TestClaimMakesTheFirstCall(t *testing.T) {
	f := newBrokerFixture(t, 2)
	var mu sync.Mutex
	var calls []string
	br := f.broker()
	br.FirstCall = func(_ context.Context, endpoint, tok string) error {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, endpoint)
		if tok == "" {
			return fmt.Errorf("no token")
		}
		if endpoint == "tcp:10.0.0.10:7070" {
			return fmt.Errorf("dial %s: connection refused", endpoint)
		}
		return nil
	}
	f.srv.Config.Handler = br.Handler()
	code, _, g := f.claim("alice")
	if code != http.StatusOK || g.Endpoint != "tcp:10.0.0.11:7070" {
		t.Fatalf("claim: HTTP %d endpoint %q, want 200 from the pod that answers", code, g.Endpoint)
	}
	mu.Lock()
	if len(calls) == 0 || calls[len(calls)-1] != g.Endpoint {
		t.Errorf("first calls %v, want the granted endpoint last", calls)
	}
	mu.Unlock()
	// Claims take idle pods in random order: the first may have tried box-0 or not; the second
	// has only box-0 left, whose agent does not answer, so it gets none.
	if code, _, _ := f.claim("alice"); code != http.StatusServiceUnavailable {
		t.Fatalf("claim with only the unanswering pod left: HTTP %d, want 503", code)
	}
	if f.pod("box-0") != nil {
		t.Error("the pod whose agent did not answer is still there")
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Contains(calls, "tcp:10.0.0.10:7070") {
		t.Errorf("first calls %v: the unanswering pod was never called", calls)
	}
}

// TestEndedSessionIsGone: a session whose pod has finished (the agent's idle timeout, the
// lifetime deadline) cannot be reconnected to, is not listed, and releasing it succeeds.
func TestEndedSessionIsGone(t *testing.T) {
	f := newBrokerFixture(t, 1)
	_, _, g := f.claim("alice")
	p := f.pod("box-0")
	p.Status.Phase = corev1.PodFailed
	p.Status.Conditions = nil
	if err := f.c.Status().Update(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	path := brokerapi.PathSessions + "ns/" + g.Session.ID
	if code, _, b := f.do("GET", path, "user:alice", nil); code != http.StatusNotFound {
		t.Fatalf("reconnect to an ended session: HTTP %d %s, want 404", code, b)
	}
	if code, _, b := f.do("GET", brokerapi.PathSessions+"?namespace=ns", "user:alice", nil); code != 200 || strings.Contains(string(b), g.Session.ID) {
		t.Fatalf("list: HTTP %d %s, want no ended session", code, b)
	}
	if code, _, _ := f.do("DELETE", path, "user:alice", nil); code != http.StatusNoContent {
		t.Fatalf("release of an ended session: HTTP %d, want 204", code)
	}
}

// TestClaimThroughAPIServerProxy: through the API server's service proxy Authorization is
// gone (the API server consumed it); the token in X-Airlock-Authorization is reviewed the
// same way, and the grant names the pod, for the caller's pod proxy.
func TestClaimThroughAPIServerProxy(t *testing.T) {
	f := newBrokerFixture(t, 1)
	claim := func(hdr string, tok string) (int, brokerapi.Grant) {
		js, _ := json.Marshal(brokerapi.ClaimRequest{Namespace: "ns", Sandbox: "box"})
		req, _ := http.NewRequest("POST", f.srv.URL+brokerapi.PathClaim, bytes.NewReader(js))
		req.Header.Set(hdr, "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var g brokerapi.Grant
		json.NewDecoder(resp.Body).Decode(&g)
		return resp.StatusCode, g
	}
	if code, _ := claim(brokerapi.HeaderAuthorization, "user:mallory"); code != http.StatusForbidden {
		t.Fatalf("unauthorised caller in %s: HTTP %d, want 403", brokerapi.HeaderAuthorization, code)
	}
	if code, _ := claim(brokerapi.HeaderAuthorization, "garbage"); code != http.StatusUnauthorized {
		t.Fatalf("garbage token in %s: HTTP %d, want 401", brokerapi.HeaderAuthorization, code)
	}
	code, g := claim(brokerapi.HeaderAuthorization, "user:alice")
	if code != http.StatusOK || g.Session.Owner != "alice" || g.Pod != "box-0" || g.Endpoint != "tcp:10.0.0.10:7070" {
		t.Fatalf("claim through the proxy header: HTTP %d, grant %+v", code, g)
	}
}

// TestClaimRefusalsAgreeWithPlan: a claim of a Sandbox whose declaration the operator refuses
// for the rules plan shares with it (hostedBy, reserved labels) is answered with the refused
// class and the rule's name, as plan refuses it.
func TestClaimRefusalsAgreeWithPlan(t *testing.T) {
	tests := []struct {
		name, field, rule string
		mut               func(*v1alpha1.SandboxSpec)
	}{
		{"hostedBy", "spec.hostedBy", RuleHostedBy, func(s *v1alpha1.SandboxSpec) { s.HostedBy = "web" }},
		{"reserved label", "spec.labels", RuleReservedLabel, func(s *v1alpha1.SandboxSpec) { s.Labels = map[string]string{"airlock.dev/client": "true"} }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newBrokerFixture(t, 0)
			sb := sbx("bad", tc.mut)
			if err := f.c.Create(context.Background(), sb); err != nil {
				t.Fatal(err)
			}
			f.rev.allowed["alice ns/bad"] = true
			code, _, body := f.do("POST", brokerapi.PathClaim, "user:alice", brokerapi.ClaimRequest{Namespace: "ns", Sandbox: "bad"})
			var e brokerapi.Error
			json.Unmarshal(body, &e)
			want := classify(sandbox.ErrRefused).status // the one table's status for refused
			if code != want || e.Code != brokerapi.CodeRefused || !strings.Contains(e.Message, tc.field) || !strings.Contains(e.Message, tc.rule) {
				t.Fatalf("HTTP %d %s %q, want %d %s naming %s and rule %s", code, e.Code, e.Message, want, brokerapi.CodeRefused, tc.field, tc.rule)
			}
		})
	}
}

// TestClaimTakesFromTheIdleQueue: with an idle queue a claim gets the queued pods in order (no
// list, no shuffle), skips a queued pod another replica took meanwhile, and lists only once
// the queue is empty.
func TestClaimTakesFromTheIdleQueue(t *testing.T) {
	f := newBrokerFixture(t, 4)
	br := f.broker()
	br.Idle = &IdlePods{}
	pods := map[string]*corev1.Pod{}
	for _, p := range listPods(t, f) {
		pods[p.Name] = p.DeepCopy()
	}
	for _, n := range []string{"box-2", "box-0", "box-3"} {
		br.Idle.Observe(pods[n])
	}
	// box-0 goes to another replica first: the queue's copy is stale (a conflict, then the next).
	taken := pods["box-0"].DeepCopy()
	taken.Labels[LabelState] = StateClaimed
	if err := f.c.Update(context.Background(), taken); err != nil {
		t.Fatal(err)
	}
	f.srv.Config.Handler = br.Handler()
	var got []string
	for range 3 {
		code, _, g := f.claim("alice")
		if code != http.StatusOK {
			t.Fatalf("claim: HTTP %d", code)
		}
		got = append(got, g.Pod)
	}
	// box-2 and box-3 from the queue; then the queue is empty and the list finds box-1.
	if want := []string{"box-2", "box-3", "box-1"}; !slices.Equal(got, want) {
		t.Errorf("claimed %v, want %v", got, want)
	}
	if code, _, _ := f.claim("alice"); code != http.StatusServiceUnavailable {
		t.Errorf("claim of an empty pool: HTTP %d, want 503", code)
	}
}

// TestClaimWithAnEmptyQueueTriesFewPods: once the idle queue is empty, what the cache still
// shows idle was handed out already; a claim tries none of those, and at most maxListTries of
// the pods the API lists (claims of other callers in flight on them), then answers 503: claims
// that walked a pool of 1,000 so made 45-49 updates each on KWOK and took seconds.
func TestClaimWithAnEmptyQueueTriesFewPods(t *testing.T) {
	const n = 40
	for _, tc := range []struct {
		name string
		// claimedAtAPI: the pods the cache shows idle were claimed since (it has not seen that);
		// else they are still idle at the API and every update loses to a claim in flight.
		claimedAtAPI bool
		maxPuts      int
	}{
		{"the cache shows handed-out pods the API has claimed", true, 0},
		{"the API shows pods other claims are taking", false, maxListTries},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newBrokerFixture(t, n)
			cache := fake.NewClientBuilder().WithScheme(newScheme(t)).WithObjects(sbx("box", nil))
			for _, p := range listPods(t, f) {
				cache.WithObjects(p.DeepCopy())
				if tc.claimedAtAPI {
					p.Labels[LabelState] = StateClaimed
					if err := f.c.Update(context.Background(), &p); err != nil {
						t.Fatal(err)
					}
				}
			}
			var mu sync.Mutex
			puts := 0
			br := f.broker()
			br.Reader, br.Idle = cache.Build(), &IdlePods{} // every pod handed out already
			br.Client = interceptor.NewClient(f.c.(client.WithWatch), interceptor.Funcs{
				Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
					if _, ok := obj.(*corev1.Pod); ok {
						mu.Lock()
						puts++
						mu.Unlock()
						if !tc.claimedAtAPI {
							return apierrors.NewConflict(schema.GroupResource{Resource: "pods"}, obj.GetName(), errors.New("a claim in flight won"))
						}
					}
					return c.Update(ctx, obj, opts...)
				}})
			f.srv.Config.Handler = br.Handler()
			if code, _, _ := f.claim("alice"); code != http.StatusServiceUnavailable {
				t.Fatalf("claim: HTTP %d, want 503", code)
			}
			mu.Lock()
			defer mu.Unlock()
			if puts > tc.maxPuts {
				t.Errorf("the claim updated %d pods, want at most %d", puts, tc.maxPuts)
			}
		})
	}
}
