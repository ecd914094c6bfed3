package platform

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/spec"
)

// needs lists the capabilities (or rules) err's refusals name, sorted.
func needs(err error) []string {
	var out []string
	var walk func(error)
	walk = func(e error) {
		var r *plan.Refusal
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				walk(x)
			}
			return
		}
		if errors.As(e, &r) {
			out = append(out, r.Needs())
		}
	}
	if err != nil {
		walk(err)
	}
	slices.Sort(out)
	return out
}

// TestPlanAgreesWithCreate: for every example stack on every platform, `airlock plan`'s
// refusals of each sandbox are the ones that platform's Create gives it (plan.CheckSandbox on
// the same set). On the local runtime, opened here, Create itself is called for every sandbox
// plan refuses and must refuse it naming the same capabilities, before making anything.
func TestPlanAgreesWithCreate(t *testing.T) {
	files, err := filepath.Glob("../examples/*.yaml")
	if err != nil || len(files) < 6 {
		t.Fatalf("examples: %v %v", files, err)
	}
	var local Backend
	if os.Geteuid() == 0 {
		bin, cleanup, err := testutil.Agent()
		if err != nil {
			t.Fatal(err)
		}
		defer cleanup()
		t.Setenv("AIRLOCK_AGENT", bin)
		dir, err := os.MkdirTemp("", "agree")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
		b, _, err := Open(t.Context(), Config{Platform: string(capability.Local), Local: LocalConfig{StateDir: dir}})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		local = b
	} else {
		testutil.RequireRoot(t)
	}
	creates := 0
	for _, f := range files {
		st, err := spec.LoadStack(f)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, p := range capability.Platforms {
			var set capability.Set
			if p == capability.Local {
				set = local.Capabilities(t.Context())
			} else if set, _, err = Capabilities(t.Context(), Config{Platform: string(p)}); err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			res := plan.Check(st, p, set)
			for i, sb := range st.Sandboxes {
				var fromPlan []string
				for _, r := range res.Refusals {
					if r.SandboxIndex() == i && (r.Capability != "" || strings.HasPrefix(r.Rule, "bound.")) {
						fromPlan = append(fromPlan, r.Needs())
					}
				}
				slices.Sort(fromPlan)
				fromCreate := needs(plan.CheckSandbox(sb, set))
				// Rules of a platform other than capabilities (gcp.requiresHost, kubernetes.*)
				// are plan's: a backend's Create of one sandbox has no stack to check them in.
				fromCreate = slices.DeleteFunc(fromCreate, func(n string) bool {
					return !slices.Contains(capability.Names, capability.Name(n)) && !strings.HasPrefix(n, "bound.")
				})
				if !slices.Equal(fromPlan, fromCreate) {
					t.Errorf("%s on %s, sandbox %s: plan refuses %v, Create's check %v", filepath.Base(f), p, sb.ID, fromPlan, fromCreate)
				}
				if p != capability.Local || len(fromPlan) == 0 {
					continue
				}
				d := sb
				d.ApplyDefaults()
				_, err := local.Create(t.Context(), d)
				got := needs(err)
				if err == nil || !slices.Equal(got, fromPlan) {
					t.Errorf("%s, sandbox %s: local Create = %v (refusals %v), want refused naming %v", filepath.Base(f), sb.ID, err, got, fromPlan)
				}
				creates++
			}
		}
	}
	t.Logf("%d sandboxes refused by plan and by the local runtime's Create alike", creates)
}
