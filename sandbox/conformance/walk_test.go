package conformance

import (
	"context"
	"fmt"
	"slices"
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

// TestReplacedSubtestIsNotDeclared: a suite subtest an Extra replaces creates nothing, so
// Declarations (what a platform pre-declares, a cluster's Sandbox objects) leaves its sandboxes
// out; without a replacement they are in.
func TestReplacedSubtestIsNotDeclared(t *testing.T) {
	decl := func(id string) spec.Sandbox { return spec.Sandbox{ID: id, Image: spec.Image{Ref: "img"}} }
	ids := func(opts Options) []string {
		var out []string
		all := capability.Set{Platform: "fake", Entries: map[capability.Name]capability.Status{}}
		for _, n := range capability.Names {
			all.Entries[n] = capability.Status{Supported: true}
		}
		for _, d := range Declarations(opts, all) {
			out = append(out, d.ID)
		}
		return out
	}
	plain := Options{Decl: decl}
	if !slices.Contains(ids(plain), "conf-deny") {
		t.Fatalf("declarations %v lack conf-deny", ids(plain))
	}
	replaced := Options{Decl: decl, Extra: []Subtest{{Name: "EgressByTraffic", Exercises: []capability.Name{capability.EgressDeny}, Replaces: "EgressDenyOnlyLoopback"}}}
	got := ids(replaced)
	if slices.Contains(got, "conf-deny") {
		t.Errorf("declarations %v include conf-deny, whose subtest an Extra replaces", got)
	}
	if len(got) != len(ids(plain))-1 {
		t.Errorf("declarations %v, want all of %v but conf-deny", got, ids(plain))
	}
	basic := replaced
	basic.Basic = true
	if !slices.Equal(ids(basic), ids(Options{Decl: decl, Basic: true})) {
		t.Errorf("a Basic run's declarations change with Extra: %v", ids(basic))
	}
}
