package platform

import (
	"errors"
	"reflect"
	"slices"
	"testing"

	"github.com/airlock-sandbox/airlock/backend/docker"
	"github.com/airlock-sandbox/airlock/backend/kubernetes"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/spec"
)

// The docker and kubernetes sets exist once, in their backends: Published reads them there,
// and capability.For keeps no copy.
func TestBackendSetsAreTheirOwn(t *testing.T) {
	for p, want := range map[capability.Platform]capability.Set{capability.Docker: docker.Published(), capability.Kubernetes: kubernetes.Published()} {
		got, err := Published(p)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("Published(%s) = %+v, %v; want the backend's %+v", p, got, err, want)
		}
		if _, err := capability.For(p); !errors.Is(err, capability.ErrBackendSet) {
			t.Errorf("capability.For(%s) = %v: a copy of the backend's set", p, err)
		}
	}
}

// The published sets plan the examples' shapes: every platform accepts an undeclared sandbox of
// an image kind it runs, and egress open, and refuses allow and allowDomains where it cannot
// hold them.
func TestEveryPublishedSetPlansAnUndeclaredSandbox(t *testing.T) {
	image := map[capability.Platform]spec.Image{
		capability.Local: {Host: true}, capability.Docker: {Ref: "python:3.12"}, capability.Kubernetes: {Ref: "python:3.12"},
		capability.AWS: {Ref: "python:3.12"}, capability.Azure: {Ref: "ubuntu"}, capability.GCP: {Host: true},
	}
	summary := func(res plan.Result) []string {
		out := []string{}
		for _, r := range res.Refusals {
			out = append(out, r.Field+" "+r.Needs())
		}
		return out
	}
	stackOf := func(sb spec.Sandbox) *spec.Stack {
		st := &spec.Stack{APIVersion: spec.APIVersion, Sandboxes: []spec.Sandbox{sb}}
		if sb.Image.Host && sb.ID == "gcp" {
			st.Sandboxes[0].HostedBy = "app"
			st.Workloads = []spec.Workload{{ID: "app"}}
		}
		return st
	}
	for _, p := range capability.Platforms {
		if p == capability.Local {
			continue // probed from this host; cmd/airlock-full's goldens plan local against a fixed host
		}
		set, err := Published(p)
		if err != nil {
			t.Fatal(err)
		}
		id := "a"
		if p == capability.GCP {
			id = "gcp" // hosted by a workload
		}
		for _, mode := range []spec.EgressMode{"", spec.EgressOpen} {
			if got := summary(plan.Check(stackOf(spec.Sandbox{ID: id, Image: image[p], Egress: spec.Egress{Mode: mode}}), p, set)); len(got) != 0 {
				t.Errorf("%s, egress %q: refused %q", p, mode, got)
			}
		}
		for mode, n := range map[spec.EgressMode]capability.Name{spec.EgressAllow: capability.PublicOnlyEgress, spec.EgressAllowDomains: capability.DomainEgressRules} {
			sb := spec.Sandbox{ID: id, Image: image[p], Egress: spec.Egress{Mode: mode}}
			if mode == spec.EgressAllowDomains {
				sb.Egress.Domains = []string{"pypi.org"}
			}
			refused := slices.Contains(summary(plan.Check(stackOf(sb), p, set)), "sandboxes[0].egress.mode "+string(n))
			if refused == set.Has(n) {
				t.Errorf("%s: egress %s refused %v, %s %v", p, mode, refused, n, set.Has(n))
			}
		}
	}
}
