//go:build cluster

package kubernetes_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/agent/client"
	kb "github.com/airlock-sandbox/airlock/backend/kubernetes"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/operator/brokerapi"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/sandbox/conformance"
	"github.com/airlock-sandbox/airlock/spec"
	corev1 "k8s.io/api/core/v1"
)

// These tests run against the test cluster (hack/testcluster/ci.sh: up, images, deploy) through
// kubectl and the deployed broker. They fail, not skip, when the cluster is absent: the tag
// "cluster" is the opt-in.

var (
	kubeconfig = envOr("AIRLOCK_K8S_KUBECONFIG", "/var/lib/airlock-k8s/admin.kubeconfig")
	kubectlBin = envOr("AIRLOCK_K8S_KUBECTL", "/var/cache/airlock-k8s/bin/kubectl")
	testImage  = envOr("AIRLOCK_K8S_SANDBOX_IMAGE", "airlock.local/sandbox:test")
	// The broker serves TLS with a certificate for its Service name from a CA deploy.sh made;
	// there is no kube-proxy, so the tests dial the broker pod's IP and verify that name.
	brokerCA   = envOr("AIRLOCK_K8S_BROKER_CA", "/var/lib/airlock-k8s/broker-tls/ca.crt")
	brokerName = "airlock-broker.airlock-system.svc"
)

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func kubectl(t testing.TB, stdin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(kubectlBin, append([]string{"--kubeconfig", kubeconfig}, args...)...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

func randSuffix() string {
	var b [4]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// env is one test namespace with a ServiceAccount allowed to claim.
type env struct {
	t      *testing.T
	ns     string
	broker string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{t: t, ns: "airlock-test-" + randSuffix()}
	kubectl(t, "", "create", "namespace", e.ns)
	t.Cleanup(func() { kubectl(t, "", "delete", "namespace", e.ns, "--wait=false") })
	kubectl(t, "", "-n", e.ns, "create", "serviceaccount", "app")
	kubectl(t, "", "-n", e.ns, "create", "rolebinding", "app-claim", "--clusterrole=airlock-sandbox-claimer", "--serviceaccount="+e.ns+":app")
	e.broker = brokerURL(t)
	return e
}

// brokerURL is the address of a broker pod that serves: running, ready and not being deleted.
// Right after deploy.sh's rollout restart the old pod still reports phase Running while it
// terminates, and its address stops answering (no route to host) moments later.
func brokerURL(t testing.TB) string {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var list corev1.PodList
		out := kubectl(t, "", "-n", "airlock-system", "get", "pod", "-l", "app.kubernetes.io/name=airlock-operator", "-o", "json")
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatalf("broker pods: %v", err)
		}
		var seen []string
		for _, p := range list.Items {
			ready := slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
				return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
			})
			if p.Status.Phase == corev1.PodRunning && ready && p.DeletionTimestamp == nil && p.Status.PodIP != "" {
				return "https://" + p.Status.PodIP + ":8080"
			}
			seen = append(seen, fmt.Sprintf("%s (phase %s, ready %v, deleting %v)", p.Name, p.Status.Phase, ready, p.DeletionTimestamp != nil))
		}
		if time.Now().After(deadline) {
			t.Fatalf("no running, ready broker pod that is not being deleted; pods: %v", seen)
		}
		time.Sleep(time.Second)
	}
}

func (e *env) token(sa, audience string) string {
	return kubectl(e.t, "", "-n", e.ns, "create", "token", sa, "--audience", audience, "--duration", "1h")
}

func (e *env) backend(sa string) *kb.Backend {
	tok := e.token(sa, brokerapi.DefaultAudience)
	b, err := kb.New(kb.Config{BrokerURL: e.broker, Namespace: e.ns, CAFile: brokerCA, ServerName: brokerName,
		Token: func(context.Context) (string, error) { return tok, nil }})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { b.Close() })
	return b
}

func baseDecl(id string) spec.Sandbox {
	return spec.Sandbox{ID: id, Image: spec.Image{Ref: testImage},
		Limits: spec.Limits{CPU: "200m", Memory: "128Mi", Disk: "64Mi"}}
}

// sandboxCR applies a Sandbox for d with the pool size and waits until pool pods are ready.
func (e *env) sandboxCR(d spec.Sandbox, pool int, waitIdle int) {
	e.t.Helper()
	body := map[string]any{}
	js, _ := json.Marshal(d)
	json.Unmarshal(js, &body)
	delete(body, "id")
	body["poolSize"] = pool
	obj := map[string]any{"apiVersion": "airlock.dev/v1alpha1", "kind": "Sandbox",
		"metadata": map[string]any{"name": d.ID, "namespace": e.ns}, "spec": body}
	js, _ = json.Marshal(obj)
	kubectl(e.t, string(js), "apply", "-f", "-")
	if waitIdle > 0 {
		e.waitIdle(d.ID, waitIdle)
	}
}

// waitIdle polls the Sandbox status until at least n pods are idle and ready.
func (e *env) waitIdle(name string, n int) {
	e.t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		got := kubectl(e.t, "", "-n", e.ns, "get", "sandbox", name, "-o", "jsonpath={.status.idle}")
		if idle, err := strconv.Atoi(got); err == nil && idle >= n {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("Sandbox %s: idle=%q after 3m, want %d\n%s", name, got,
				n, kubectl(e.t, "", "-n", e.ns, "get", "sandbox,pods", "-o", "wide"))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestConformance runs the suite: every sandbox it creates is declared first as a Sandbox
// of the same declaration (conformance.Declarations, for the capability set the binding
// publishes), each with a warm pool of one, so every claim finds its pod. Subtests of
// capabilities the set says no to create nothing and are skipped; the walk checks the noes are
// refused and the yeses were exercised.
func TestConformance(t *testing.T) {
	e := newEnv(t)
	b := e.backend("app")
	// EgressDenyOnlyLoopback checks the local runtime's mechanism (a sandbox with only lo); a pod
	// always has eth0, and its NetworkPolicy (enforced on the test cluster by kube-router) is
	// proven by traffic instead, for every egress mode.
	opts := conformance.Options{Decl: baseDecl, Extra: []conformance.Subtest{{
		Name:      "EgressByTraffic",
		Exercises: []capability.Name{capability.EgressDeny, capability.PublicOnlyEgress},
		Replaces:  "EgressDenyOnlyLoopback",
		Run:       func(t *testing.T) { egressByTraffic(t, e, b) },
	}, {
		// The hostname allowlist by traffic: the egress proxy in the pod's path, the bypass battery.
		Name:      "EgressAllowDomainsByTraffic",
		Exercises: []capability.Name{capability.DomainEgressRules},
		Run:       func(t *testing.T) { egressAllowDomainsByTraffic(t, e, b) },
	}}}
	decls := conformance.Declarations(opts, b.Capabilities(ctxT(t)))
	for _, d := range decls {
		e.sandboxCR(d, 1, 0) // the operator holds every default, process limit and idle timeout included
	}
	for _, d := range decls {
		e.waitIdle(d.ID, 1)
	}
	conformance.Run(t, func(*testing.T) sandbox.Backend { return b }, opts)
}

func TestPoolRefillsAfterClaims(t *testing.T) {
	e := newEnv(t)
	d := baseDecl("refill")
	e.sandboxCR(d, 2, 2)
	b := e.backend("app")
	for range 2 {
		if _, err := b.Claim(ctxT(t), "refill", nil); err != nil {
			t.Fatalf("claim: %v", err)
		}
	}
	// The status said idle=2 before the claims too: wait for one that counts both claims and a
	// pool refilled to 2 beside them.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		got := kubectl(t, "", "-n", e.ns, "get", "sandbox", "refill", "-o", "jsonpath={.status.claimed} {.status.idle}")
		var claimed, idle int
		if _, err := fmt.Sscan(got, &claimed, &idle); err == nil && claimed == 2 && idle >= 2 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Sandbox refill: claimed idle = %q after 3m, want 2 and >= 2\n%s", got,
				kubectl(t, "", "-n", e.ns, "get", "sandbox,pods", "-o", "wide"))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func TestConcurrentClaimsNeverDoubleAssign(t *testing.T) {
	e := newEnv(t)
	e.sandboxCR(baseDecl("race"), 3, 3)
	b := e.backend("app")
	const n = 8
	var wg sync.WaitGroup
	grants := make([]*brokerapi.Grant, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			grants[i], errs[i] = b.Claim(ctxT(t), "race", nil)
		}()
	}
	wg.Wait()
	sessions, endpoints := map[string]bool{}, map[string]bool{}
	ok := 0
	for i := range n {
		if errs[i] != nil {
			var be *kb.Error
			if !errors.As(errs[i], &be) || be.Status != http.StatusServiceUnavailable || be.RetryAfter <= 0 {
				t.Errorf("claim %d: %v, want success or 503 with Retry-After", i, errs[i])
			}
			continue
		}
		ok++
		g := grants[i]
		if sessions[g.Session.ID] || endpoints[g.Endpoint] {
			t.Errorf("session %s / endpoint %s assigned twice", g.Session.ID, g.Endpoint)
		}
		sessions[g.Session.ID], endpoints[g.Endpoint] = true, true
	}
	if ok == 0 {
		t.Fatal("no claim succeeded with 3 idle pods")
	}
	// Every claimed pod carries exactly one session label and is claimed once.
	out := kubectl(t, "", "-n", e.ns, "get", "pods", "-l", "airlock.dev/sandbox=race,airlock.dev/state=claimed",
		"-o", "jsonpath={range .items[*]}{.metadata.labels.airlock\\.dev/session}{\"\\n\"}{end}")
	labels := strings.Fields(out)
	if len(labels) != ok {
		t.Errorf("%d claimed pods, %d successful claims", len(labels), ok)
	}
	for _, l := range labels {
		if !sessions[l] {
			t.Errorf("claimed pod with session %s that no claimer got", l)
		}
	}
}

func TestBrokerAuthentication(t *testing.T) {
	e := newEnv(t)
	e.sandboxCR(baseDecl("authz"), 1, 1)
	kubectl(t, "", "-n", e.ns, "create", "serviceaccount", "stranger")
	claimWith := func(tok string) error {
		b, err := kb.New(kb.Config{BrokerURL: e.broker, Namespace: e.ns, CAFile: brokerCA, ServerName: brokerName,
			Token: func(context.Context) (string, error) { return tok, nil }})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		_, err = b.Claim(ctxT(t), "authz", nil)
		return err
	}
	status := func(err error) int {
		var be *kb.Error
		if errors.As(err, &be) {
			return be.Status
		}
		return 0
	}
	tests := []struct {
		name  string
		tok   string
		want  int
		class error
	}{
		{"garbage token", "not-a-token", http.StatusUnauthorized, sandbox.ErrUnauthenticated},
		{"token for another audience", e.token("app", "https://kubernetes.default.svc.cluster.local"), http.StatusUnauthorized, sandbox.ErrUnauthenticated},
		{"ServiceAccount without RBAC", e.token("stranger", brokerapi.DefaultAudience), http.StatusForbidden, sandbox.ErrForbidden},
		{"ServiceAccount with the claimer role", e.token("app", brokerapi.DefaultAudience), 0, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := claimWith(tc.tok)
			if tc.want == 0 {
				if err != nil {
					t.Fatalf("claim: %v", err)
				}
				return
			}
			if status(err) != tc.want || !errors.Is(err, tc.class) {
				t.Fatalf("claim: %v, want HTTP %d (%v)", err, tc.want, tc.class)
			}
		})
	}
	// RBAC on one Sandbox does not reach another: a role narrowed by resourceNames.
	e.sandboxCR(baseDecl("authz-other"), 1, 1)
	kubectl(t, "", "-n", e.ns, "create", "role", "only-authz", "--verb=claim", "--resource=sandboxes.airlock.dev", "--resource-name=authz")
	kubectl(t, "", "-n", e.ns, "create", "rolebinding", "stranger-authz", "--role=only-authz", "--serviceaccount="+e.ns+":stranger")
	sb, _ := kb.New(kb.Config{BrokerURL: e.broker, Namespace: e.ns, CAFile: brokerCA, ServerName: brokerName, Token: func(context.Context) (string, error) {
		return e.token("stranger", brokerapi.DefaultAudience), nil
	}})
	t.Cleanup(func() { sb.Close() })
	if _, err := sb.Claim(ctxT(t), "authz-other", nil); status(err) != http.StatusForbidden {
		t.Errorf("claim of a Sandbox outside the role's resourceNames: %v, want 403", err)
	}
	e.waitIdle("authz", 1)
	if _, err := sb.Claim(ctxT(t), "authz", nil); err != nil {
		t.Errorf("claim of the named Sandbox: %v", err)
	}
}

func TestCapabilityIsBoundToItsSession(t *testing.T) {
	e := newEnv(t)
	e.sandboxCR(baseDecl("bound"), 2, 2)
	b := e.backend("app")
	g1, err := b.Claim(ctxT(t), "bound", nil)
	if err != nil {
		t.Fatal(err)
	}
	g2, err := b.Claim(ctxT(t), "bound", nil)
	if err != nil {
		t.Fatal(err)
	}
	// Session 1's token on session 2's agent.
	a := client.New(g2.Endpoint, func() string { return g1.ExecuteToken })
	defer a.Close()
	_, err = a.Exec(ctxT(t), sandbox.ExecRequest{Shell: "echo pwned", Timeout: 10 * time.Second}, &strings.Builder{}, &strings.Builder{})
	if !errors.Is(err, sandbox.ErrForbidden) {
		t.Fatalf("exec on another session's pod with this session's token: %v, want forbidden", err)
	}
	// And its own token works there.
	own := client.New(g2.Endpoint, func() string { return g2.ExecuteToken })
	defer own.Close()
	var out strings.Builder
	if _, err := own.Exec(ctxT(t), sandbox.ExecRequest{Shell: "echo ok", Timeout: 10 * time.Second}, &out, &strings.Builder{}); err != nil || out.String() != "ok\n" {
		t.Fatalf("exec with the session's own token: %v %q", err, out.String())
	}
	// Another ServiceAccount with claim rights cannot reconnect to, or release, the session.
	kubectl(t, "", "-n", e.ns, "create", "serviceaccount", "peer")
	kubectl(t, "", "-n", e.ns, "create", "rolebinding", "peer-claim", "--clusterrole=airlock-sandbox-claimer", "--serviceaccount="+e.ns+":peer")
	peer := e.backend("peer")
	if _, err := peer.Get(ctxT(t), g1.Session.ID); !errors.Is(err, sandbox.ErrForbidden) {
		t.Errorf("another user's reconnect: %v, want forbidden", err)
	}
	if err := peer.Terminate(ctxT(t), g1.Session.ID); !errors.Is(err, sandbox.ErrForbidden) {
		t.Errorf("another user's release: %v, want forbidden", err)
	}
}

func podsOfSession(t *testing.T, ns, id string) string {
	return kubectl(t, "", "-n", ns, "get", "pods", "-l", "airlock.dev/session="+id, "-o", "name")
}

func TestTerminateDeletesPod(t *testing.T) {
	e := newEnv(t)
	e.sandboxCR(baseDecl("term"), 2, 2)
	b := e.backend("app")
	s1, err := b.Create(ctxT(t), withDefaults(baseDecl("term")))
	if err != nil {
		t.Fatal(err)
	}
	if podsOfSession(t, e.ns, s1.ID) == "" {
		t.Fatal("no pod carries the session label")
	}
	if err := b.Terminate(ctxT(t), s1.ID); err != nil {
		t.Fatal(err)
	}
	if got := podsOfSession(t, e.ns, s1.ID); got != "" {
		t.Fatalf("after Terminate the pod still exists: %s", got)
	}

	// An API error is reported, not swallowed: take the operator's right to delete pods away.
	s2, err := b.Create(ctxT(t), withDefaults(baseDecl("term")))
	if err != nil {
		t.Fatal(err)
	}
	verbs := kubectl(t, "", "get", "clusterrole", "airlock-operator", "-o", "jsonpath={.rules[2].verbs}")
	if !strings.Contains(verbs, `"delete"`) {
		t.Fatalf("clusterrole airlock-operator rules[2].verbs = %s, want the pods rule", verbs)
	}
	setVerbs := func(v string) {
		kubectl(t, "", "patch", "clusterrole", "airlock-operator", "--type=json",
			`-p=[{"op":"replace","path":"/rules/2/verbs","value":`+v+`}]`)
	}
	setVerbs(`["get","list","watch","create","update","patch"]`)
	err = b.Terminate(ctxT(t), s2.ID)
	setVerbs(verbs)
	if err == nil || errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("Terminate without delete rights: %v, want an error", err)
	}
	if podsOfSession(t, e.ns, s2.ID) == "" {
		t.Fatal("the pod is gone although Terminate failed")
	}
	if err := b.Terminate(ctxT(t), s2.ID); err != nil {
		t.Fatalf("Terminate after restoring RBAC: %v", err)
	}
}

func withDefaults(d spec.Sandbox) spec.Sandbox {
	d.ApplyDefaults()
	return d
}

func TestBrokerRestartKeepsSessions(t *testing.T) {
	e := newEnv(t)
	e.sandboxCR(baseDecl("restart"), 1, 1)
	b := e.backend("app")
	s, err := b.Create(ctxT(t), withDefaults(baseDecl("restart")))
	if err != nil {
		t.Fatal(err)
	}
	// Every replica goes (the chart runs two): no broker that saw the claim survives. The
	// StatefulSet brings each back under its own name, so gone is by uid: kubectl delete --wait
	// waited by name and hung for good when a pod came back before it looked. Delete, then
	// wait until every broker pod is a new one, and ready.
	const sel = "app.kubernetes.io/name=airlock-operator"
	old := strings.Fields(kubectl(t, "", "-n", "airlock-system", "get", "pod", "-l", sel, "-o", "jsonpath={.items[*].metadata.uid}"))
	kubectl(t, "", "-n", "airlock-system", "delete", "pod", "-l", sel, "--wait=false")
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
		out := kubectl(t, "", "-n", "airlock-system", "get", "pod", "-l", sel, "-o",
			`jsonpath={range .items[*]}{.metadata.uid} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}`)
		ready := 0
		for line := range strings.Lines(out) {
			uid, st, _ := strings.Cut(strings.TrimSpace(line), " ")
			if slices.Contains(old, uid) {
				ready = -1 // an old broker is still there
				break
			}
			if st == "True" {
				ready++
			}
		}
		if ready == len(old) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the broker pods were not replaced and ready within 2 minutes:\n%s", out)
		}
	}
	kubectl(t, "", "-n", "airlock-system", "rollout", "status", "statefulset/airlock-operator", "--timeout=120s")
	e.broker = brokerURL(t)
	fresh := e.backend("app") // no state carried over from b
	got, err := fresh.Get(ctxT(t), s.ID)
	if err != nil {
		t.Fatalf("Get after broker restart: %v", err)
	}
	if got.ID != s.ID || got.SandboxID != "restart" {
		t.Fatalf("session after restart = %+v", got)
	}
	a, err := fresh.Connect(ctxT(t), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var out strings.Builder
	if _, err := a.Exec(ctxT(t), sandbox.ExecRequest{Shell: "echo still-here", Timeout: 10 * time.Second}, &out, &strings.Builder{}); err != nil || out.String() != "still-here\n" {
		t.Fatalf("exec after broker restart: %v %q", err, out.String())
	}
	if err := fresh.Terminate(ctxT(t), s.ID); err != nil {
		t.Fatal(err)
	}
}

// TestTimeoutLeavesNoProcess: in a pod the agent has no cgroup of its own to kill through (its
// kill scope is the process group), so this checks what a deadline actually leaves behind.
func TestTimeoutLeavesNoProcess(t *testing.T) {
	e := newEnv(t)
	e.sandboxCR(baseDecl("reap"), 1, 1)
	b := e.backend("app")
	s, err := b.Create(ctxT(t), withDefaults(baseDecl("reap")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Terminate(context.Background(), s.ID) })
	a, err := b.Connect(ctxT(t), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	h, err := a.Health(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	res, err := a.Exec(ctxT(t), sandbox.ExecRequest{Shell: "sleep 600 & sleep 601", Timeout: time.Second}, &strings.Builder{}, &strings.Builder{})
	if err != nil || !res.TimedOut {
		t.Fatalf("exec: %v %+v, want a timeout", err, res)
	}
	var out strings.Builder
	if _, err := a.Exec(ctxT(t), sandbox.ExecRequest{Argv: []string{"ps", "-eo", "pid,pgid,args"}, Timeout: 10 * time.Second}, &out, &strings.Builder{}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "sleep 60") {
		t.Errorf("kill scope %q: processes of the timed-out command survive:\n%s", h.KillScope, out.String())
	}
}

func condition(t *testing.T, ns, name, typ string) (status, reason string) {
	out := kubectl(t, "", "-n", ns, "get", "sandbox", name, "-o",
		`jsonpath={.status.conditions[?(@.type=="`+typ+`")].status} {.status.conditions[?(@.type=="`+typ+`")].reason}`)
	status, reason, _ = strings.Cut(out, " ")
	return status, reason
}

func waitCondition(t *testing.T, ns, name, typ, wantStatus, wantReason string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		s, r := condition(t, ns, name, typ)
		if s == wantStatus && r == wantReason {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Sandbox %s condition %s = %s/%s, want %s/%s", name, typ, s, r, wantStatus, wantReason)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// The operator refuses what a pod cannot enforce, as a condition with a stable reason, and keeps
// no pods for it; the broker refuses claims of it.
func TestRefusedDeclarations(t *testing.T) {
	e := newEnv(t)
	preview := baseDecl("preview")
	preview.PreviewPorts = []int{8080}
	e.sandboxCR(preview, 2, 0)
	waitCondition(t, e.ns, "preview", "Accepted", "False", "Unsupported")
	// gVisor does not enforce RLIMIT_NPROC, which holds every declaration's process limit.
	gv := baseDecl("gvisor")
	gv.Runtime = spec.RuntimeGVisor
	e.sandboxCR(gv, 1, 0)
	waitCondition(t, e.ns, "gvisor", "Accepted", "False", "Unsupported")
	if pods := kubectl(t, "", "-n", e.ns, "get", "pods", "-o", "name"); pods != "" {
		t.Errorf("pods exist for refused Sandboxes: %s", pods)
	}
	b := e.backend("app")
	if _, err := b.Claim(ctxT(t), "preview", nil); !errors.Is(err, sandbox.ErrRefused) {
		t.Errorf("claim of a refused Sandbox: %v, want refused", err)
	}
}
