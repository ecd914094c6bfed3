//go:build cluster

package kubernetes_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	kb "github.com/airlock-sandbox/airlock/backend/kubernetes"
	"github.com/airlock-sandbox/airlock/operator/brokerapi"
	corev1 "k8s.io/api/core/v1"
)

// brokerURLs are the addresses of every running, ready broker pod (the chart runs 2 replicas).
func brokerURLs(t *testing.T, want int) []string {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var list corev1.PodList
		out := kubectl(t, "", "-n", "airlock-system", "get", "pod", "-l", "app.kubernetes.io/name=airlock-operator", "-o", "json")
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatalf("broker pods: %v", err)
		}
		var urls []string
		for _, p := range list.Items {
			ready := slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
				return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
			})
			if p.Status.Phase == corev1.PodRunning && ready && p.DeletionTimestamp == nil && p.Status.PodIP != "" {
				urls = append(urls, "https://"+p.Status.PodIP+":8080")
			}
		}
		if len(urls) >= want {
			return urls
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d ready broker pods after 2m, want %d", len(urls), want)
		}
		time.Sleep(time.Second)
	}
}

// TestClaimsAcrossBrokerReplicas: claims sent concurrently to both broker replicas of the chart's
// deployment never hand one pod out twice, and as many succeed as there were idle pods.
func TestClaimsAcrossBrokerReplicas(t *testing.T) {
	e := newEnv(t)
	const pool, n = 4, 12
	e.sandboxCR(baseDecl("replicas"), pool, pool)
	urls := brokerURLs(t, 2)
	tok := e.token("app", brokerapi.DefaultAudience)
	var backends []*kb.Backend
	for _, u := range urls {
		b, err := kb.New(kb.Config{BrokerURL: u, Namespace: e.ns, CAFile: brokerCA, ServerName: brokerName,
			Token: func(context.Context) (string, error) { return tok, nil }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		backends = append(backends, b)
	}
	grants := make([]*brokerapi.Grant, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			grants[i], errs[i] = backends[i%len(backends)].Claim(ctxT(t), "replicas", nil)
		}()
	}
	wg.Wait()
	pods := map[string]bool{}
	for i := range n {
		if errs[i] != nil {
			var be *kb.Error
			if !errors.As(errs[i], &be) || be.Status != http.StatusServiceUnavailable {
				t.Errorf("claim %d: %v, want a grant or 503", i, errs[i])
			}
			continue
		}
		if pods[grants[i].Pod] {
			t.Errorf("pod %s granted twice", grants[i].Pod)
		}
		pods[grants[i].Pod] = true
	}
	// The pool refills while the claims run, so more than pool may succeed; every idle pod at
	// the start is claimable by some claimer (each falls back to the API before answering 503).
	if len(pods) < pool {
		t.Errorf("%d pods granted, %d were idle", len(pods), pool)
	}
	out := kubectl(t, "", "-n", e.ns, "get", "pods", "-l", "airlock.dev/sandbox=replicas,airlock.dev/state=claimed", "-o", "name")
	if got := len(strings.Fields(out)); got != len(pods) {
		t.Errorf("%d claimed pods in the cluster, %d grants", got, len(pods))
	}
}

// TestOneLeaderRunsThePool: with two replicas, one holds the Lease, and the pool controller does
// not create pods twice (a pool of 2 has 2 pods, not 4).
func TestOneLeaderRunsThePool(t *testing.T) {
	e := newEnv(t)
	holder := kubectl(t, "", "-n", "airlock-system", "get", "lease", "airlock-operator", "-o", "jsonpath={.spec.holderIdentity}")
	if holder == "" {
		t.Fatal("no leader holds the Lease airlock-operator")
	}
	e.sandboxCR(baseDecl("leader"), 2, 2)
	out := kubectl(t, "", "-n", e.ns, "get", "pods", "-l", "airlock.dev/sandbox=leader", "-o", "name")
	if got := len(strings.Fields(out)); got != 2 {
		t.Errorf("%d pool pods for poolSize 2", got)
	}
}

// TestCRDRefusesAtAdmission: the generated CRD's schema is enforced by the real API server.
func TestCRDRefusesAtAdmission(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct{ name, spec, want string }{
		{"string image", `{"poolSize":1,"image":"python:3.12"}`, "spec.image"},
		{"pool too big", `{"poolSize":5000,"image":{"ref":"x"}}`, "spec.poolSize"},
		{"two image sources", `{"poolSize":1,"image":{"ref":"x","dir":"/y"}}`, "exactly one source"},
		{"id differs", `{"poolSize":1,"id":"other","image":{"ref":"x"}}`, "spec.id must equal metadata.name"},
		{"unknown field", `{"poolSize":1,"image":{"ref":"x"},"imagee":"y"}`, "imagee"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obj := `{"apiVersion":"airlock.dev/v1alpha1","kind":"Sandbox","metadata":{"name":"bad","namespace":"` + e.ns + `"},"spec":` + tc.spec + `}`
			cmd := exec.Command(kubectlBin, "--kubeconfig", kubeconfig, "create", "--validate=strict", "-f", "-")
			cmd.Stdin = strings.NewReader(obj)
			out, err := cmd.CombinedOutput()
			if err == nil {
				kubectl(t, "", "-n", e.ns, "delete", "sandbox", "bad")
				t.Fatalf("admitted: %s", tc.spec)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Errorf("refusal does not name %q: %s", tc.want, out)
			}
		})
	}
	// The defaults the server fills in are the declaration's.
	kubectl(t, `{"apiVersion":"airlock.dev/v1alpha1","kind":"Sandbox","metadata":{"name":"defaults","namespace":"`+e.ns+`"},"spec":{"poolSize":0,"image":{"ref":"x"}}}`, "create", "-f", "-")
	got := kubectl(t, "", "-n", e.ns, "get", "sandbox", "defaults", "-o", "jsonpath={.spec.limits.cpu} {.spec.limits.memory} {.spec.egress.mode} {.spec.workdir} {.spec.runtime}")
	if got != "1 512Mi deny /workspace native" {
		t.Errorf("server defaults %q", got)
	}
}
