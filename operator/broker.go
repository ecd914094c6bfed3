package operator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	agentclient "github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/operator/api/v1alpha1"
	"github.com/airlock-sandbox/airlock/operator/brokerapi"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
	"github.com/airlock-sandbox/airlock/token"
)

// VerbClaim is the RBAC verb on airlock.dev sandboxes that lets a subject claim, reconnect to
// and release sessions of a Sandbox.
const VerbClaim = "claim"

// Reviewer authenticates a bearer token and authorises a claim.
type Reviewer interface {
	// Authenticate returns the token's user, or an error wrapping sandbox.ErrUnauthenticated.
	Authenticate(ctx context.Context, bearer string) (authnv1.UserInfo, error)
	// Authorize returns nil if u may claim Sandbox namespace/name, else an error wrapping
	// sandbox.ErrForbidden.
	Authorize(ctx context.Context, u authnv1.UserInfo, namespace, name string) error
}

// KubeReviewer asks the API server: TokenReview scoped to Audience, then SubjectAccessReview.
type KubeReviewer struct {
	Client   client.Client
	Audience string
}

// Authenticate implements Reviewer.
func (k *KubeReviewer) Authenticate(ctx context.Context, bearer string) (authnv1.UserInfo, error) {
	tr := &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: bearer, Audiences: []string{k.Audience}}}
	if err := k.Client.Create(ctx, tr); err != nil {
		return authnv1.UserInfo{}, fmt.Errorf("%w: TokenReview: %v", errUnavailable, err)
	}
	if !tr.Status.Authenticated {
		msg := tr.Status.Error
		if msg == "" {
			msg = "token not authenticated"
		}
		return authnv1.UserInfo{}, fmt.Errorf("%w: %s", sandbox.ErrUnauthenticated, msg)
	}
	// A review that authenticates without confirming our audience is a token for someone else.
	ok := false
	for _, a := range tr.Status.Audiences {
		ok = ok || a == k.Audience
	}
	if !ok {
		return authnv1.UserInfo{}, fmt.Errorf("%w: token audience is not %q", sandbox.ErrUnauthenticated, k.Audience)
	}
	return tr.Status.User, nil
}

// Authorize implements Reviewer.
func (k *KubeReviewer) Authorize(ctx context.Context, u authnv1.UserInfo, namespace, name string) error {
	extra := map[string]authzv1.ExtraValue{}
	for key, v := range u.Extra {
		extra[key] = authzv1.ExtraValue(v)
	}
	sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
		ResourceAttributes: &authzv1.ResourceAttributes{
			Namespace: namespace, Verb: VerbClaim, Group: v1alpha1.Group, Resource: v1alpha1.Resource, Name: name,
		},
	}}
	if err := k.Client.Create(ctx, sar); err != nil {
		return fmt.Errorf("%w: SubjectAccessReview: %v", errUnavailable, err)
	}
	if !sar.Status.Allowed || sar.Status.Denied {
		return fmt.Errorf("%w: %s may not %s sandboxes.%s %s/%s", sandbox.ErrForbidden, u.Username, VerbClaim, v1alpha1.Group, namespace, name)
	}
	return nil
}

// Broker is the session broker's HTTP API (package brokerapi). It keeps no state: sessions are
// pod labels and annotations, so a restarted broker serves the same sessions.
type Broker struct {
	Client client.Client // writes (claims, deletes)
	// Reader is the informer cache: the claim path reads Sandboxes and idle pods from it. A stale
	// idle pod costs a resourceVersion conflict, never a double claim; an empty answer falls
	// back to APIReader (uncached) before the pool is called empty.
	Reader    client.Reader
	APIReader client.Reader
	// Idle, when set, hands out the idle pods the informer has seen, each once (IdlePods.Watch
	// feeds it); a claim takes from it, and when it is empty tries a few pods APIReader lists
	// (maxListTries). Without it a claim lists from Reader, then APIReader.
	Idle      *IdlePods
	Reviewer  Reviewer
	Keys      *Keys
	AgentPort int32
	// TokenTTL caps a capability token's life (the session's end caps it too).
	TokenTTL time.Duration
	// RetryAfter is what an empty pool answers with.
	RetryAfter time.Duration
	// DeleteTimeout bounds how long release waits for the pod to be gone.
	DeleteTimeout time.Duration
	// FirstCall makes the first authenticated call to a just-claimed pod's agent, so that the
	// session's idle clock starts at the claim (agent.Config.IdleFromFirstCall); AgentFirstCall
	// is the real one. A pod whose agent does not answer is deleted and the claim moves on to
	// the next. Nil makes no call (unit tests without agents).
	FirstCall func(ctx context.Context, endpoint, executeToken string) error
	Log       *slog.Logger
	Now       func() time.Time
}

// firstCallTimeout bounds the claim's call to the pod's agent.
const firstCallTimeout = 5 * time.Second

// AgentFirstCall returns a Broker.FirstCall that lists the agent's background processes (an
// authenticated call with no effect) over hc.
func AgentFirstCall(hc *http.Client) func(ctx context.Context, endpoint, executeToken string) error {
	return func(ctx context.Context, endpoint, tok string) error {
		hostport, ok := strings.CutPrefix(endpoint, "tcp:")
		if !ok {
			return fmt.Errorf("agent endpoint %q is not tcp:host:port", endpoint)
		}
		_, err := agentclient.NewHTTP("http://"+hostport, hc, func() string { return tok }).Processes(ctx)
		return err
	}
}

// Handler returns the broker's routes.
func (b *Broker) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+brokerapi.PathClaim, b.claim)
	mux.HandleFunc("GET "+brokerapi.PathSessions, b.list)
	mux.HandleFunc("GET "+brokerapi.PathSessions+"{namespace}/{session}", b.reconnect)
	mux.HandleFunc("DELETE "+brokerapi.PathSessions+"{namespace}/{session}", b.release)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	return mux
}

func (b *Broker) now() time.Time {
	if b.Now != nil {
		return b.Now()
	}
	return time.Now()
}

// httpError carries the status and code an error is answered with.
type httpError struct {
	status     int
	code       string
	retryAfter time.Duration
	err        error
}

func (e *httpError) Error() string { return e.err.Error() }

func fail(status int, code string, format string, a ...any) *httpError {
	return &httpError{status: status, code: code, err: fmt.Errorf(format, a...)}
}

// classify maps an error to its HTTP answer, in one place.
func classify(err error) *httpError {
	var he *httpError
	if errors.As(err, &he) {
		return he
	}
	if errors.Is(err, errUnavailable) {
		return &httpError{status: http.StatusServiceUnavailable, code: brokerapi.CodeUnavailable, err: err}
	}
	code, status := brokerapi.CodeOf(err) // the one table: refused 422, outcome unknown 504
	return &httpError{status: status, code: code, err: err}
}

func (b *Broker) writeErr(w http.ResponseWriter, r *http.Request, err error) {
	he := classify(err)
	if he.status >= 500 {
		b.Log.Warn("broker", "method", r.Method, "path", r.URL.Path, "status", he.status, "err", err)
	}
	if he.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((he.retryAfter+time.Second-1)/time.Second)))
	}
	writeJSON(w, he.status, brokerapi.Error{Code: he.code, Message: he.err.Error()})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// caller authenticates the request's bearer token.
func (b *Broker) caller(r *http.Request) (authnv1.UserInfo, error) {
	h := r.Header.Get("Authorization")
	if h == "" {
		// Through the API server's service proxy: it consumed Authorization (the kubeconfig's
		// credential) and passed this one on.
		h = r.Header.Get(brokerapi.HeaderAuthorization)
	}
	tok, ok := strings.CutPrefix(h, "Bearer ")
	if !ok || tok == "" {
		return authnv1.UserInfo{}, fmt.Errorf("%w: no Authorization (or %s): Bearer <ServiceAccount token>", sandbox.ErrUnauthenticated, brokerapi.HeaderAuthorization)
	}
	return b.Reviewer.Authenticate(r.Context(), tok)
}

func checkName(field, v string) error {
	if errs := validation.IsDNS1123Subdomain(v); len(errs) > 0 {
		return fmt.Errorf("%w: %s %q: %s", sandbox.ErrInvalid, field, v, strings.Join(errs, "; "))
	}
	return nil
}

func (b *Broker) claim(w http.ResponseWriter, r *http.Request) {
	g, err := b.doClaim(r)
	if err != nil {
		b.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, g)
}

func (b *Broker) doClaim(r *http.Request) (*brokerapi.Grant, error) {
	tr := &claimTrace{start: b.now()}
	u, err := b.caller(r)
	if err != nil {
		return nil, err
	}
	var req brokerapi.ClaimRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return nil, fmt.Errorf("%w: claim body: %v", sandbox.ErrInvalid, err)
	}
	if err := checkName("namespace", req.Namespace); err != nil {
		return nil, err
	}
	if err := checkName("sandbox", req.Sandbox); err != nil {
		return nil, err
	}
	// Authorisation comes before anything about the Sandbox is revealed, even its existence.
	if err := b.Reviewer.Authorize(r.Context(), u, req.Namespace, req.Sandbox); err != nil {
		return nil, err
	}
	ctx := r.Context()
	var sb v1alpha1.Sandbox
	key := types.NamespacedName{Namespace: req.Namespace, Name: req.Sandbox}
	err = b.reader().Get(ctx, key, &sb)
	if apierrors.IsNotFound(err) && b.Reader != nil {
		err = b.APIReader.Get(ctx, key, &sb) // created a moment ago, not in the cache yet
	}
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("%w: Sandbox %s/%s", sandbox.ErrNotFound, req.Namespace, req.Sandbox)
		}
		return nil, fmt.Errorf("%w: read Sandbox: %v", errUnavailable, err)
	}
	d, err := Accept(&sb)
	if err != nil {
		return nil, err
	}
	if req.Declaration != nil {
		want := *req.Declaration
		want.ApplyDefaults()
		if !sameDeclaration(want, d) {
			return nil, fmt.Errorf("%w: the declaration asked for differs from Sandbox %s/%s's; update the Sandbox, or claim without a declaration", sandbox.ErrRefused, req.Namespace, req.Sandbox)
		}
	}
	if b.Idle != nil {
		tr.from = "queue"
		for p := b.Idle.Pop(req.Namespace, req.Sandbox); p != nil; p = b.Idle.Pop(req.Namespace, req.Sandbox) {
			tr.pops++
			g, err := b.claimPod(ctx, p.DeepCopy(), &req, &sb, d, u, tr)
			if err != nil || g != nil {
				return g, err
			}
		}
		// The queue is empty. Every claimable pod the cache shows went through it, so what the
		// cache still shows idle was handed out already (claimed, or a claim in flight): trying
		// those was an update and a conflict each: on KWOK at 1,000 pods such a claim made 45-49
		// updates in 4.4-6.3 s, and under load one that finally won took 52 s (the p99 of
		// TestScaleKWOK). Only the API can show a pod the informer has not delivered yet: a few
		// of those are tried.
		tr.from = "api list"
		g, err := b.claimFrom(ctx, b.APIReader, &req, &sb, d, u, tr, maxListTries)
		if err != nil || g != nil {
			return g, err
		}
	} else {
		readers, names := []client.Reader{b.reader()}, []string{"api list"}
		if b.Reader != nil {
			readers, names = append(readers, b.APIReader), []string{"cache list", "api list"}
		}
		for i, rd := range readers {
			tr.from = names[i]
			g, err := b.claimFrom(ctx, rd, &req, &sb, d, u, tr, 0)
			if err != nil || g != nil {
				return g, err
			}
		}
	}
	// Debug: the 503 itself is logged as a warning by writeErr; this adds what the claim tried.
	b.Log.Debug("claim found no pod", "namespace", req.Namespace, "sandbox", req.Sandbox, "owner", u.Username,
		"puts", tr.puts, "pops", tr.pops, "took", b.now().Sub(tr.start))
	return nil, &httpError{status: http.StatusServiceUnavailable, code: brokerapi.CodeUnavailable, retryAfter: b.RetryAfter,
		err: fmt.Errorf("Sandbox %s/%s has no idle ready pod (poolSize %d); retry later", req.Namespace, req.Sandbox, sb.Spec.PoolSize)}
}

// maxListTries bounds the pods a claim tries from the API's list once the idle queue is empty:
// that list holds the pods other claims are taking from the queue (a conflict each) besides any
// the informer has not delivered; past a few conflicts the caller is better served by a 503
// and its retry.
const maxListTries = 4

func (b *Broker) reader() client.Reader {
	if b.Reader != nil {
		return b.Reader
	}
	return b.APIReader
}

// claimFrom tries to claim one of the idle ready pods rd lists, updating at most tries of them
// (0: no bound); nil, nil when none could be had.
func (b *Broker) claimFrom(ctx context.Context, rd client.Reader, req *brokerapi.ClaimRequest, sb *v1alpha1.Sandbox, d spec.Sandbox, u authnv1.UserInfo, tr *claimTrace, tries int) (*brokerapi.Grant, error) {
	var pods corev1.PodList
	// No copy of every listed pod (a pool of 1,000 is 1,000 copies per claim): the one tried is
	// copied below; the API reader ignores the option.
	opts := []client.ListOption{client.InNamespace(req.Namespace), client.MatchingLabels{
		LabelSandbox: req.Sandbox, LabelState: StateIdle, LabelManagedBy: ManagedBy,
	}, client.UnsafeDisableDeepCopy}
	if tries > 0 {
		// One page: the whole pool, uncached, cost 2.7 s a claim on KWOK at 1,000 pods (pods in
		// name order, i.e. their random suffixes').
		opts = append(opts, client.Limit(int64(4*tries)))
	}
	if err := rd.List(ctx, &pods, opts...); err != nil {
		return nil, fmt.Errorf("%w: list pool: %v", errUnavailable, err)
	}
	// Random order spreads concurrent claimers over the pool; the resourceVersion precondition
	// of Update makes a pod go to exactly one of them.
	items := pods.Items
	rand.Shuffle(len(items), func(i, j int) { items[i], items[j] = items[j], items[i] })
	for i, puts := 0, tr.puts; i < len(items) && (tries == 0 || tr.puts-puts < tries); i++ {
		// Cache objects are shared (the list did not copy them): never modify them in place.
		g, err := b.claimPod(ctx, items[i].DeepCopy(), req, sb, d, u, tr)
		if err != nil || g != nil {
			return g, err
		}
	}
	return nil, nil
}

// claimPod relabels p (a copy the caller owns) as claimed by u, preconditioned on its
// resourceVersion, and makes the first call to its agent; nil, nil when p went to someone else,
// is not claimable, or its agent did not answer (then it is deleted).
func (b *Broker) claimPod(ctx context.Context, p *corev1.Pod, req *brokerapi.ClaimRequest, sb *v1alpha1.Sandbox, d spec.Sandbox, u authnv1.UserInfo, tr *claimTrace) (*brokerapi.Grant, error) {
	if p.DeletionTimestamp != nil || !podReady(p) || p.Status.StartTime == nil {
		return nil, nil
	}
	if p.Labels == nil || p.Annotations == nil {
		return nil, nil // not a pod this operator built
	}
	now := b.now()
	lifetime := time.Duration(d.Session.Lifetime()) * time.Second
	exp := now.Add(lifetime)
	// activeDeadlineSeconds counts from the pod's start; the session's lifetime counts from now.
	deadline := int64(now.Sub(p.Status.StartTime.Time)/time.Second) + d.Session.Lifetime() + 1
	p.Labels[LabelState] = StateClaimed
	p.Annotations[AnnotationOwner] = u.Username
	p.Annotations[AnnotationClaimedAt] = now.UTC().Format(time.RFC3339)
	p.Annotations[AnnotationExpiresAt] = exp.UTC().Format(time.RFC3339)
	p.Spec.ActiveDeadlineSeconds = &deadline
	tr.puts++
	t0 := b.now()
	err := b.Client.Update(ctx, p)
	tr.update += b.now().Sub(t0)
	if err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return nil, nil // someone else claimed (or the pool replaced) it first
		}
		return nil, fmt.Errorf("%w: claim pod %s: %v", errUnavailable, p.Name, err)
	}
	g, err := b.grant(ctx, p, sb, d, u)
	if err != nil {
		return nil, err
	}
	if b.FirstCall != nil {
		fctx, cancel := context.WithTimeout(ctx, firstCallTimeout)
		t0 := b.now()
		err := b.FirstCall(fctx, g.Endpoint, g.ExecuteToken)
		tr.firstCall += b.now().Sub(t0)
		cancel()
		if err != nil {
			// A session whose agent does not answer is no session: it goes, and the caller
			// gets the next pod instead.
			b.Log.Warn("claimed pod's agent did not answer; deleting the pod", "namespace", p.Namespace, "pod", p.Name, "err", err)
			uid := p.UID
			if derr := b.Client.Delete(ctx, p, client.Preconditions{UID: &uid}); derr != nil && !apierrors.IsNotFound(derr) {
				b.Log.Warn("delete unanswering pod", "namespace", p.Namespace, "pod", p.Name, "err", derr)
			}
			return nil, nil
		}
	}
	b.Log.Info("claimed", "namespace", p.Namespace, "sandbox", req.Sandbox, "pod", p.Name, "session", p.Labels[LabelSession], "owner", u.Username,
		"from", tr.from, "puts", tr.puts, "pops", tr.pops, "took", b.now().Sub(tr.start), "update", tr.update, "firstCall", tr.firstCall)
	return g, nil
}

// claimTrace is what one claim cost, for its log line (the scale test counts these): where the
// pod it got came from (the idle queue, the cache's list, the API's list), the pod updates it made
// (each one but the last lost to another claim or a stale copy), the pods it popped, and the
// time in its pod updates and in the first call to the pod's agent (the rest of took is the
// reviews, reads and token signing).
type claimTrace struct {
	start             time.Time
	from              string
	puts, pops        int
	update, firstCall time.Duration
}

// grant mints tokens for a claimed pod p.
func (b *Broker) grant(ctx context.Context, p *corev1.Pod, sb *v1alpha1.Sandbox, d spec.Sandbox, u authnv1.UserInfo) (*brokerapi.Grant, error) {
	s, err := sessionOf(p, d)
	if err != nil {
		return nil, err
	}
	key, err := b.Keys.Private(ctx, sb.Namespace, sb.Name)
	if err != nil {
		return nil, err
	}
	now := b.now()
	exp := s.ExpiresAt
	if b.TokenTTL > 0 && now.Add(b.TokenTTL).Before(exp) {
		exp = now.Add(b.TokenTTL)
	}
	if !exp.After(now) {
		return nil, fmt.Errorf("%w: session %s has expired", sandbox.ErrNotFound, s.ID)
	}
	claims := token.Claims{Sandbox: d.ID, Session: s.ID, Generation: s.Generation, Class: token.Execute,
		IssuedAt: now.Unix(), Expiry: exp.Unix()}
	g := &brokerapi.Grant{Session: s, Endpoint: fmt.Sprintf("tcp:%s:%d", p.Status.PodIP, b.AgentPort), Pod: p.Name, TokenExpiresAt: time.Unix(exp.Unix(), 0).UTC()}
	if g.ExecuteToken, err = token.Mint(key, claims); err != nil {
		return nil, err
	}
	if s.Owner == u.Username {
		claims.Class = token.Manage
		if g.ManageToken, err = token.Mint(key, claims); err != nil {
			return nil, err
		}
	}
	return g, nil
}

func sessionOf(p *corev1.Pod, d spec.Sandbox) (brokerapi.Session, error) {
	gen, err := strconv.ParseUint(p.Annotations[AnnotationGeneration], 10, 64)
	if err != nil {
		return brokerapi.Session{}, fmt.Errorf("pod %s/%s: annotation %s: %v", p.Namespace, p.Name, AnnotationGeneration, err)
	}
	created, _ := time.Parse(time.RFC3339, p.Annotations[AnnotationClaimedAt])
	exp, err := time.Parse(time.RFC3339, p.Annotations[AnnotationExpiresAt])
	if err != nil {
		return brokerapi.Session{}, fmt.Errorf("pod %s/%s: annotation %s: %v", p.Namespace, p.Name, AnnotationExpiresAt, err)
	}
	return brokerapi.Session{
		ID: p.Labels[LabelSession], Namespace: p.Namespace, Sandbox: p.Labels[LabelSandbox],
		Generation: gen, CreatedAt: created, ExpiresAt: exp, Owner: p.Annotations[AnnotationOwner], Spec: d,
	}, nil
}

// findSession returns the claimed pod of session id in namespace, checking that u may use it:
// claim permission on its Sandbox and ownership.
func (b *Broker) findSession(r *http.Request, u authnv1.UserInfo) (*corev1.Pod, *v1alpha1.Sandbox, error) {
	ns, id := r.PathValue("namespace"), r.PathValue("session")
	if err := checkName("namespace", ns); err != nil {
		return nil, nil, err
	}
	if errs := validation.IsValidLabelValue(id); len(errs) > 0 || id == "" {
		return nil, nil, fmt.Errorf("%w: session id %q is not a session id", sandbox.ErrInvalid, id)
	}
	ctx := r.Context()
	var pods corev1.PodList
	if err := b.APIReader.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{
		LabelSession: id, LabelState: StateClaimed, LabelManagedBy: ManagedBy,
	}); err != nil {
		return nil, nil, fmt.Errorf("%w: find session: %v", errUnavailable, err)
	}
	var p *corev1.Pod
	for i := range pods.Items {
		if pods.Items[i].DeletionTimestamp == nil && !podFinished(&pods.Items[i]) {
			p = &pods.Items[i]
		}
	}
	notFound := fmt.Errorf("%w: session %s/%s", sandbox.ErrNotFound, ns, id)
	if p == nil {
		return nil, nil, notFound
	}
	if err := b.Reviewer.Authorize(ctx, u, ns, p.Labels[LabelSandbox]); err != nil {
		return nil, nil, err
	}
	if p.Annotations[AnnotationOwner] != u.Username {
		return nil, nil, fmt.Errorf("%w: session %s/%s belongs to another user", sandbox.ErrForbidden, ns, id)
	}
	var sb v1alpha1.Sandbox
	if err := b.APIReader.Get(ctx, types.NamespacedName{Namespace: ns, Name: p.Labels[LabelSandbox]}, &sb); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil, notFound
		}
		return nil, nil, fmt.Errorf("%w: read Sandbox: %v", errUnavailable, err)
	}
	return p, &sb, nil
}

func (b *Broker) reconnect(w http.ResponseWriter, r *http.Request) {
	g, err := func() (*brokerapi.Grant, error) {
		u, err := b.caller(r)
		if err != nil {
			return nil, err
		}
		p, sb, err := b.findSession(r, u)
		if err != nil {
			return nil, err
		}
		d, err := Accept(sb)
		if err != nil {
			return nil, err
		}
		if !d.Session.CanReconnect() {
			return nil, fmt.Errorf("%w: Sandbox %s/%s declares session.reconnect false", sandbox.ErrRefused, sb.Namespace, sb.Name)
		}
		if p.Status.PodIP == "" || p.Status.Phase != corev1.PodRunning {
			return nil, fmt.Errorf("%w: session %s pod is %s", sandbox.ErrNotFound, p.Labels[LabelSession], p.Status.Phase)
		}
		return b.grant(r.Context(), p, sb, d, u)
	}()
	if err != nil {
		b.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, g)
}

func (b *Broker) release(w http.ResponseWriter, r *http.Request) {
	err := func() error {
		u, err := b.caller(r)
		if err != nil {
			return err
		}
		p, _, err := b.findSession(r, u)
		if errors.Is(err, sandbox.ErrNotFound) {
			return nil // releasing an absent session succeeds: it is gone
		}
		if err != nil {
			return err
		}
		uid := p.UID
		if err := b.Client.Delete(r.Context(), p, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("%w: delete pod %s/%s: %v", errUnavailable, p.Namespace, p.Name, err)
		}
		return b.waitGone(r.Context(), p)
	}()
	if err != nil {
		b.writeErr(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// waitGone returns once the pod object no longer exists (the kubelet has stopped its containers).
func (b *Broker) waitGone(ctx context.Context, p *corev1.Pod) error {
	timeout := b.DeleteTimeout
	if timeout <= 0 {
		timeout = 60 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		var cur corev1.Pod
		err := b.APIReader.Get(ctx, client.ObjectKeyFromObject(p), &cur)
		if apierrors.IsNotFound(err) || (err == nil && cur.UID != p.UID) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: pod %s/%s still present after %v", sandbox.ErrOutcomeUnknown, p.Namespace, p.Name, timeout)
		case <-t.C:
		}
	}
}

func (b *Broker) list(w http.ResponseWriter, r *http.Request) {
	out, err := func() ([]brokerapi.Session, error) {
		u, err := b.caller(r)
		if err != nil {
			return nil, err
		}
		ns := r.URL.Query().Get("namespace")
		if err := checkName("namespace", ns); err != nil {
			return nil, err
		}
		var pods corev1.PodList
		if err := b.APIReader.List(r.Context(), &pods, client.InNamespace(ns), client.MatchingLabels{
			LabelState: StateClaimed, LabelManagedBy: ManagedBy,
		}); err != nil {
			return nil, fmt.Errorf("%w: list sessions: %v", errUnavailable, err)
		}
		out := []brokerapi.Session{}
		sbs := map[string]*spec.Sandbox{}
		for i := range pods.Items {
			p := &pods.Items[i]
			// A finished pod (idle timeout, lifetime, agent exit) is an ended session, not yet
			// deleted by the controller.
			if p.DeletionTimestamp != nil || p.Annotations[AnnotationOwner] != u.Username || podFinished(p) {
				continue
			}
			name := p.Labels[LabelSandbox]
			d, seen := sbs[name]
			if !seen {
				var sb v1alpha1.Sandbox
				if err := b.APIReader.Get(r.Context(), types.NamespacedName{Namespace: ns, Name: name}, &sb); err == nil {
					if dd, err := Accept(&sb); err == nil {
						d = &dd
					}
				}
				sbs[name] = d
			}
			if d == nil {
				continue
			}
			if s, err := sessionOf(p, *d); err == nil {
				out = append(out, s)
			}
		}
		return out, nil
	}()
	if err != nil {
		b.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// errUnavailable classes failures of the API server the broker depends on (503).
var errUnavailable = errors.New("unavailable")
