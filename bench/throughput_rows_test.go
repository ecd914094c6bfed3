package bench

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// BenchmarkThroughputSideBySide is issue 6's throughput target put next to every other
// sandbox on this machine: for each row of the side-by-side table (BenchmarkSideBySide's: host
// python, the same on the rootfs's files, bare namespaces, airlock, every runtime installed),
// N concurrent callers make the same number of calls,
// rows rotated per iteration so each sees the same load. Rows whose work is partly done
// outside the call (a parked sandbox's or a pool's refill) are left out: RunCodeThroughput measures
// the pool sustained. Reported per row: calls per second, its ratio to host python (the issue
// asks ≥ 0.8× of a fresh sandbox) and to host python on the rootfs's files (the baseline of
// the rows that run in the rootfs), and the machine's busy CPU per call (/proc/stat: every
// process's and kernel thread's, dockerd's and the shims' too; on a quiet machine the whole
// cost of a call, on a shared one also everyone else's work).
func BenchmarkThroughputSideBySide(b *testing.B) {
	needRoot(b)
	rows := slices.DeleteFunc(sideBySideRows(b), func(r row) bool { return r.settle != nil })
	if rows[0].name != "host" {
		b.Fatalf("the first row is %s, want host: every ratio is to it", rows[0].name)
	}
	hostRootfs := slices.IndexFunc(rows, func(r row) bool { return r.name == "host-rootfs" })
	if hostRootfs < 0 {
		b.Fatal("no host-rootfs row")
	}
	for _, r := range rows {
		if err := r.call(); err != nil {
			b.Fatalf("%s: %v", r.name, err)
		}
	}
	for _, w := range throughputWorkers {
		b.Run(fmt.Sprintf("workers=%d", w), func(b *testing.B) {
			calls := w * callsPerWorker
			wall := make([]time.Duration, len(rows))
			busy := make([]time.Duration, len(rows))
			ratios := make([][]float64, len(rows))
			it := 0
			for b.Loop() {
				took := make([]time.Duration, len(rows))
				for k := range rows {
					i := (k + it) % len(rows)
					t, m := time.Now(), machineBusy()
					if _, err := parallel(w, calls, rows[i].call); err != nil {
						b.Fatalf("%s: %v", rows[i].name, err)
					}
					took[i] = time.Since(t)
					wall[i] += took[i]
					busy[i] += machineBusy() - m
				}
				for i := range rows {
					// Calls per second over host's: host's time over the row's.
					ratios[i] = append(ratios[i], float64(took[0])/float64(took[i]))
				}
				it++
			}
			n := float64(it * calls)
			var tab strings.Builder
			fmt.Fprintf(&tab, "\n%d callers, %d calls per row\n\n| row | calls / s | / host | / host-rootfs | / host (median of iterations) | machine CPU ms per call |\n|---|---|---|---|---|---|\n", w, int(n))
			for i, r := range rows {
				rate := n / wall[i].Seconds()
				cpuMs := float64(busy[i]) / float64(time.Millisecond) / n
				b.ReportMetric(rate, r.name+"-calls/s")
				b.ReportMetric(float64(wall[0])/float64(wall[i]), r.name+"/host")
				fmt.Fprintf(&tab, "| %s | %.1f | %.2f× | %.2f× | %.2f× | %.1f |\n", r.name, rate, float64(wall[0])/float64(wall[i]),
					float64(wall[hostRootfs])/float64(wall[i]), medianOf(ratios[i]), cpuMs)
			}
			fmt.Fprintf(&tab, "\nload average at the end: %s", loadAvg())
			report(b, tab.String())
		})
	}
}
