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

func idle(b *testing.B, ns, name string) int {
	n, _ := strconv.Atoi(kubectl(b, "", "-n", ns, "get", "sandbox", name, "-o", "jsonpath={.status.idle}"))
	return n
}

func waitIdleB(b *testing.B, ns, name string, n int) {
	deadline := time.Now().Add(5 * time.Minute)
	for idle(b, ns, name) < n {
		if time.Now().After(deadline) {
			b.Fatalf("pool %s/%s never reached %d idle", ns, name, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// BenchmarkWarmClaimToFirstExec: claim a warm pod through the broker and run `true` in it.
// Reports p50/p90 of claim→first-exec and the pool's refill rate (pods/s) after each batch.
func BenchmarkWarmClaimToFirstExec(b *testing.B) {
	const pool = 8
	e := benchEnv(b)
	d := baseDecl("bench")
	body := `{"apiVersion":"airlock.dev/v1alpha1","kind":"Sandbox","metadata":{"name":"bench","namespace":"` + e.ns +
		`"},"spec":{"poolSize":` + strconv.Itoa(pool) + `,"image":{"ref":"` + d.Image.Ref + `"},"limits":{"cpu":"200m","memory":"128Mi","disk":"64Mi"}}}`
	kubectl(b, body, "apply", "-f", "-")
	waitIdleB(b, e.ns, "bench", pool)
	tok := kubectl(b, "", "-n", e.ns, "create", "token", "app", "--audience", "airlock-broker")
	be := newBackendB(b, e, tok)
	var lat []time.Duration
	var refill []float64
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i > 0 && i%pool == 0 {
			b.StopTimer()
			start := time.Now()
			waitIdleB(b, e.ns, "bench", pool)
			refill = append(refill, float64(pool)/time.Since(start).Seconds())
			b.StartTimer()
		}
		start := time.Now()
		g, err := be.Claim(ctx, "bench", nil)
		if err != nil {
			b.Fatal(err)
		}
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
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*9/10].Microseconds())/1000, "p90-ms")
	if len(refill) > 0 {
		sum := 0.0
		for _, r := range refill {
			sum += r
		}
		b.ReportMetric(sum/float64(len(refill)), "refill-pods/s")
	}
}

func newBackendB(b *testing.B, e *env, tok string) *kb.Backend {
	be, err := kb.New(kb.Config{BrokerURL: e.broker, Namespace: e.ns,
		Token: func(context.Context) (string, error) { return tok, nil }})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { be.Close() })
	return be
}
