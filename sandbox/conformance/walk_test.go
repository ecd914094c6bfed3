package conformance

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// fakeBackend publishes set; its Create refuses by it when checks is set, else accepts all.
type fakeBackend struct {
	set    capability.Set
	checks bool
}

func (f *fakeBackend) Platform() capability.Platform               { return f.set.Platform }
func (f *fakeBackend) Capabilities(context.Context) capability.Set { return f.set }
func (f *fakeBackend) Create(_ context.Context, d spec.Sandbox) (*sandbox.Session, error) {
	if f.checks {
		if err := plan.CheckSandbox(d, f.set); err != nil {
			return nil, err
		}
	}
	return &sandbox.Session{ID: "s-1", SandboxID: d.ID}, nil
}
func (f *fakeBackend) Get(context.Context, string) (*sandbox.Session, error) {
	return nil, sandbox.ErrNotFound
}
func (f *fakeBackend) List(context.Context) ([]*sandbox.Session, error) { return nil, nil }
func (f *fakeBackend) Connect(context.Context, string) (sandbox.Agent, error) {
	return nil, sandbox.ErrNotFound
}
func (f *fakeBackend) Terminate(context.Context, string) error { return nil }

// recorder collects what walk reports instead of failing the test.
type recorder struct {
	*testing.T
	errs []string
}

func (r *recorder) Errorf(format string, a ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, a...))
}

// TestWalk: the walk passes a backend whose yeses ran and whose noes its Create refuses, and
// reports each way a backend can break the contract.
func TestWalk(t *testing.T) {
	set := func(no map[capability.Name]string) capability.Set {
		s := capability.Set{Platform: "fake", Entries: map[capability.Name]capability.Status{}}
		for _, n := range capability.Names {
			s.Entries[n] = capability.Status{Supported: true}
		}
		for n, why := range no {
			s.Entries[n] = capability.Status{Reason: why}
		}
		return s
	}
	allRan := func() (map[capability.Name][]string, *ran) {
		by := map[capability.Name][]string{}
		r := &ran{}
		for _, n := range capability.Names {
			by[n] = []string{"Sub" + string(n)}
			r.note("Sub"+string(n), true)
		}
		return by, r
	}
	opts := Options{OpTimeout: time.Minute, Decl: func(id string) spec.Sandbox {
		return spec.Sandbox{ID: id, Image: spec.Image{Ref: "img:1"}}
	}}
	for _, tc := range []struct {
		name   string
		b      *fakeBackend
		failed capability.Name // the subtest of this one did not pass
		want   []string        // substrings of the problems, in order; none: clean
	}{
		{"clean", &fakeBackend{set: set(map[capability.Name]string{capability.Preview: "no proxy", capability.GVisor: "no runsc", capability.Stats: "no counters"}), checks: true}, "", nil},
		{"create ignores its set", &fakeBackend{set: set(map[capability.Name]string{capability.Preview: "no proxy"})}, "", []string{"preview: no, but Create of a declaration needing it succeeded"}},
		{"a yes whose subtest failed", &fakeBackend{set: set(nil), checks: true}, capability.EnforcedLimits, []string{"enforcedLimits: yes, but no subtest"}},
		{"a no without a reason", &fakeBackend{set: set(map[capability.Name]string{capability.Labels: ""}), checks: true}, "", []string{"labels: no, without a reason"}},
		{"a refusal naming another capability", &fakeBackend{set: set(map[capability.Name]string{capability.Env: "no env"}), checks: false}, "", []string{"env: no, but Create"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			by, r := allRan()
			if tc.failed != "" {
				r.note("Sub"+string(tc.failed), false)
			}
			rec := &recorder{T: t}
			walk(rec, tc.b, opts, by, r)
			if len(rec.errs) != len(tc.want) {
				t.Fatalf("problems %q, want %d like %q", rec.errs, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if !strings.Contains(rec.errs[i], w) {
					t.Errorf("problem %q, want %q", rec.errs[i], w)
				}
			}
		})
	}
}
