//go:build cluster

package kubernetes_test

import (
	"context"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	kb "github.com/airlock-sandbox/airlock/backend/kubernetes"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// benchEnv adapts env (built for *testing.T) to a benchmark.
func benchEnv(b *testing.B) *env {
	e := &env{ns: "airlock-bench-" + randSuffix()}
	kubectl(b, "", "create", "namespace", e.ns)
	b.Cleanup(func() { kubectl(b, "", "delete", "namespace", e.ns, "--wait=false") })
	kubectl(b, "", "-n", e.ns, "create", "serviceaccount", "app")
	kubectl(b, "", "-n", e.ns, "create", "rolebinding", "app-claim", "--clusterrole=airlock-sandbox-claimer", "--serviceaccount="+e.ns+":app")
	e.broker = brokerURL(b)
	return e
}

// poolStatus is the Sandbox's status counts: idle ready pods and claimed ones.
func poolStatus(b *testing.B, ns, name string) (idle, claimed int) {
	out := kubectl(b, "", "-n", ns, "get", "sandbox", name, "-o", "jsonpath={.status.idle} {.status.claimed}")
	i, c, _ := strings.Cut(out, " ")
	idle, _ = strconv.Atoi(i)
	claimed, _ = strconv.Atoi(c)
	return idle, claimed
}

// waitIdleB waits until the status shows n idle pods and at least claimed sessions: a status
// written before the last claims were seen still shows the pool full (the controller writes it
// 200 ms after a claim's event), and a claim of the whole pool then found it one pod short.
func waitIdleB(b *testing.B, ns, name string, n, claimed int) {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		i, c := poolStatus(b, ns, name)
		if i >= n && c >= claimed {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("pool %s/%s never reached %d idle with %d claimed (at %d, %d)", ns, name, n, claimed, i, c)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// BenchmarkWarmClaimToFirstExec: claim a warm pod through the broker and run `true` in it, with
// the pool full before each claim (refills run outside the timer, so claims measure the warm
// path, not a node busy starting pods). Reports p50/p90 of claim and of claim→first exec, then
// the refill rate: claim the whole pool at once and time until it is full again (pods/s).
func BenchmarkWarmClaimToFirstExec(b *testing.B) {
	const pool = 8
	e := benchEnv(b)
	d := baseDecl("bench")
	body := `{"apiVersion":"airlock.dev/v1alpha1","kind":"Sandbox","metadata":{"name":"bench","namespace":"` + e.ns +
		`"},"spec":{"poolSize":` + strconv.Itoa(pool) + `,"image":{"ref":"` + d.Image.Ref + `"},"limits":{"cpu":"200m","memory":"128Mi","disk":"64Mi"}}}`
	kubectl(b, body, "apply", "-f", "-")
	tok := kubectl(b, "", "-n", e.ns, "create", "token", "app", "--audience", "airlock-broker")
	be := newBackendB(b, e, tok)
	var lat, claimLat []time.Duration
	ctx := context.Background()
	claims := 0 // sessions claimed so far in this namespace (none is released)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		waitIdleB(b, e.ns, "bench", pool, claims)
		b.StartTimer()
		start := time.Now()
		g, err := be.Claim(ctx, "bench", nil)
		if err != nil {
			b.Fatal(err)
		}
		claims++
		claimLat = append(claimLat, time.Since(start))
		a, err := be.Connect(ctx, g.Session.ID)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := a.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}, Timeout: 10 * time.Second}, &strings.Builder{}, &strings.Builder{}); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
		a.Close()
	}
	b.StopTimer()
	pct := func(l []time.Duration, p int) float64 {
		sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
		return float64(l[(len(l)-1)*p/100].Microseconds()) / 1000
	}
	b.ReportMetric(pct(claimLat, 50), "claim-p50-ms")
	b.ReportMetric(pct(lat, 50), "p50-ms")
	b.ReportMetric(pct(lat, 90), "p90-ms")

	waitIdleB(b, e.ns, "bench", pool, claims)
	start := time.Now()
	for range pool {
		if _, err := be.Claim(ctx, "bench", nil); err != nil {
			b.Fatal(err)
		}
		claims++
	}
	waitIdleB(b, e.ns, "bench", pool, claims)
	b.ReportMetric(float64(pool)/time.Since(start).Seconds(), "refill-pods/s")
}

func newBackendB(b *testing.B, e *env, tok string) *kb.Backend {
	be, err := kb.New(kb.Config{BrokerURL: e.broker, Namespace: e.ns, CAFile: brokerCA, ServerName: brokerName,
		Token: func(context.Context) (string, error) { return tok, nil }})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { be.Close() })
	return be
}
