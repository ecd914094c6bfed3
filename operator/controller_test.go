package operator

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/airlock-sandbox/airlock/operator/api/v1alpha1"
)

// TestPodEventsWakeTheSandboxOnceAfterTheDelay: a burst of pod events (claims) becomes one
// reconcile of their Sandbox, and none before WakeDelay; pods not owned by a Sandbox wake nothing.
func TestPodEventsWakeTheSandboxOnceAfterTheDelay(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	q := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request](),
		workqueue.TypedRateLimitingQueueConfig[reconcile.Request]{
			DelayingQueue: workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[reconcile.Request]{Clock: clk}),
		})
	defer q.ShutDown()
	r := &PoolReconciler{WakeDelay: time.Second}
	h := r.podWake()
	sb := sbx("box", nil)
	owned := func(name string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(sb, v1alpha1.GroupVersion.WithKind(v1alpha1.Kind))}}}
	}
	ctx := context.Background()
	for i := range 50 {
		p := owned("box-" + string(rune('a'+i%26)))
		h.Update(ctx, event.UpdateEvent{ObjectOld: p, ObjectNew: p}, q)
	}
	h.Create(ctx, event.CreateEvent{Object: owned("box-new")}, q)
	h.Delete(ctx, event.DeleteEvent{Object: owned("box-gone")}, q)
	h.Create(ctx, event.CreateEvent{Object: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "stray"}}}, q)
	if n := q.Len(); n != 0 {
		t.Fatalf("%d reconciles queued before the delay, want 0", n)
	}
	clk.Step(time.Second)
	for q.Len() == 0 { // the delaying queue moves it on its own goroutine
		clk.Step(time.Millisecond)
		time.Sleep(time.Millisecond)
	}
	got, _ := q.Get()
	q.Done(got)
	if want := (reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "box"}}); got != want {
		t.Fatalf("woke %v, want %v", got, want)
	}
	if n := q.Len(); n != 0 {
		t.Fatalf("%d more reconciles queued, want 0 (one per burst)", n)
	}
}

// TestFillCreatesInParallel: the fill has CreateParallel pod creates in flight at once, never
// more, and makes the whole pool.
func TestFillCreatesInParallel(t *testing.T) {
	const pool, par = 24, 4
	sb := sbx("box", func(s *v1alpha1.SandboxSpec) { s.PoolSize = pool })
	var mu sync.Mutex
	inFlight, most := 0, 0
	full := make(chan struct{}) // closed once par creates are in flight together
	c := fake.NewClientBuilder().WithScheme(newScheme(t)).WithStatusSubresource(&v1alpha1.Sandbox{}).
		WithObjects(sb, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: "airlock-system", Name: "airlock-master"},
			Data:       map[string][]byte{MasterSecretKey: []byte(testMaster)},
		}).
		WithInterceptorFuncs(interceptor.Funcs{Create: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if _, ok := obj.(*corev1.Pod); !ok {
				return cl.Create(ctx, obj, opts...)
			}
			mu.Lock()
			inFlight++
			most = max(most, inFlight)
			if inFlight == par {
				select {
				case <-full:
				default:
					close(full)
				}
			}
			mu.Unlock()
			// A serial fill never has par in flight: its first create waits here for ever (until
			// the test's deadline, then it fails).
			select {
			case <-full:
			case <-ctx.Done():
				return ctx.Err()
			}
			err := cl.Create(ctx, obj, opts...)
			mu.Lock()
			inFlight--
			mu.Unlock()
			return err
		}}).Build()
	keys := &Keys{Reader: c, Namespace: "airlock-system", Secret: "airlock-master"}
	r := &PoolReconciler{Client: c, Keys: keys, Pods: testPodOpts, CreateParallel: par,
		UIDs: &CodeUIDs{Reader: c, First: DefaultCodeUIDFirst, Last: DefaultCodeUIDLast},
		Log:  slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(sb)}); err != nil {
		t.Fatal(err)
	}
	var pods corev1.PodList
	if err := c.List(context.Background(), &pods, client.InNamespace("ns")); err != nil {
		t.Fatal(err)
	}
	uids := map[string]bool{}
	for _, p := range pods.Items {
		uids[p.Labels[LabelCodeUID]] = true
	}
	if len(pods.Items) != pool || len(uids) != pool {
		t.Errorf("%d pods with %d distinct code uids, want %d", len(pods.Items), len(uids), pool)
	}
	if most != par {
		t.Errorf("at most %d creates in flight, want %d", most, par)
	}
	var got v1alpha1.Sandbox
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(sb), &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Starting != pool {
		t.Errorf("status.starting %d, want %d", got.Status.Starting, pool)
	}
}

// podsCache is the reconciler's client with a lagging informer cache of pods: pod lists come
// from the snapshot sync last took of the API (c); everything else, writes included, is c.
type podsCache struct {
	client.Client
	snap client.Client
}

func (p *podsCache) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if _, ok := list.(*corev1.PodList); ok {
		return p.snap.List(ctx, list, opts...)
	}
	return p.Client.List(ctx, list, opts...)
}

// TestReconcileCountsPodsTheCacheHasNotShown: the pool is counted from the cache, and the pods
// created that the cache has not shown yet count too: a lagging cache never fills a pool twice,
// and a claim the cache shows is refilled.
func TestReconcileCountsPodsTheCacheHasNotShown(t *testing.T) {
	const pool = 5
	for _, tc := range []struct {
		name       string
		steps      string // r: reconcile, s: the cache catches up, c: a pod is claimed at the API
		pods, idle int    // at the API at the end
	}{
		{"cache shows none of the pods made", "rrr", pool, pool},
		{"cache caught up", "rsrsr", pool, pool},
		{"a claim the cache shows is refilled", "rsccsr", pool + 2, pool},
		{"a claim the cache has not shown waits for it", "rccr", pool, pool - 2},
		{"then is refilled", "rccrsr", pool + 2, pool},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb := sbx("box", func(s *v1alpha1.SandboxSpec) { s.PoolSize = pool })
			c := fake.NewClientBuilder().WithScheme(newScheme(t)).WithStatusSubresource(&v1alpha1.Sandbox{}).
				WithObjects(sb, &corev1.Secret{
					ObjectMeta: metav1.ObjectMeta{Namespace: "airlock-system", Name: "airlock-master"},
					Data:       map[string][]byte{MasterSecretKey: []byte(testMaster)},
				}).Build()
			cache := &podsCache{Client: c, snap: fake.NewClientBuilder().WithScheme(newScheme(t)).Build()}
			ctx := context.Background()
			apiPods := func() []corev1.Pod {
				var l corev1.PodList
				if err := c.List(ctx, &l, client.InNamespace("ns")); err != nil {
					t.Fatal(err)
				}
				return l.Items
			}
			r := &PoolReconciler{Client: cache, Keys: &Keys{Reader: c, Namespace: "airlock-system", Secret: "airlock-master"},
				Pods: testPodOpts, UIDs: &CodeUIDs{Reader: c, First: DefaultCodeUIDFirst, Last: DefaultCodeUIDLast},
				Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
			for _, step := range tc.steps {
				switch step {
				case 'r':
					if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(sb)}); err != nil {
						t.Fatal(err)
					}
				case 's':
					snap := fake.NewClientBuilder().WithScheme(newScheme(t))
					for _, p := range apiPods() {
						snap.WithObjects(p.DeepCopy())
					}
					cache.snap = snap.Build()
				case 'c':
					for _, p := range apiPods() {
						if p.Labels[LabelState] == StateIdle {
							p.Labels[LabelState] = StateClaimed
							if err := c.Update(ctx, &p); err != nil {
								t.Fatal(err)
							}
							break
						}
					}
				}
			}
			pods := apiPods()
			idle := 0
			for _, p := range pods {
				if p.Labels[LabelState] == StateIdle {
					idle++
				}
			}
			if len(pods) != tc.pods || idle != tc.idle {
				t.Errorf("after %q: %d pods, %d idle; want %d, %d idle", tc.steps, len(pods), idle, tc.pods, tc.idle)
			}
		})
	}
}

// TestCreatedPodsForgetsThePodsShownAndTheLost: a created pod counts until the cache shows it,
// or until createdTTL (one the cache never showed, deleted meanwhile, must not hold the pool
// short for ever).
func TestCreatedPodsForgetsThePodsShownAndTheLost(t *testing.T) {
	var c createdPods
	sb, other := types.NamespacedName{Namespace: "ns", Name: "box"}, types.NamespacedName{Namespace: "ns", Name: "other"}
	t0 := time.Now()
	c.add(sb, "a", t0)
	c.add(sb, "b", t0)
	c.add(sb, "c", t0.Add(createdTTL/2))
	c.add(other, "x", t0)
	for _, tc := range []struct {
		seen map[string]bool
		at   time.Duration
		want int
	}{
		{nil, 0, 3},
		{map[string]bool{"a": true}, 0, 2},
		{nil, 0, 2},                        // a, once shown, is forgotten
		{nil, createdTTL + time.Second, 1}, // b is lost; c is younger
		{nil, createdTTL * 2, 0},           // c too
	} {
		if n := c.unseen(sb, tc.seen, t0.Add(tc.at)); n != tc.want {
			t.Errorf("unseen(seen %v, at %v) = %d, want %d", tc.seen, tc.at, n, tc.want)
		}
	}
	if n := c.unseen(other, nil, t0); n != 1 {
		t.Errorf("another Sandbox's unseen = %d, want 1", n)
	}
}
