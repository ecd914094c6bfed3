//go:build kwok

package scale_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/airlock-sandbox/airlock/operator"
	"github.com/airlock-sandbox/airlock/operator/api/v1alpha1"
	"github.com/airlock-sandbox/airlock/operator/brokerapi"
	"github.com/airlock-sandbox/airlock/spec"
)

// TestScaleKWOK measures the operator at a pool of 1,000 on a KWOK cluster (hack/testcluster/
// kwok.sh: a real API server and etcd, fake nodes whose pods turn Running and Ready at once):
// the pool controller and the broker run in this process, built as cmd/airlock-operator builds
// them (the same client rate limits, cache, reviewer cache), except that a claim makes no first
// call to the pod's agent (Broker.FirstCall nil): KWOK pods run nothing. It reports the fill
// rate (pods/s: a refill is the same path, the pool controller making the idle pods it lacks)
// and claims/s, and fails only if the pool never fills or a pod is
// claimed twice; the figures go to docs/benchmarks.md.
func TestScaleKWOK(t *testing.T) {
	kubeconfig := os.Getenv("AIRLOCK_KWOK_KUBECONFIG")
	if kubeconfig == "" {
		t.Fatal("AIRLOCK_KWOK_KUBECONFIG is unset: run hack/testcluster/kwok.sh up (the tag kwok is the opt-in)")
	}
	const pool = 1000
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	// The operator's own config: ctrl.GetConfig, which turns client-side rate limiting off
	// (the API server's priority and fairness governs).
	t.Setenv("KUBECONFIG", kubeconfig)
	cfg, err := ctrl.GetConfig()
	if err != nil {
		t.Fatal(err)
	}
	kubectl := func(args ...string) {
		t.Helper()
		bin := os.Getenv("AIRLOCK_K8S_KUBECTL")
		if bin == "" {
			bin = "/var/cache/airlock-k8s/bin/kubectl"
		}
		if out, err := exec.Command(bin, append([]string{"--kubeconfig", kubeconfig}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("kubectl %v: %v\n%s", args, err, out)
		}
	}
	kubectl("apply", "--server-side", "-f", "../../deploy/helm/airlock/crds/airlock.dev_sandboxes.yaml")
	kubectl("wait", "--for", "condition=established", "--timeout=60s", "crd/sandboxes.airlock.dev")

	// One HTTP client for every API call, its idle connections closed at the end (the leak check).
	apiHC, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(apiHC.CloseIdleConnections)
	cs, err := kubernetes.NewForConfigAndClient(cfg, apiHC)
	if err != nil {
		t.Fatal(err)
	}
	suffix := fmt.Sprintf("%d", time.Now().UnixNano()%1e6)
	opNS, ns := "airlock-system-"+suffix, "scale-"+suffix
	for _, n := range []string{opNS, ns} {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			// No controller-manager runs here: nothing deletes a namespace's pods but this, and
			// pods left behind hold the fake nodes' capacity (10 × 200) from the next run's fill.
			// One DeleteCollection on a loaded API server can stop part way: until none is left.
			cctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			for cctx.Err() == nil {
				cs.CoreV1().Pods(n).DeleteCollection(cctx, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, metav1.ListOptions{})
				l, err := cs.CoreV1().Pods(n).List(cctx, metav1.ListOptions{Limit: 1})
				if err == nil && len(l.Items) == 0 {
					break
				}
			}
			cs.CoreV1().Namespaces().Delete(context.Background(), n, metav1.DeleteOptions{})
		})
	}
	master := make([]byte, 32)
	rand.Read(master)
	mustCreate(t, ctx, cs.CoreV1().Secrets(opNS).Create, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "airlock-master"}, Data: map[string][]byte{"master": master}})
	mustCreate(t, ctx, cs.CoreV1().ServiceAccounts(ns).Create, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "app"}})
	// No controller-manager runs on the KWOK cluster: the namespace's default ServiceAccount,
	// which pods are admitted with, is made here.
	mustCreate(t, ctx, cs.CoreV1().ServiceAccounts(ns).Create, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}})
	mustCreate(t, ctx, cs.RbacV1().Roles(ns).Create, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "claim"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{v1alpha1.Group}, Resources: []string{v1alpha1.Resource}, Verbs: []string{operator.VerbClaim}}}})
	mustCreate(t, ctx, cs.RbacV1().RoleBindings(ns).Create, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "claim"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "claim"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "app", Namespace: ns}}})
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "app", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{brokerapi.DefaultAudience}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	token := tr.Status.Token

	// The operator, as cmd/airlock-operator builds it.
	scheme := runtime.NewScheme()
	clientgoscheme.AddToScheme(scheme)
	v1alpha1.AddToScheme(scheme)
	managed := labels.SelectorFromSet(labels.Set{operator.LabelManagedBy: operator.ManagedBy})
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}:                 {Label: managed},
			&networkingv1.NetworkPolicy{}: {Label: managed},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mgr.GetHTTPClient().CloseIdleConnections) // after the manager stops (cleanups run last-in first-out)
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctrl.SetLogger(logr.FromSlogHandler(logger.Handler()))
	keys := &operator.Keys{Reader: mgr.GetAPIReader(), Namespace: opNS, Secret: "airlock-master", TTL: 30 * time.Second}
	pods := operator.PodOptions{AirlockImage: "airlock.local/airlock:dev", PullPolicy: corev1.PullIfNotPresent,
		AgentPort: operator.DefaultAgentPort, OperatorNS: opNS, BrokerSelector: map[string]string{"app": "airlock-operator"}, GVisorClassName: "gvisor"}
	uids := &operator.CodeUIDs{Reader: mgr.GetClient(), First: operator.DefaultCodeUIDFirst, Last: operator.DefaultCodeUIDLast}
	rec := &operator.PoolReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Keys: keys, Pods: pods, UIDs: uids, Log: logger}
	if err := rec.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	idlePods := &operator.IdlePods{}
	if err := idlePods.Watch(ctx, mgr.GetCache()); err != nil {
		t.Fatal(err)
	}
	traces := &claimTraces{next: logger.Handler(), from: map[string]int{}}
	broker := &operator.Broker{Client: mgr.GetClient(), Reader: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Idle: idlePods,
		Reviewer: &operator.CachingReviewer{Next: &operator.KubeReviewer{Client: mgr.GetClient(), Audience: brokerapi.DefaultAudience}, TTL: 10 * time.Second},
		Keys:     keys, AgentPort: operator.DefaultAgentPort, TokenTTL: time.Hour, RetryAfter: 2 * time.Second, DeleteTimeout: time.Minute, Log: slog.New(traces)}
	mgrCtx, stopMgr := context.WithCancel(ctx)
	mgrDone := make(chan error, 1)
	go func() { mgrDone <- mgr.Start(mgrCtx) }()
	t.Cleanup(func() { stopMgr(); <-mgrDone })
	srv := httptest.NewServer(broker.Handler())
	t.Cleanup(srv.Close)

	idle := func() int32 {
		var sb v1alpha1.Sandbox
		if err := mgr.GetAPIReader().Get(ctx, client.ObjectKey{Namespace: ns, Name: "big"}, &sb); err != nil {
			return -1
		}
		return sb.Status.Idle
	}
	waitIdle := func(what string) time.Duration {
		t.Helper()
		start := time.Now()
		for idle() < pool {
			if ctx.Err() != nil {
				t.Fatalf("%s: idle %d of %d when the test's time ran out", what, idle(), pool)
			}
			time.Sleep(100 * time.Millisecond)
		}
		return time.Since(start)
	}

	// Fill: a Sandbox of poolSize 1000, from nothing to 1000 idle, ready pods.
	sb := &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: "big", Namespace: ns}, Spec: v1alpha1.SandboxSpec{
		Sandbox:  spec.Sandbox{Image: spec.Image{Ref: "airlock.local/sandbox:test"}, Limits: spec.Limits{CPU: "100m", Memory: "64Mi", Disk: "16Mi"}},
		PoolSize: pool}}
	if err := mgr.GetClient().Create(ctx, sb); err != nil {
		t.Fatal(err)
	}
	fill := waitIdle("fill")
	t.Logf("load average at the fill's end: %s", loadavg())
	t.Logf("fill: %d pods idle and ready in %v: %.1f pods/s", pool, fill.Round(time.Millisecond), pool/fill.Seconds())

	// Claims: 32 callers claim until 1000 sessions are granted; no pod twice.
	const callers = 32
	var granted atomic.Int64
	var mu sync.Mutex
	podsSeen := map[string]bool{}
	var lat []time.Duration
	var lastGrant time.Time
	var wg sync.WaitGroup
	body, _ := json.Marshal(brokerapi.ClaimRequest{Namespace: ns, Sandbox: "big"})
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: callers}}
	start := time.Now()
	var failures atomic.Int64
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for granted.Load() < pool && ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+brokerapi.PathClaim, bytes.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+token)
				req.Header.Set("Content-Type", "application/json")
				t0 := time.Now()
				resp, err := hc.Do(req)
				if err != nil {
					failures.Add(1)
					continue
				}
				var g brokerapi.Grant
				derr := json.NewDecoder(resp.Body).Decode(&g)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || derr != nil {
					failures.Add(1)
					if resp.StatusCode == http.StatusServiceUnavailable {
						time.Sleep(50 * time.Millisecond)
					}
					continue
				}
				d := time.Since(t0)
				granted.Add(1)
				mu.Lock()
				lastGrant = time.Now()
				if podsSeen[g.Pod] {
					t.Errorf("pod %s granted twice", g.Pod)
				}
				podsSeen[g.Pod] = true
				lat = append(lat, d)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	claimTime := time.Since(start)
	hc.CloseIdleConnections()
	n := granted.Load()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(p float64) time.Duration { return lat[int(p*float64(len(lat)-1))].Round(100 * time.Microsecond) }
	t.Logf("claims: %d granted by %d callers in %v: %.1f claims/s; latency p50 %v p99 %v; %d answers other than 200 (503 while the cache catches up, conflicts)",
		n, callers, claimTime.Round(time.Millisecond), float64(n)/claimTime.Seconds(), pct(0.5), pct(0.99), failures.Load())
	t.Logf("load average at the claims' end: %s", loadavg())
	var refill corev1.PodList
	if err := mgr.GetAPIReader().List(ctx, &refill, client.InNamespace(ns), client.MatchingLabels{operator.LabelState: operator.StateIdle}); err != nil {
		t.Fatal(err)
	}
	t.Logf("refill at the claims' end: %d idle pods made (the pool controller's writes compete with the claims')", len(refill.Items))
	t.Logf("claims by where the pod came from: %v; pod updates per claim %s; pods popped per claim %s; time in the broker %s",
		traces.from, traces.puts.summary(), traces.pops.summary(), traces.took.summary())
	t.Logf("claims answered 503 (no idle pod): %d; pod updates each %s; time in the broker %s; the last grant came %v after the first claim",
		len(traces.noneTook), traces.nonePuts.summary(), traces.noneTook.summary(), lastGrant.Sub(start).Round(time.Millisecond))
	if n < pool {
		t.Fatalf("%d claims granted, want %d", n, pool)
	}

	// The API server's own ceiling, the peer of claims/s: the same callers make the one write a
	// claim cannot avoid, a resourceVersion-preconditioned pod update changing a label, on
	// pods no one else is updating (the sessions just granted), with no broker in between. The
	// pool controller still runs and wakes on these events as on claims.
	var claimed corev1.PodList
	if err := mgr.GetAPIReader().List(ctx, &claimed, client.InNamespace(ns), client.MatchingLabels{operator.LabelState: operator.StateClaimed}); err != nil {
		t.Fatal(err)
	}
	work := make(chan *corev1.Pod, len(claimed.Items))
	for i := range claimed.Items {
		work <- &claimed.Items[i]
	}
	close(work)
	var puts, putErrs atomic.Int64
	start = time.Now()
	for range callers {
		wg.Go(func() {
			for p := range work {
				p.Labels["scale.airlock.dev/touched"] = "1"
				if _, err := cs.CoreV1().Pods(ns).Update(ctx, p, metav1.UpdateOptions{}); err != nil {
					putErrs.Add(1)
					continue
				}
				puts.Add(1)
			}
		})
	}
	wg.Wait()
	putTime := time.Since(start)
	ceiling := float64(puts.Load()) / putTime.Seconds()
	t.Logf("API server ceiling: %d preconditioned pod updates by %d callers in %v: %.1f/s (%d failed); claims/s is %.2f of it",
		puts.Load(), callers, putTime.Round(time.Millisecond), ceiling, putErrs.Load(), float64(n)/claimTime.Seconds()/ceiling)
	t.Logf("load average at the updates' end: %s", loadavg())
}

// claimTraces counts the broker's "claimed" records (where the pod came from, pod updates and
// pops per claim, time in the broker) and its "claim found no pod" records, and passes the other
// warnings on to next.
type claimTraces struct {
	next             slog.Handler
	mu               sync.Mutex
	from             map[string]int
	puts, pops, took dist
	// Of the claims answered 503 (no idle pod): pod updates and time in the broker.
	nonePuts, noneTook dist
}

func (c *claimTraces) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelDebug // the 503s' traces are debug records
}

func (c *claimTraces) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "claim found no pod" {
		c.mu.Lock()
		defer c.mu.Unlock()
		r.Attrs(func(a slog.Attr) bool {
			switch a.Key {
			case "puts":
				c.nonePuts = append(c.nonePuts, float64(a.Value.Int64()))
			case "took":
				c.noneTook = append(c.noneTook, a.Value.Duration().Seconds())
			}
			return true
		})
		return nil
	}
	if r.Message != "claimed" {
		if c.next.Enabled(ctx, r.Level) {
			return c.next.Handle(ctx, r)
		}
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "from":
			c.from[a.Value.String()]++
		case "puts":
			c.puts = append(c.puts, float64(a.Value.Int64()))
		case "pops":
			c.pops = append(c.pops, float64(a.Value.Int64()))
		case "took":
			c.took = append(c.took, a.Value.Duration().Seconds())
		}
		return true
	})
	return nil
}

func (c *claimTraces) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *claimTraces) WithGroup(string) slog.Handler      { return c }

type dist []float64

func (d dist) summary() string {
	if len(d) == 0 {
		return "(none)"
	}
	s := slices.Clone(d)
	slices.Sort(s)
	at := func(p float64) float64 { return s[int(p*float64(len(s)-1))] }
	return fmt.Sprintf("p50 %.3g p99 %.3g max %.3g", at(0.5), at(0.99), s[len(s)-1])
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return string(bytes.TrimSpace(b))
}

func mustCreate[T any](t *testing.T, ctx context.Context, create func(context.Context, T, metav1.CreateOptions) (T, error), obj T) {
	t.Helper()
	if _, err := create(ctx, obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
