package operator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/airlock-sandbox/airlock/operator/api/v1alpha1"
	"github.com/airlock-sandbox/airlock/spec"
)

// PoolReconciler keeps each Sandbox's pool of idle pods at spec.poolSize.
type PoolReconciler struct {
	Client client.Client
	// APIReader reads pods uncached: counting from a cache that has not seen the pods just created
	// would create them twice.
	APIReader client.Reader
	Keys      *Keys
	Pods      PodOptions
	UIDs      *CodeUIDs // each pod's code uid, unique among existing pods
	Log       *slog.Logger
	// CreateParallel bounds the pod creates one reconcile has in flight (default 16): a fill of
	// 1,000 one create after another ran at one API round trip per pod.
	CreateParallel int
	// WakeDelay is how long a pod event waits before it reconciles its Sandbox (default 200 ms);
	// the events of that window (a claim each, under load) wake it once. Sandbox events are not
	// delayed.
	WakeDelay time.Duration
}

// SetupWithManager registers the reconciler: Sandboxes, and the pods and policies they own.
func (r *PoolReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.Sandbox{}).
		Watches(&corev1.Pod{}, r.podWake()).
		Owns(&networkingv1.NetworkPolicy{}).
		Named("sandbox-pool").
		Complete(r)
}

// podWake enqueues a pod's Sandbox WakeDelay after the event: events for one Sandbox that
// arrive while it waits add nothing (the delaying queue keeps one entry per request), so a burst
// of claims costs one reconcile (an uncached list of the pool), not one each.
func (r *PoolReconciler) podWake() handler.EventHandler {
	delay := r.WakeDelay
	if delay <= 0 {
		delay = 200 * time.Millisecond
	}
	wake := func(o client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		ref := metav1.GetControllerOf(o)
		if ref == nil || ref.Kind != v1alpha1.Kind || ref.APIVersion != v1alpha1.GroupVersion.String() {
			return
		}
		q.AddAfter(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: ref.Name}}, delay)
	}
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			wake(e.Object, q)
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			wake(e.ObjectNew, q)
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			wake(e.Object, q)
		},
		GenericFunc: func(_ context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			wake(e.Object, q)
		},
	}
}

// Reconcile implements reconcile.Reconciler.
func (r *PoolReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var sb v1alpha1.Sandbox
	if err := r.Client.Get(ctx, req.NamespacedName, &sb); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if sb.DeletionTimestamp != nil {
		return ctrl.Result{}, nil // owner references let the garbage collector remove the pods
	}
	// Idle pods uncached: counting from a cache that has not seen the pods just created would
	// create them twice. The others (claimed: counted, and deleted once finished) from the cache:
	// an uncached list of a pool with 1,000 sessions cost the API server seconds on every wake.
	var pods, others corev1.PodList
	if err := r.APIReader.List(ctx, &pods, client.InNamespace(sb.Namespace),
		client.MatchingLabels{LabelSandbox: sb.Name, LabelManagedBy: ManagedBy, LabelState: StateIdle}); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.Client.List(ctx, &others, client.InNamespace(sb.Namespace),
		client.MatchingLabels{LabelSandbox: sb.Name, LabelManagedBy: ManagedBy}); err != nil {
		return ctrl.Result{}, err
	}
	for _, p := range others.Items {
		if p.Labels[LabelState] != StateIdle {
			pods.Items = append(pods.Items, p)
		}
	}
	// A finished pod (failed, lifetime reached, agent exited) serves nobody.
	live := pods.Items[:0]
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp != nil {
			continue
		}
		if podFinished(p) {
			r.delete(ctx, p, "finished")
			continue
		}
		live = append(live, *p)
	}

	st := v1alpha1.SandboxStatus{ObservedGeneration: sb.Generation, Conditions: slices.Clone(sb.Status.Conditions)}
	d, reason, err := r.accept(ctx, &sb)
	if err != nil {
		// No pod of a refused declaration stays in its pool; claimed sessions run to their end.
		for i := range live {
			if live[i].Labels[LabelState] == StateIdle {
				r.delete(ctx, &live[i], "declaration refused")
			} else {
				st.Claimed++
			}
		}
		setCond(&st, sb.Generation, v1alpha1.ConditionAccepted, false, reason, err.Error())
		setCond(&st, sb.Generation, v1alpha1.ConditionReady, false, reason, "declaration not accepted")
		r.Log.Info("sandbox refused", "sandbox", req.String(), "reason", reason, "err", err)
		if uerr := r.updateStatus(ctx, &sb, st); uerr != nil {
			return ctrl.Result{}, uerr
		}
		if reason == v1alpha1.ReasonKeysUnavailable || reason == v1alpha1.ReasonRuntimeClassAbsent {
			return ctrl.Result{RequeueAfter: 10 * time.Second}, nil // fixed outside the Sandbox
		}
		return ctrl.Result{}, nil
	}
	ring, err := r.Keys.Ring(ctx, sb.Namespace, sb.Name)
	if err != nil {
		return ctrl.Result{}, err // accept checked the Secret; a transient read error retries
	}
	if err := r.ensurePolicy(ctx, &sb, d); err != nil {
		return ctrl.Result{}, err
	}
	tmpl := templateHash(d, ring, r.Pods)

	var fresh []*corev1.Pod
	for i := range live {
		p := &live[i]
		switch {
		case p.Labels[LabelState] != StateIdle:
			st.Claimed++
		case p.Labels[LabelTemplate] != tmpl:
			r.delete(ctx, p, "built from an older declaration")
		default:
			fresh = append(fresh, p)
		}
	}
	// Extra idle pods go, not-ready ones first.
	sort.SliceStable(fresh, func(i, j int) bool { return !podReady(fresh[i]) && podReady(fresh[j]) })
	want := int(sb.Spec.PoolSize)
	for len(fresh) > want {
		r.delete(ctx, fresh[0], "pool shrank")
		fresh = fresh[1:]
	}
	for _, p := range fresh {
		if podReady(p) {
			st.Idle++
		} else {
			st.Starting++
		}
	}
	made, createErr := r.createPods(ctx, &sb, d, ring, tmpl, want-len(fresh))
	st.Starting += made

	setCond(&st, sb.Generation, v1alpha1.ConditionAccepted, true, v1alpha1.ReasonAccepted, "declaration accepted")
	switch {
	case want == 0:
		setCond(&st, sb.Generation, v1alpha1.ConditionReady, false, v1alpha1.ReasonPoolEmpty, "poolSize is 0")
	case st.Idle > 0:
		setCond(&st, sb.Generation, v1alpha1.ConditionReady, true, v1alpha1.ReasonPoolReady, fmt.Sprintf("%d of %d idle pods ready", st.Idle, want))
	default:
		setCond(&st, sb.Generation, v1alpha1.ConditionReady, false, v1alpha1.ReasonPoolFilling, fmt.Sprintf("0 of %d idle pods ready", want))
	}
	if err := r.updateStatus(ctx, &sb, st); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, createErr
}

// createPods makes n pool pods of sb, CreateParallel at a time; it returns how many it made and
// the first error (after which it starts no more).
func (r *PoolReconciler) createPods(ctx context.Context, sb *v1alpha1.Sandbox, d spec.Sandbox, ring, tmpl string, n int) (int32, error) {
	if n <= 0 {
		return 0, nil
	}
	par := r.CreateParallel
	if par <= 0 {
		par = 16
	}
	uids, err := r.UIDs.AllocateN(ctx, n)
	if err != nil {
		return 0, fmt.Errorf("create pool pods for %s/%s: %w", sb.Namespace, sb.Name, err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		made  int32
		first error
	)
	sem := make(chan struct{}, par)
	for i, uid := range uids {
		mu.Lock()
		stop := first != nil
		mu.Unlock()
		if stop {
			for _, u := range uids[i:] {
				r.UIDs.Release(u)
			}
			break
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			err := r.createPod(ctx, sb, d, ring, tmpl, uid)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if first == nil {
					first = fmt.Errorf("create pool pod for %s/%s: %w", sb.Namespace, sb.Name, err)
				}
				return
			}
			made++
		})
	}
	wg.Wait()
	return made, first
}

func (r *PoolReconciler) createPod(ctx context.Context, sb *v1alpha1.Sandbox, d spec.Sandbox, ring, tmpl string, uid uint32) error {
	pod, err := BuildPod(sb, d, r.Pods, ring, newSessionID(), tmpl, uid)
	if err == nil {
		err = r.Client.Create(ctx, pod)
	}
	if err != nil {
		r.UIDs.Release(uid)
	}
	return err
}

// accept runs Accept and the checks that need the cluster: the RuntimeClass and the master key.
func (r *PoolReconciler) accept(ctx context.Context, sb *v1alpha1.Sandbox) (spec.Sandbox, string, error) {
	d, err := Accept(sb)
	if err != nil {
		var re *RefusalError
		if errors.As(err, &re) {
			return d, re.Reason, err
		}
		return d, v1alpha1.ReasonInvalidDeclaration, err
	}
	if d.Runtime == spec.RuntimeGVisor {
		var rc nodev1.RuntimeClass
		if err := r.Client.Get(ctx, types.NamespacedName{Name: r.Pods.GVisorClassName}, &rc); err != nil {
			return d, v1alpha1.ReasonRuntimeClassAbsent,
				fmt.Errorf("spec.runtime gvisor needs RuntimeClass %q in the cluster: %v", r.Pods.GVisorClassName, err)
		}
	}
	if _, err := r.Keys.Private(ctx, sb.Namespace, sb.Name); err != nil {
		return d, v1alpha1.ReasonKeysUnavailable, err
	}
	return d, "", nil
}

func (r *PoolReconciler) ensurePolicy(ctx context.Context, sb *v1alpha1.Sandbox, d spec.Sandbox) error {
	want := BuildNetworkPolicy(sb, d, r.Pods)
	var have networkingv1.NetworkPolicy
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(want), &have)
	switch {
	case apierrors.IsNotFound(err):
		return r.Client.Create(ctx, want)
	case err != nil:
		return err
	case equality.Semantic.DeepEqual(have.Spec, want.Spec):
		return nil
	}
	have.Spec = want.Spec
	return r.Client.Update(ctx, &have)
}

func (r *PoolReconciler) delete(ctx context.Context, p *corev1.Pod, why string) {
	// Preconditioned on the version we looked at, so a pod the broker claimed a moment ago is
	// never deleted as idle.
	err := r.Client.Delete(ctx, p, client.Preconditions{UID: &p.UID, ResourceVersion: &p.ResourceVersion})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		r.Log.Warn("delete pool pod", "pod", p.Namespace+"/"+p.Name, "why", why, "err", err)
	}
}

func (r *PoolReconciler) updateStatus(ctx context.Context, sb *v1alpha1.Sandbox, st v1alpha1.SandboxStatus) error {
	if equality.Semantic.DeepEqual(sb.Status, st) {
		return nil
	}
	sb.Status = st
	err := r.Client.Status().Update(ctx, sb)
	if apierrors.IsConflict(err) {
		return nil // a newer version is queued already
	}
	return err
}

func setCond(st *v1alpha1.SandboxStatus, gen int64, typ string, ok bool, reason, msg string) {
	s := metav1.ConditionFalse
	if ok {
		s = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: typ, Status: s, Reason: reason, Message: msg, ObservedGeneration: gen})
}

// podFinished: the pod's containers have ended (idle timeout, lifetime deadline, agent exit).
func podFinished(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded
}

func podReady(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func newSessionID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
