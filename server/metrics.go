package server

import (
	"context"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/airlock-sandbox/airlock/sandbox"
)

// EgressCounter is implemented by backends that count egress decisions; until one does, the
// egress counters read 0.
type EgressCounter interface {
	EgressCounts() (allowed, denied uint64)
}

type metrics struct {
	reg           *prometheus.Registry
	requests      *prometheus.CounterVec
	createSeconds *prometheus.HistogramVec
	execSeconds   *prometheus.HistogramVec
}

// latencyBuckets span a warm exec (milliseconds) to an image unpack (a minute and more).
var latencyBuckets = prometheus.ExponentialBuckets(0.005, 2, 15)

func newMetrics(reg *prometheus.Registry, b sandbox.Backend) (*metrics, error) {
	m := &metrics{
		reg: reg,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "airlock_http_requests_total", Help: "API requests by route and status code.",
		}, []string{"route", "code"}),
		createSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "airlock_sandbox_create_seconds", Help: "Time to create a sandbox, until its agent answers.", Buckets: latencyBuckets,
		}, []string{"outcome"}),
		execSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "airlock_exec_seconds", Help: "Time from exec request to its terminal event.", Buckets: latencyBuckets,
		}, []string{"outcome"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.createSeconds, m.execSeconds, &backendCollector{b: b}} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

func (m *metrics) observeCreate(d time.Duration, err error) {
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	m.createSeconds.WithLabelValues(outcome).Observe(d.Seconds())
}

func (m *metrics) observeExec(d time.Duration, res sandbox.ExecResult, err error) {
	outcome := "exited"
	switch {
	case err != nil:
		outcome = "error"
	case res.TimedOut:
		outcome = "timed_out"
	case res.OOMKilled:
		outcome = "oom_killed"
	}
	m.execSeconds.WithLabelValues(outcome).Observe(d.Seconds())
}

var (
	sandboxesDesc = prometheus.NewDesc("airlock_sandboxes", "Sandboxes by state.", []string{"state"}, nil)
	cpuDesc       = prometheus.NewDesc("airlock_sandbox_cpu_seconds_total", "CPU time a sandbox has used (its cgroup's count).", []string{"session", "sandbox"}, nil)
	memDesc       = prometheus.NewDesc("airlock_sandbox_memory_bytes", "Memory a sandbox uses now (its cgroup's count).", []string{"session", "sandbox"}, nil)
	egressDesc    = prometheus.NewDesc("airlock_egress_connections_total", "Egress connections by policy decision.", []string{"decision"}, nil)
)

// backendCollector reads the backend at scrape time, so the numbers are never stale.
type backendCollector struct{ b sandbox.Backend }

func (c *backendCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sandboxesDesc
	ch <- cpuDesc
	ch <- memDesc
	ch <- egressDesc
}

func (c *backendCollector) Collect(ch chan<- prometheus.Metric) {
	var allowed, denied uint64
	if ec, ok := c.b.(EgressCounter); ok {
		allowed, denied = ec.EgressCounts()
	}
	ch <- prometheus.MustNewConstMetric(egressDesc, prometheus.CounterValue, float64(allowed), "allowed")
	ch <- prometheus.MustNewConstMetric(egressDesc, prometheus.CounterValue, float64(denied), "denied")

	ctx, cancel := context.WithTimeout(context.Background(), backendTimeout)
	defer cancel()
	list, err := c.b.List(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(sandboxesDesc, err)
		return
	}
	counts := map[sandbox.State]int{sandbox.StateRunning: 0, sandbox.StatePaused: 0, sandbox.StateTerminated: 0}
	for _, s := range list {
		counts[s.State]++
	}
	for st, n := range counts {
		ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(n), string(st))
	}
	src, err := sandbox.Feature[sandbox.StatsReader](ctx, c.b)
	if err != nil {
		return // no per-sandbox series where the backend does not count usage
	}
	for _, s := range list {
		st, err := src.Stats(ctx, s.ID)
		if err != nil {
			continue // ended between List and Stats
		}
		ch <- prometheus.MustNewConstMetric(cpuDesc, prometheus.CounterValue, st.CPUSeconds, s.ID, s.SandboxID)
		ch <- prometheus.MustNewConstMetric(memDesc, prometheus.GaugeValue, float64(st.MemoryBytes), s.ID, s.SandboxID)
	}
}
