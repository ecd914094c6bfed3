package operator

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func idlePod(name string, mut ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name,
			Labels:      map[string]string{LabelManagedBy: ManagedBy, LabelSandbox: "box", LabelState: StateIdle},
			Annotations: map[string]string{}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1", StartTime: &metav1.Time{Time: time.Now()},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	for _, m := range mut {
		m(p)
	}
	return p
}

func popAll(q *IdlePods) []string {
	var out []string
	for p := q.Pop("ns", "box"); p != nil; p = q.Pop("ns", "box") {
		out = append(out, p.Name)
	}
	return out
}

func TestIdlePods(t *testing.T) {
	claimed := func(p *corev1.Pod) { p.Labels[LabelState] = StateClaimed }
	notReady := func(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionFalse }
	deleting := func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: time.Now()} }
	foreign := func(p *corev1.Pod) { delete(p.Labels, LabelManagedBy) }
	for _, tc := range []struct {
		name   string
		events []*corev1.Pod
		want   []string
	}{
		{"idle ready pods, oldest first", []*corev1.Pod{idlePod("a"), idlePod("b"), idlePod("c")}, []string{"a", "b", "c"}},
		{"an update of a queued pod queues it once", []*corev1.Pod{idlePod("a"), idlePod("b"), idlePod("a")}, []string{"a", "b"}},
		{"a claimed pod leaves", []*corev1.Pod{idlePod("a"), idlePod("b"), idlePod("a", claimed)}, []string{"b"}},
		{"not ready stays out until ready", []*corev1.Pod{idlePod("a", notReady), idlePod("b"), idlePod("a")}, []string{"b", "a"}},
		{"a pod being deleted leaves", []*corev1.Pod{idlePod("a"), idlePod("a", deleting)}, nil},
		{"pods not ours never come", []*corev1.Pod{idlePod("a", foreign)}, nil},
		{"out and back in: handed out once", []*corev1.Pod{idlePod("a"), idlePod("b"), idlePod("a", notReady), idlePod("a")}, []string{"a", "b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := &IdlePods{}
			for _, p := range tc.events {
				q.Observe(p)
			}
			if n := q.Len("ns", "box"); n != len(tc.want) {
				t.Errorf("Len %d, want %d", n, len(tc.want))
			}
			if got := popAll(q); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("popped %v, want %v", got, tc.want)
			}
			if p := q.Pop("ns", "box"); p != nil {
				t.Errorf("pod %s handed out twice", p.Name)
			}
			if q.Pop("ns", "other") != nil {
				t.Error("another Sandbox's queue is not empty")
			}
		})
	}
}

// A pod handed out comes back only with a later event that still shows it idle (the claim lost).
func TestIdlePodsHandOutOnce(t *testing.T) {
	q := &IdlePods{}
	q.Observe(idlePod("a"))
	if p := q.Pop("ns", "box"); p == nil || p.Name != "a" {
		t.Fatalf("Pop = %v", p)
	}
	if p := q.Pop("ns", "box"); p != nil {
		t.Fatal("handed out twice without an event")
	}
	q.Observe(idlePod("a"))
	if p := q.Pop("ns", "box"); p == nil {
		t.Fatal("an event showing the pod idle again did not queue it")
	}
}

// Shards split the pods between replicas: each hands out its own shard first, every pod is in
// exactly one shard, and a replica whose shard is empty hands out the others' pods.
func TestIdlePodsShards(t *testing.T) {
	const shards, pods = 3, 300
	qs := make([]*IdlePods, shards)
	for i := range qs {
		qs[i] = &IdlePods{Shard: uint32(i), Shards: shards}
	}
	for i := range pods {
		for _, q := range qs {
			q.Observe(idlePod(fmt.Sprintf("box-%d", i)))
		}
	}
	first := map[string]int{} // pod → how many replicas hand it out before any pod of another shard
	for i, q := range qs {
		got := popAll(q)
		if len(got) != pods {
			t.Errorf("replica %d hands out %d of %d pods", i, len(got), pods)
		}
		own := 0
		for own < len(got) && q.mine(got[own]) {
			first[got[own]]++
			own++
		}
		for _, n := range got[own:] {
			if q.mine(n) {
				t.Errorf("replica %d hands out its own %s after another shard's pod", i, n)
			}
		}
		if own < pods/shards/2 {
			t.Errorf("shard %d holds %d of %d pods", i, own, pods)
		}
	}
	for i := range pods {
		if n := first[fmt.Sprintf("box-%d", i)]; n != 1 {
			t.Errorf("box-%d is in %d shards", i, n)
		}
	}
}

// Pods leaving without being popped do not grow the queue without bound.
func TestIdlePodsChurnStaysBounded(t *testing.T) {
	q := &IdlePods{}
	for i := range 10_000 {
		p := idlePod(fmt.Sprintf("box-%d", i))
		q.Observe(p)
		q.remove(p)
	}
	s := q.per[idleKey("ns", "box")]
	if n := len(s.mine) + len(s.theirs); n > 64+1 {
		t.Fatalf("queue holds %d names for 0 pods", n)
	}
}

func TestParseShard(t *testing.T) {
	for _, tc := range []struct {
		in, pod string
		i, n    uint32
		wantErr bool
	}{
		{"0/1", "", 0, 1, false}, {"1/2", "", 1, 2, false}, {"2/2", "", 0, 0, true}, {"0/0", "", 0, 0, true},
		{"1", "", 0, 0, true}, {"a/2", "", 0, 0, true}, {"-1/2", "", 0, 0, true}, {"", "", 0, 0, true},
		// A StatefulSet's pods, <set>-<ordinal>: each its own shard.
		{"ordinal/2", "airlock-operator-0", 0, 2, false}, {"ordinal/2", "airlock-operator-1", 1, 2, false},
		{"ordinal/3", "airlock-operator-12", 0, 3, false},                                     // scaled past n: shares shard 12 mod 3
		{"ordinal/2", "", 0, 0, true}, {"ordinal/2", "airlock-operator-7f9c-x2x", 0, 0, true}, // no ordinal (a Deployment's pod)
		{"ordinal/0", "airlock-operator-0", 0, 0, true}, {"ordinal", "airlock-operator-0", 0, 0, true},
		{"1/2", "airlock-operator-0", 1, 2, false}, // an explicit i wins over the name
	} {
		i, n, err := ParseShard(tc.in, tc.pod)
		if (err != nil) != tc.wantErr || i != tc.i || n != tc.n {
			t.Errorf("ParseShard(%q, %q) = %d, %d, %v", tc.in, tc.pod, i, n, err)
		}
	}
}
