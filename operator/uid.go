package operator

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// CodeUIDs hands each sandbox pod a code uid that no other existing pod of this operator holds.
//
// Why: the process limit (limits.maxProcesses) is RLIMIT_NPROC, which the kernel counts per real
// uid over the whole node, not per pod. Two pods on one node running code as the same uid would
// share one limit: one sandbox's fork bomb would hold the other's processes. A uid unique in the
// cluster is unique on every node, and needs no knowledge of where the scheduler puts the pod.
//
// The uid is recorded on the pod (label LabelCodeUID) and in its agent config. Existing pods are
// read from Reader (the informer cache of managed pods, every namespace); uids handed out that the
// cache may not show yet are held in memory until it does (or PendingTTL passes), so two pods
// created back to back never share one. A uid becomes free once its pod object is gone: the
// kubelet removes the object after the pod's containers have stopped, so no process of the old
// pod still counts against it (a force-deleted pod is the exception; see docs/kubernetes.md).
// Handing out is round-robin from the last uid, so a freed uid is reused as late as possible.
type CodeUIDs struct {
	Reader      client.Reader
	First, Last uint32        // the range, inclusive
	PendingTTL  time.Duration // how long a handed-out uid waits for the cache (default 5 min)
	Now         func() time.Time

	mu      sync.Mutex
	next    uint32
	pending map[uint32]time.Time
}

// DefaultCodeUIDFirst and DefaultCodeUIDLast bound the default range: uids no image or node
// account normally uses (flag -code-uid-range).
const (
	DefaultCodeUIDFirst = 1_000_000
	DefaultCodeUIDLast  = 1_099_999
)

// Allocate returns a uid no existing pod holds; call Release if the pod is not created.
func (a *CodeUIDs) Allocate(ctx context.Context) (uint32, error) {
	uids, err := a.AllocateN(ctx, 1)
	if err != nil {
		return 0, err
	}
	return uids[0], nil
}

// AllocateN returns n distinct uids no existing pod holds, from one read of the pods (a fill of
// 1,000 read them 1,000 times); call Release for each whose pod is not created.
func (a *CodeUIDs) AllocateN(ctx context.Context, n int) ([]uint32, error) {
	if a.First == 0 || a.Last < a.First {
		return nil, fmt.Errorf("code uid range %d-%d is empty or includes root", a.First, a.Last)
	}
	var pods corev1.PodList
	// Only labels are read: no copy of every pod (each pool pod created listed them all).
	if err := a.Reader.List(ctx, &pods, client.MatchingLabels{LabelManagedBy: ManagedBy}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list pods for code uids: %w", err)
	}
	used := make(map[uint32]bool, len(pods.Items))
	for i := range pods.Items {
		if uid, ok := codeUIDOf(&pods.Items[i]); ok {
			used[uid] = true
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	if a.Now != nil {
		now = a.Now()
	}
	ttl := a.PendingTTL
	if ttl <= 0 {
		ttl = 5 * time.Minute
	}
	for uid, at := range a.pending {
		if used[uid] || now.Sub(at) > ttl {
			delete(a.pending, uid) // the cache shows its pod now (or it never came)
		} else {
			used[uid] = true
		}
	}
	size := uint64(a.Last-a.First) + 1
	if a.next < a.First || a.next > a.Last {
		a.next = a.First
	}
	var out []uint32
	for i := uint64(0); i < size && len(out) < n; i++ {
		uid := uint32(uint64(a.First) + (uint64(a.next-a.First)+i)%size)
		if used[uid] {
			continue
		}
		out = append(out, uid)
	}
	if len(out) < n {
		return nil, fmt.Errorf("%d code uids wanted, %d of the %d in %d-%d free (the rest held by existing sandbox pods); widen -code-uid-range", n, len(out), size, a.First, a.Last)
	}
	if a.pending == nil {
		a.pending = map[uint32]time.Time{}
	}
	for _, uid := range out {
		a.pending[uid] = now
	}
	a.next = out[len(out)-1] + 1
	return out, nil
}

// Release returns a uid whose pod was not created.
func (a *CodeUIDs) Release(uid uint32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.pending, uid)
}

func codeUIDOf(p *corev1.Pod) (uint32, bool) {
	v, ok := p.Labels[LabelCodeUID]
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(v, 10, 32)
	return uint32(n), err == nil
}

// ParseUIDRange parses "first-last".
func ParseUIDRange(s string) (first, last uint32, err error) {
	var a, b uint64
	if _, err := fmt.Sscanf(s, "%d-%d", &a, &b); err != nil || fmt.Sprintf("%d-%d", a, b) != s {
		return 0, 0, fmt.Errorf("code uid range %q: want first-last, e.g. %d-%d", s, DefaultCodeUIDFirst, DefaultCodeUIDLast)
	}
	if a == 0 || b < a || b > 1<<31-2 {
		return 0, 0, fmt.Errorf("code uid range %q: want 1 <= first <= last < 2^31-1 (0 is root)", s)
	}
	for _, u := range []uint64{InstallUID, EgressProxyUID} {
		if a <= u && u <= b {
			// Code as the egress proxy's uid would pass the pod's redirect.
			return 0, 0, fmt.Errorf("code uid range %q holds %d, a uid the operator's own containers run as (%d, %d): choose a range without them", s, u, InstallUID, EgressProxyUID)
		}
	}
	return uint32(a), uint32(b), nil
}
