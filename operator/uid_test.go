package operator

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

func uidPod(ns, name string, uid uint32) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
		Labels: map[string]string{LabelManagedBy: ManagedBy, LabelCodeUID: fmt.Sprint(uid)}}}
}

func TestCodeUIDs(t *testing.T) {
	ctx := context.Background()
	type step struct {
		op   string // alloc, create <ns/name uid-of-last>, delete <ns/name>, release, wait <dur>
		arg  string
		want string // alloc: the uid, or "error"
	}
	tests := []struct {
		name        string
		first, last uint32
		existing    []*corev1.Pod
		steps       []step
	}{
		{"skips uids of existing pods in every namespace", 10, 14,
			[]*corev1.Pod{uidPod("a", "p", 10), uidPod("b", "q", 11), uidPod("b", "r", 13)},
			[]step{{"alloc", "", "12"}, {"alloc", "", "14"}, {"alloc", "", "error"}}},
		{"never hands out a uid twice before the cache shows its pod", 10, 12, nil,
			[]step{{"alloc", "", "10"}, {"alloc", "", "11"}, {"alloc", "", "12"}, {"alloc", "", "error"}}},
		{"reuses a uid once its pod is deleted", 10, 11, nil,
			[]step{{"alloc", "", "10"}, {"create", "ns/p10", ""}, {"alloc", "", "11"}, {"create", "ns/p11", ""},
				{"alloc", "", "error"}, {"delete", "ns/p10", ""}, {"alloc", "", "10"}}},
		{"a released uid (pod not created) comes back", 10, 11, nil,
			[]step{{"alloc", "", "10"}, {"release", "", ""}, {"alloc", "", "11"}, {"alloc", "", "10"}}},
		{"round-robin: a freed uid is reused last", 10, 12, nil,
			[]step{{"alloc", "", "10"}, {"create", "ns/p10", ""}, {"alloc", "", "11"}, {"create", "ns/p11", ""},
				{"delete", "ns/p10", ""}, {"alloc", "", "12"}, {"alloc", "", "10"}}},
		{"a uid whose pod never showed is free after the pending TTL", 10, 10, nil,
			[]step{{"alloc", "", "10"}, {"alloc", "", "error"}, {"wait", "6m", ""}, {"alloc", "", "10"}}},
		{"pods of other operators' making and unlabelled pods hold nothing", 10, 10,
			[]*corev1.Pod{{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "y", Labels: map[string]string{LabelCodeUID: "10"}}},
				{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "z", Labels: map[string]string{LabelManagedBy: ManagedBy}}}},
			[]step{{"alloc", "", "10"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs := make([]client.Object, len(tc.existing))
			for i, p := range tc.existing {
				objs[i] = p
			}
			c := fake.NewClientBuilder().WithScheme(newScheme(t)).WithObjects(objs...).Build()
			clock := time.Unix(1000, 0)
			a := &CodeUIDs{Reader: c, First: tc.first, Last: tc.last, Now: func() time.Time { return clock }}
			var last uint32
			for i, s := range tc.steps {
				switch s.op {
				case "alloc":
					uid, err := a.Allocate(ctx)
					got := fmt.Sprint(uid)
					if err != nil {
						got = "error"
						if !strings.Contains(err.Error(), "code-uid-range") {
							t.Errorf("step %d: exhausted range error %q does not say what to change", i, err)
						}
					} else {
						last = uid
					}
					if got != s.want {
						t.Fatalf("step %d: Allocate = %s (%v), want %s", i, got, err, s.want)
					}
				case "create":
					ns, name, _ := strings.Cut(s.arg, "/")
					if err := c.Create(ctx, uidPod(ns, name, last)); err != nil {
						t.Fatal(err)
					}
				case "delete":
					ns, name, _ := strings.Cut(s.arg, "/")
					if err := c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}); err != nil {
						t.Fatal(err)
					}
				case "release":
					a.Release(last)
				case "wait":
					d, _ := time.ParseDuration(s.arg)
					clock = clock.Add(d)
				}
			}
		})
	}
}

// TestCodeUIDsConcurrent: many reconciles at once (the cache showing none of their pods) never
// get the same uid.
func TestCodeUIDsConcurrent(t *testing.T) {
	c := fake.NewClientBuilder().WithScheme(newScheme(t)).Build()
	a := &CodeUIDs{Reader: c, First: DefaultCodeUIDFirst, Last: DefaultCodeUIDLast}
	const n = 200
	got := make(chan uint32, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			uid, err := a.Allocate(context.Background())
			if err != nil {
				t.Error(err)
			}
			got <- uid
		}()
	}
	wg.Wait()
	close(got)
	seen := map[uint32]bool{}
	for uid := range got {
		if seen[uid] || uid < DefaultCodeUIDFirst || uid > DefaultCodeUIDLast {
			t.Fatalf("uid %d handed out twice or outside the range", uid)
		}
		seen[uid] = true
	}
}

func TestParseUIDRange(t *testing.T) {
	for _, tc := range []struct {
		in          string
		first, last uint32
		ok          bool
	}{
		{"1000000-1099999", 1000000, 1099999, true},
		{"5-5", 5, 5, true},
		{"0-10", 0, 0, false}, // root
		{"10-5", 0, 0, false},
		{"10", 0, 0, false},
		{"10-20x", 0, 0, false},
		{"1-4294967295", 0, 0, false},
		{"60000-70000", 0, 0, false}, // holds EgressProxyUID (and InstallUID): code would pass the pod's redirect
		{"65531-65531", 65531, 65531, true},
	} {
		f, l, err := ParseUIDRange(tc.in)
		if (err == nil) != tc.ok || f != tc.first || l != tc.last {
			t.Errorf("ParseUIDRange(%q) = %d, %d, %v", tc.in, f, l, err)
		}
	}
}

// TestCodeUIDsAllocateN: a batch is distinct, skips uids held, and a range too small for the
// batch is refused whole (nothing held).
func TestCodeUIDsAllocateN(t *testing.T) {
	c := fake.NewClientBuilder().WithScheme(newScheme(t)).Build()
	a := &CodeUIDs{Reader: c, First: 100, Last: 109}
	held, err := a.AllocateN(context.Background(), 3)
	if err != nil || fmt.Sprint(held) != "[100 101 102]" {
		t.Fatalf("AllocateN(3) = %v, %v", held, err)
	}
	if got, err := a.AllocateN(context.Background(), 8); err == nil {
		t.Fatalf("AllocateN(8) with 7 free = %v, want an error", got)
	}
	got, err := a.AllocateN(context.Background(), 7)
	if err != nil || fmt.Sprint(got) != "[103 104 105 106 107 108 109]" {
		t.Fatalf("AllocateN(7) = %v, %v", got, err)
	}
}
