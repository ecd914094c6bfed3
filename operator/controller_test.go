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
	r := &PoolReconciler{Client: c, APIReader: c, Keys: keys, Pods: testPodOpts, CreateParallel: par,
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
