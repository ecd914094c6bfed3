package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// Back-to-back calls (issue 26, docs/benchmarks.md): one caller makes its calls one right after
// the other, each started the moment the previous answered, as an agent's loop does. Each row
// is timed against host python (python3 -c, the same code) called back to back in the same
// run: bursts of backToBackCalls calls alternate between the host and the row, with a pause of
// backToBackPause before each (the caller thinking), so both see the same load. The row's
// first burst is reported apart ("first"): a pool that sizes itself to the call rate has not
// seen it yet. It reports p50 and p90 of the host's calls and of the row's later bursts, their
// ratios (the same percentile: row/host), and the first burst's.
const (
	backToBackCalls  = 30
	backToBackBursts = 5 // the first, then four
	backToBackPause  = 2 * time.Second
)

// backToBack times bursts of back-to-back calls of host and of row, alternating, and reports
// the percentiles and ratios under name.
func backToBack(b *testing.B, name string, row func() error) {
	host := func() error { return runPython("/usr/bin/python3", "-c", snippet) }
	var hostMS, firstMS, rowMS []float64
	burst := func(call func() error, into *[]float64) {
		time.Sleep(backToBackPause)
		for range backToBackCalls {
			t := time.Now()
			if err := call(); err != nil {
				b.Fatal(err)
			}
			*into = append(*into, float64(time.Since(t).Microseconds())/1000)
		}
	}
	load := loadAvg()
	for b.Loop() {
		for i := range backToBackBursts {
			burst(host, &hostMS)
			if i == 0 {
				burst(row, &firstMS)
			} else {
				burst(row, &rowMS)
			}
		}
	}
	hp50, hp90 := pct(hostMS, 50), pct(hostMS, 90)
	rp50, rp90 := pct(rowMS, 50), pct(rowMS, 90)
	fp50, fp90 := pct(firstMS, 50), pct(firstMS, 90)
	b.ReportMetric(hp50, "host-p50-ms")
	b.ReportMetric(hp90, "host-p90-ms")
	b.ReportMetric(rp50, name+"-p50-ms")
	b.ReportMetric(rp90, name+"-p90-ms")
	b.ReportMetric(rp50/hp50, "p50/host")
	b.ReportMetric(rp90/hp90, "p90/host")
	b.ReportMetric(fp50/hp50, "first-p50/host")
	b.ReportMetric(fp90/hp90, "first-p90/host")
	b.Logf("%s: bursts of %d calls back to back, load average %s (before) %s (after); host p50 %.1f p90 %.1f ms; %s, bursts 2-%d: p50 %.1f p90 %.1f ms = p50 %.2fx, p90 %.2fx; first burst: p50 %.1f p90 %.1f ms = %.2fx, %.2fx",
		name, backToBackCalls, load, loadAvg(), hp50, hp90, name, backToBackBursts, rp50, rp90, rp50/hp50, rp90/hp90, fp50, fp90, fp50/hp50, fp90/hp90)
}

// pct is the p-th percentile of xs (nearest rank).
func pct(xs []float64, p int) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	i := (p*len(s)+99)/100 - 1
	return s[max(i, 0)]
}

// BenchmarkBackToBackMCP is run_code called back to back through the shipped `airlock mcp`
// (the full CLI's, over stdio, as an MCP client starts it), host image: "default" with its
// default settings, the pool as a user gets it; "pool-memory-0" the pool held at --pool
// (issue 26's measurement before the pool grew with the call rate).
func BenchmarkBackToBackMCP(b *testing.B) {
	for _, c := range []struct {
		name  string
		flags []string
	}{
		{"default", nil},
		{"pool-memory-0", []string{"--pool-memory", "0"}},
	} {
		b.Run(c.name, func(b *testing.B) {
			needRoot(b)
			full := filepath.Join(binDir, "airlock-full")
			if _, err := os.Stat(full); err != nil {
				b.Skip("the full CLI did not build")
			}
			call := startMCP(b, append([]string{"mcp", "--state-dir", stateDir(b)}, c.flags...))
			if err := call(); err != nil { // the server up, its pool started
				b.Fatal(err)
			}
			backToBack(b, "mcp", call)
		})
	}
}

// startMCP starts `airlock-full args` as an MCP client starts a stdio server and returns a
// run_code call of snippet; the server ends with the benchmark.
func startMCP(b *testing.B, args []string) func() error {
	ctx := context.Background()
	cmd := exec.Command(filepath.Join(binDir, "airlock-full"), args...)
	// The defaults, not the caller's environment's.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(e string) bool { return strings.HasPrefix(e, "AIRLOCK_POOL") })
	cmd.Stderr = os.Stderr
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "airlock-bench", Version: "1"}, nil).Connect(ctx, &sdk.CommandTransport{Command: cmd}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cs.Close() })
	return func() error {
		r, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "run_code", Arguments: map[string]any{"language": "python", "code": snippet}})
		if err != nil {
			return err
		}
		text := ""
		for _, c := range r.Content {
			if t, ok := c.(*sdk.TextContent); ok {
				text += t.Text
			}
		}
		if r.IsError || !strings.Contains(text, "--- stdout ---\n4\n") {
			return fmt.Errorf("run_code answered %q", text)
		}
		return nil
	}
}

// BenchmarkBackToBackRun is `airlock run -c` (the lean front, with its default parked sandboxes)
// called back to back, host image.
func BenchmarkBackToBackRun(b *testing.B) {
	backToBack(b, "run", startRun(b))
}

// startRun returns an `airlock run -c snippet` (the lean front, host image, a state dir of its
// own, extra flags added) that has run once: its filler started.
func startRun(b *testing.B, extra ...string) func() error {
	needRoot(b)
	cli := filepath.Join(binDir, "airlock")
	if exec.Command(cli, "run", "--help").Run() != nil {
		b.Skip("the airlock CLI did not build")
	}
	state := stateDir(b)
	be := newBackend(b, state)
	terminateParked(b, be, state)
	args := append(append([]string{cli, "run", "--state-dir", state}, extra...), "-c", snippet)
	call := func() error { return runPython(args...) }
	if err := call(); err != nil {
		b.Fatal(err)
	}
	return call
}

// refillSamples is how many calls each of refillBeside's two kinds times; refillPause lets
// a pool of two refill and settle.
const (
	refillSamples = 20
	refillPause   = time.Second
)

// refillBeside times a pooled call with the pool's refill running beside it against the same
// call with nothing refilling (issue 26: refilling must not starve the call it refills for).
// Each round, after a pause that lets the pool fill and settle: "alone" is one call, timed;
// "beside" is one call that takes a pooled sandbox and so starts its refill, then a second,
// timed, right behind it while that refill runs. The pool holds at least two, so both are hits.
// It reports the p50 and p90 of each and their ratios (beside / alone).
func refillBeside(b *testing.B, name string, call func() error) {
	var alone, beside []float64
	timed := func(into *[]float64) {
		t := time.Now()
		if err := call(); err != nil {
			b.Fatal(err)
		}
		*into = append(*into, float64(time.Since(t).Microseconds())/1000)
	}
	load := loadAvg()
	for b.Loop() {
		for range refillSamples {
			time.Sleep(refillPause)
			timed(&alone)
			time.Sleep(refillPause)
			if err := call(); err != nil {
				b.Fatal(err)
			}
			timed(&beside)
		}
	}
	a50, a90, s50, s90 := pct(alone, 50), pct(alone, 90), pct(beside, 50), pct(beside, 90)
	b.ReportMetric(a50, name+"-alone-p50-ms")
	b.ReportMetric(s50, name+"-beside-p50-ms")
	b.ReportMetric(s50/a50, "beside/alone-p50")
	b.ReportMetric(s90/a90, "beside/alone-p90")
	b.Logf("%s: a pooled call alone p50 %.1f p90 %.1f ms; with the previous call's refill beside it p50 %.1f p90 %.1f ms = %.2fx, %.2fx; %d each; load average %s (before) %s (after)",
		name, a50, a90, s50, s90, s50/a50, s90/a90, len(alone), load, loadAvg())
}

// BenchmarkRefillBeside is refillBeside for `airlock run` (parked sandboxes, --pool 2: the
// filler a run starts refills while the next run runs) and MCP run_code (the process pool,
// --pool 2: the refill runs in the server's own process), host image.
func BenchmarkRefillBeside(b *testing.B) {
	b.Run("run", func(b *testing.B) { refillBeside(b, "run", startRun(b, "--pool", "2")) })
	b.Run("mcp", func(b *testing.B) {
		needRoot(b)
		if _, err := os.Stat(filepath.Join(binDir, "airlock-full")); err != nil {
			b.Skip("the full CLI did not build")
		}
		call := startMCP(b, []string{"mcp", "--state-dir", stateDir(b), "--pool", "2"})
		if err := call(); err != nil {
			b.Fatal(err)
		}
		refillBeside(b, "mcp", call)
	})
}
