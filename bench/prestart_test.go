package bench

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/runcode"
)

// newPrestartPool is newWarmPool whose sandboxes hold langs' interpreters started and waiting.
func newPrestartPool(b *testing.B, be *local.Backend, size int, langs ...runcode.Language) *local.Pool {
	b.Helper()
	return newPrestartPoolOf(b, be, runcode.Options{}, size, langs...)
}

// newPrestartPoolOf is newPrestartPool for runs with opts (their image).
func newPrestartPoolOf(b *testing.B, be *local.Backend, opts runcode.Options, size int, langs ...runcode.Language) *local.Pool {
	b.Helper()
	quiet := slog.New(slog.DiscardHandler)
	pf, err := runcode.Prestart(runcode.PrestartOptions{Languages: langs, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	p, err := local.NewPool(context.Background(), be, runcode.PoolTemplate(opts, 10*time.Minute),
		local.PoolOptions{Size: size, IdleExpiry: 10 * time.Minute, Logger: quiet, Prestart: pf})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := p.Close(context.Background()); err != nil {
			b.Error(err)
		}
	})
	waitPool(b, p, size)
	return p
}

// BenchmarkPrestartVsHostInterleaved is run_code from a settled pool whose sandboxes hold the
// language's interpreter pre-started, next to the same program run on the host with no sandbox
// (python3 -c / node -e), one after the other in every iteration so both see the same load. It
// reports the medians and the median of the per-iteration ratios; ns/op is the whole iteration
// and means nothing by itself. Every run_code call is timed whole: plan check, claim, handing
// the code over, the program's run and exit, the sandbox handed to the reaper.
func BenchmarkPrestartVsHostInterleaved(b *testing.B) {
	py := []string{"/usr/bin/python3", "-c", snippet}
	js := []string{"/usr/bin/node", "-e", "console.log(2+2)"}
	cases := []struct {
		name   string
		lang   runcode.Language
		langs  []runcode.Language // pre-started in each pooled sandbox
		code   string
		host   []string
		stdout string
	}{
		{"python", runcode.Python, []runcode.Language{runcode.Python}, snippet, py, "4"},
		{"node", runcode.Node, []runcode.Language{runcode.Node}, "console.log(2+2)", js, "4"},
		// The same output, then os._exit: python's finalisation skipped. Not run_code's
		// semantics (atexit, __del__, flushes at exit are lost); it shows what finalisation
		// costs of the python call above.
		{"python-no-finalisation", runcode.Python, []runcode.Language{runcode.Python},
			"import os, sys\nprint(2+2)\nsys.stdout.flush()\nos._exit(0)", py, "4"},
		// Both pre-started: the run first removes the one it does not use.
		{"python-of-both", runcode.Python, []runcode.Language{runcode.Python, runcode.Node}, snippet, py, "4"},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			needRoot(b)
			be := newBackend(b, stateDir(b))
			p := newPrestartPool(b, be, 4, c.langs...)
			var host, warm, ratio []float64
			for b.Loop() {
				settle(b, p, 4)
				t := time.Now()
				res, err := runcode.Run(context.Background(), be, runcode.Request{Language: string(c.lang), Code: c.code}, runcode.Options{Pool: p})
				w := time.Since(t)
				if err != nil || res.ExitCode != 0 || strings.TrimSpace(res.Stdout) != c.stdout {
					b.Fatalf("run_code: %v %+v", err, res)
				}
				settle(b, p, 4)
				t = time.Now()
				runOnce(b, c.host[0], c.host[1:]...)
				h := time.Since(t)
				host = append(host, ms(h))
				warm = append(warm, ms(w))
				ratio = append(ratio, float64(w)/float64(h))
			}
			b.ReportMetric(median(host), "host-ms")
			b.ReportMetric(median(warm), "prestart-ms")
			b.ReportMetric(median(ratio), "prestart/host")
			reportPool(b, p)
		})
	}
}

// monoNs is CLOCK_MONOTONIC in ns, the clock python's time.monotonic_ns() reads in the sandbox.
func monoNs(b *testing.B) int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		b.Fatal(err)
	}
	return ts.Nano()
}

// BenchmarkPrestartBreakdown splits a pre-started python run_code call with timestamps taken
// in the caller and in the program (one clock): call start -> the program's first line (claim,
// handing the code over, the loader writing main.py, python compiling it); the program
// (print); its last line -> the call returns (python's exit, the agent seeing it and
// answering). "exit" runs the same program; "os._exit" ends it with sys.stdout.flush() and
// os._exit(0), so its tail is the agent's part alone and the difference is python's exit. The
// host's python3 -c runs in every iteration too, for the ratio.
func BenchmarkPrestartBreakdown(b *testing.B) {
	const body = "import time\nt = time.monotonic_ns()\nprint(2+2)\nprint(t, time.monotonic_ns())\n"
	for _, c := range []struct{ name, code string }{
		{"exit", body},
		{"os._exit", body + "import os, sys\nsys.stdout.flush()\nos._exit(0)\n"},
	} {
		b.Run(c.name, func(b *testing.B) {
			needRoot(b)
			be := newBackend(b, stateDir(b))
			p := newPrestartPool(b, be, 4, runcode.Python)
			var head, prog, tail, call, host, ratio []float64
			for b.Loop() {
				settle(b, p, 4)
				t0 := monoNs(b)
				res, err := runcode.Run(context.Background(), be, runcode.Request{Language: "python", Code: c.code}, runcode.Options{Pool: p})
				t3 := monoNs(b)
				lines := strings.Fields(res.Stdout)
				if err != nil || res.ExitCode != 0 || len(lines) != 3 || lines[0] != "4" {
					b.Fatalf("run_code: %v %+v", err, res)
				}
				t1, err1 := strconv.ParseInt(lines[1], 10, 64)
				t2, err2 := strconv.ParseInt(lines[2], 10, 64)
				if err1 != nil || err2 != nil || t1 < t0 || t2 < t1 || t3 < t2 {
					b.Fatalf("timestamps out of order: %d %d %d %d (%v %v)", t0, t1, t2, t3, err1, err2)
				}
				settle(b, p, 4)
				t := time.Now()
				runOnce(b, "/usr/bin/python3", "-c", snippet)
				h := time.Since(t)
				head = append(head, float64(t1-t0)/1e6)
				prog = append(prog, float64(t2-t1)/1e6)
				tail = append(tail, float64(t3-t2)/1e6)
				call = append(call, float64(t3-t0)/1e6)
				host = append(host, ms(h))
				ratio = append(ratio, float64(t3-t0)/float64(h))
			}
			b.ReportMetric(median(head), "to-first-line-ms")
			b.ReportMetric(median(prog), "program-ms")
			b.ReportMetric(median(tail), "last-line-to-return-ms")
			b.ReportMetric(median(call), "call-ms")
			b.ReportMetric(median(host), "host-ms")
			b.ReportMetric(median(ratio), "call/host")
			reportPool(b, p)
		})
	}
}
