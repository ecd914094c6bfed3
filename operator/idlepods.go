package operator

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
)

// IdlePods is the broker's in-process queue of claimable pods, fed by the informer's events: each
// idle ready pod the informer shows is handed out once per broker replica, so concurrent claims
// in one replica never race for the same pod (a shuffled list read from a lagging cache made
// them: conflicts, and retries that walk the list). Replicas take disjoint shards (a hash of the
// pod name modulo Shards equals Shard) first, and the other shards' pods only when their own is
// empty; the resourceVersion precondition of the claim's update stays the arbiter, so a pod
// handed out by two replicas (a shard misconfigured, a replica stealing from an empty shard)
// still goes to one claim.
type IdlePods struct {
	// Shard and Shards pick this replica's pods; Shards 0 or 1 takes them all.
	Shard, Shards uint32

	mu  sync.Mutex
	per map[types.NamespacedName]*idleSet // by namespace and Sandbox name
}

// idleSet holds one Sandbox's claimable pods in two FIFOs, the oldest ready first: this
// replica's shard, then the others'.
type idleSet struct {
	mine, theirs []string
	pods         map[string]*corev1.Pod // the informer's object: never modified
}

// Watch feeds q from inf, the informer of managed pods.
func (q *IdlePods) Watch(ctx context.Context, c cache.Cache) error {
	inf, err := c.GetInformer(ctx, &corev1.Pod{})
	if err != nil {
		return err
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { q.Observe(obj) },
		UpdateFunc: func(_, obj any) { q.Observe(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				q.remove(p)
			}
		},
	})
	return err
}

// Observe records the pod's latest state: claimable pods join their Sandbox's queue, others
// leave it.
func (q *IdlePods) Observe(obj any) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	if !claimable(p) {
		q.remove(p)
		return
	}
	key := idleKey(p.Namespace, p.Labels[LabelSandbox])
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.per == nil {
		q.per = map[types.NamespacedName]*idleSet{}
	}
	s := q.per[key]
	if s == nil {
		s = &idleSet{pods: map[string]*corev1.Pod{}}
		q.per[key] = s
	}
	if _, queued := s.pods[p.Name]; !queued {
		if q.mine(p.Name) {
			s.mine = append(s.mine, p.Name)
		} else {
			s.theirs = append(s.theirs, p.Name)
		}
	}
	s.pods[p.Name] = p
}

func (q *IdlePods) remove(p *corev1.Pod) {
	key := idleKey(p.Namespace, p.Labels[LabelSandbox])
	q.mu.Lock()
	defer q.mu.Unlock()
	if s := q.per[key]; s != nil {
		delete(s.pods, p.Name) // its name leaves the FIFO when Pop reaches it, or here:
		if len(s.mine)+len(s.theirs) > 2*len(s.pods)+64 {
			seen := make(map[string]bool, len(s.pods))
			s.mine, s.theirs = s.compact(s.mine, seen), s.compact(s.theirs, seen)
		}
	}
}

// compact keeps the names of fifo still queued, once each.
func (s *idleSet) compact(fifo []string, seen map[string]bool) []string {
	kept := make([]string, 0, len(fifo))
	for _, n := range fifo {
		if _, ok := s.pods[n]; ok && !seen[n] {
			kept = append(kept, n)
			seen[n] = true
		}
	}
	return kept
}

// Pop hands out a claimable pod of Sandbox namespace/name, this replica's shard first (the
// informer's object: DeepCopy before changing it), or nil when none is queued. A handed-out pod
// comes back only through a later event that still shows it claimable (a claim that lost its
// update leaves it to the next event).
func (q *IdlePods) Pop(namespace, name string) *corev1.Pod {
	q.mu.Lock()
	defer q.mu.Unlock()
	s := q.per[idleKey(namespace, name)]
	if s == nil {
		return nil
	}
	for _, fifo := range []*[]string{&s.mine, &s.theirs} {
		for len(*fifo) > 0 {
			n := (*fifo)[0]
			*fifo = (*fifo)[1:]
			if p, ok := s.pods[n]; ok {
				delete(s.pods, n)
				return p
			}
		}
		*fifo = nil // let the backing array go
	}
	return nil
}

// Len is how many pods of Sandbox namespace/name are queued.
func (q *IdlePods) Len(namespace, name string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if s := q.per[idleKey(namespace, name)]; s != nil {
		return len(s.pods)
	}
	return 0
}

func idleKey(namespace, sandbox string) types.NamespacedName {
	return types.NamespacedName{Namespace: namespace, Name: sandbox}
}

func (q *IdlePods) mine(pod string) bool {
	if q.Shards <= 1 {
		return true
	}
	h := fnv.New32a()
	h.Write([]byte(pod))
	return h.Sum32()%q.Shards == q.Shard
}

// claimable: an idle, ready pool pod of this operator, not being deleted.
func claimable(p *corev1.Pod) bool {
	return p.DeletionTimestamp == nil && p.Labels[LabelManagedBy] == ManagedBy && p.Labels[LabelState] == StateIdle &&
		p.Labels[LabelSandbox] != "" && p.Annotations != nil && p.Status.StartTime != nil && podReady(p)
}

// ShardOrdinal is the i of ParseShard's "ordinal/n": the ordinal at the end of the pod's name.
const ShardOrdinal = "ordinal"

// ParseShard parses "i/n" (0 <= i < n): a broker replica's shard of the idle pods. In
// "ordinal/n", i is the ordinal ending podName, a StatefulSet pod's name (<set>-<ordinal>), so
// replicas of one StatefulSet take disjoint shards with one flag; an ordinal past n (the set
// scaled beyond the n it was given) takes shard ordinal mod n: two replicas then share a shard,
// which costs conflicts, never a double claim.
func ParseShard(s, podName string) (shard, shards uint32, err error) {
	a, b, ok := strings.Cut(s, "/")
	n, errN := strconv.ParseUint(b, 10, 32)
	if ok && a == ShardOrdinal && errN == nil && n > 0 {
		_, ord, found := cutLast(podName, "-")
		i, err := strconv.ParseUint(ord, 10, 32)
		if !found || err != nil {
			return 0, 0, fmt.Errorf("%q: pod name %q does not end in -<ordinal> (a StatefulSet pod's; $POD_NAME unset?)", s, podName)
		}
		return uint32(i % n), uint32(n), nil
	}
	i, errI := strconv.ParseUint(a, 10, 32)
	if !ok || errI != nil || errN != nil || n == 0 || i >= n {
		return 0, 0, fmt.Errorf("%q: want i/n with 0 <= i < n, e.g. 0/2 and 1/2 for two replicas, or %s/n in a StatefulSet of n", s, ShardOrdinal)
	}
	return uint32(i), uint32(n), nil
}

func cutLast(s, sep string) (before, after string, found bool) {
	if i := strings.LastIndex(s, sep); i >= 0 {
		return s[:i], s[i+len(sep):], true
	}
	return s, "", false
}
