package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/runcode"
	"golang.org/x/sys/unix"
)

// throughputWorkers are the concurrencies measured on the 2-core machine: one caller per core,
// and two per core (a caller waiting on the kernel leaves its core to the other).
var throughputWorkers = []int{2, 4}

// callsPerWorker is how many calls each worker makes in one phase of one iteration.
const callsPerWorker = 3

// parallel runs calls of f on workers goroutines and returns the wall time they took together.
func parallel(workers, calls int, f func() error) (time.Duration, error) {
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	t := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(calls) {
				if err := f(); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(t), errors.Join(errs...)
}

func loadAvg() string {
	raw, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// BenchmarkSandboxesPerSecond is sandboxes created (and terminated) per second through the
// library with N concurrent callers: create a run_code sandbox (host image, egress denied, the
// run_code limits), wait until its agent answers, terminate it. Nothing runs in it.
func BenchmarkSandboxesPerSecond(b *testing.B) {
	needRoot(b)
	for _, w := range throughputWorkers {
		b.Run(fmt.Sprintf("workers=%d", w), func(b *testing.B) {
			be := newBackend(b, stateDir(b))
			ctx := context.Background()
			req, err := runcode.Normalize(runcode.Request{Language: "python", Code: snippet})
			if err != nil {
				b.Fatal(err)
			}
			var total time.Duration
			n := 0
			for b.Loop() {
				d, err := parallel(w, w*callsPerWorker, func() error {
					s, err := be.Create(ctx, runcode.Declaration(req, runcode.Options{}))
					if err != nil {
						return err
					}
					return be.Terminate(ctx, s.ID)
				})
				if err != nil {
					b.Fatal(err)
				}
				total += d
				n += w * callsPerWorker
			}
			b.ReportMetric(float64(n)/total.Seconds(), "sandboxes/s")
			report(b, fmt.Sprintf("workers=%d: %d sandboxes, %.1f/s; load average %s", w, n, float64(n)/total.Seconds(), loadAvg()))
		})
	}
}

// BenchmarkRunCodeThroughput is issue 6's throughput on 2 cores: run_code python
// `print(2+2)` with a fresh sandbox per call, N concurrent callers, against host
// /usr/bin/python3 -c processes at the same concurrency. Every iteration has one phase of each
// (order alternating), the same number of calls in each, so both see the same load:
//
//   - host: /usr/bin/python3 -c 'print(2+2)', no sandbox;
//   - fresh: runcode.Run without a pool: create, write main.py, python3 main.py, terminate;
//   - prestart-pool: runcode.Run from a pool of 2N sandboxes with python pre-started
//     (`airlock mcp --pool --pool-prestart`'s path). Still a fresh sandbox per call; the pool's
//     refill is work the 2 cores must do for every call, so this phase's clock stops only when
//     the pool is full and idle again (sustained throughput, not a burst from a full pool).
//
// Reported: calls per second of each and the ratio to host (target ≥ 0.8 for fresh).
func BenchmarkRunCodeThroughput(b *testing.B) {
	needRoot(b)
	for _, w := range throughputWorkers {
		b.Run(fmt.Sprintf("workers=%d", w), func(b *testing.B) {
			be := newBackend(b, stateDir(b))
			ctx := context.Background()
			poolSize := 2 * w
			p := newPrestartPool(b, be, poolSize, runcode.Python)
			check := func(res runcode.Result, err error) error {
				if err != nil {
					return err
				}
				if res.ExitCode != 0 || strings.TrimSpace(res.Stdout) != "4" {
					return fmt.Errorf("run_code: exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
				}
				return nil
			}
			phases := []struct {
				name string
				call func() error
				// after waits (inside the phase's clock) until the phase's work is done.
				after func()
			}{
				{"host", func() error { return runPython("/usr/bin/python3", "-c", snippet) }, nil},
				{"fresh", func() error {
					return check(runcode.Run(ctx, be, runcode.Request{Language: "python", Code: snippet}, runcode.Options{}))
				}, nil},
				{"prestart-pool", func() error {
					return check(runcode.Run(ctx, be, runcode.Request{Language: "python", Code: snippet}, runcode.Options{Pool: p}))
				}, func() { settleQuiet(b, p, poolSize) }},
			}
			total := make([]time.Duration, len(phases))
			cpu := make([]time.Duration, len(phases))
			calls := w * callsPerWorker
			it := 0
			for b.Loop() {
				// Nothing of the pool's left running into the next phase.
				settleQuiet(b, p, poolSize)
				for k := range phases {
					i := (k + it) % len(phases)
					t, c := time.Now(), cpuTime()
					_, err := parallel(w, calls, phases[i].call)
					if err != nil {
						b.Fatalf("%s: %v", phases[i].name, err)
					}
					if phases[i].after != nil {
						phases[i].after()
					}
					total[i] += time.Since(t)
					cpu[i] += cpuTime() - c
					settleQuiet(b, p, poolSize)
				}
				it++
			}
			n := float64(it * calls)
			rate := make([]float64, len(phases))
			var line strings.Builder
			for i, ph := range phases {
				rate[i] = n / total[i].Seconds()
				b.ReportMetric(rate[i], ph.name+"-calls/s")
				cpuMs := float64(cpu[i]) / float64(time.Millisecond) / n
				b.ReportMetric(cpuMs, ph.name+"-cpu-ms/call")
				fmt.Fprintf(&line, "%s %.1f calls/s (%.2f× host), %.1f ms CPU per call; ", ph.name, rate[i], rate[i]/rate[0], cpuMs)
			}
			b.ReportMetric(rate[1]/rate[0], "fresh/host")
			b.ReportMetric(rate[2]/rate[0], "pool/host")
			reportPool(b, p)
			report(b, fmt.Sprintf("workers=%d, %d calls per phase: %sload average %s", w, int(n), line.String(), loadAvg()))
		})
	}
}

// cpuTime is the CPU time (user and system) of this process and of its waited-for
// descendants so far: the benchmark's own, host python's, and a sandbox's (its init and agent
// are this process's children and reap what runs in them). Kernel work done in worker threads
// (a network namespace's teardown, for one) is in no process's account.
func cpuTime() time.Duration {
	var self, children unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &self)
	_ = unix.Getrusage(unix.RUSAGE_CHILDREN, &children)
	var total int64
	for _, ru := range []*unix.Rusage{&self, &children} {
		total += ru.Utime.Nano() + ru.Stime.Nano()
	}
	return time.Duration(total)
}

// settleQuiet waits until the pool is full and idle (settle without touching the timer: these
// benchmarks keep their own clocks).
func settleQuiet(b *testing.B, p *local.Pool, size int) {
	b.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for st := p.Stats(); st.Size < size || st.Creating > 0 || st.Reaping > 0; st = p.Stats() {
		if time.Now().After(deadline) {
			b.Fatalf("pool did not settle: %+v", st)
		}
		time.Sleep(time.Millisecond)
	}
}

// BenchmarkCallCPU is what one call costs the machine, serial rounds of host python, the
// library's fresh call (create, python3 -c, terminate: freshRun) and runcode.Run's fresh call,
// interleaved with $AIRLOCK_BENCH_WORKERS callers (default 2). Reported per call: the CPU of
// this process and its waited-for descendants (rusage) and the whole machine's busy CPU time
// (/proc/stat, every state but idle and iowait), which also holds kernel work done in worker
// threads (a network namespace's teardown) and, on a shared machine, whatever else ran.
func BenchmarkCallCPU(b *testing.B) {
	needRoot(b)
	w := 2
	if v, err := strconv.Atoi(os.Getenv("AIRLOCK_BENCH_WORKERS")); err == nil && v > 0 {
		w = v
	}
	be := newBackend(b, stateDir(b))
	ctx := context.Background()
	phases := []struct {
		name string
		call func() error
	}{
		{"host", func() error { return runPython("/usr/bin/python3", "-c", snippet) }},
		{"library", func() error { return freshRun(ctx, be) }},
		{"runcode", func() error {
			res, err := runcode.Run(ctx, be, runcode.Request{Language: "python", Code: snippet}, runcode.Options{})
			if err == nil && (res.ExitCode != 0 || strings.TrimSpace(res.Stdout) != "4") {
				err = fmt.Errorf("run_code: exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
			}
			return err
		}},
	}
	// AIRLOCK_BENCH_AGENTS="name=/path/to/airlock-agent[@[disk:]state-dir-parent],...": a library
	// phase per agent binary (each with its own backend and a state dir under /run or the
	// parent given; "disk:" makes it beforehand, so it stays on the parent's filesystem),
	// interleaved with the rest, for before/after.
	for _, kv := range strings.Split(os.Getenv("AIRLOCK_BENCH_AGENTS"), ",") {
		name, bin, ok := strings.Cut(kv, "=")
		if !ok {
			continue
		}
		dir := ""
		if bin2, parent, ok := strings.Cut(bin, "@"); ok {
			disk, onDisk := strings.CutPrefix(parent, "disk:")
			bin, dir = bin2, stateDirIn(b, disk, onDisk)
		} else {
			dir = stateDir(b)
		}
		abe, err := local.New(ctx, local.Options{StateDir: dir, AgentPath: bin, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { abe.Close() })
		phases = append(phases, struct {
			name string
			call func() error
		}{"library-" + name, func() error { return freshRun(ctx, abe) }})
	}
	if only := os.Getenv("AIRLOCK_BENCH_PHASES"); only != "" { // e.g. "library", to profile one
		phases = slices.DeleteFunc(phases, func(p struct {
			name string
			call func() error
		}) bool {
			return !slices.Contains(strings.Split(only, ","), p.name)
		})
	}
	// One call of each first: caches (the /etc copy, the agent binary's pages) warm.
	for _, ph := range phases {
		if err := ph.call(); err != nil {
			b.Fatal(err)
		}
	}
	calls := w * callsPerWorker
	wall := make([]time.Duration, len(phases))
	cpu := make([]time.Duration, len(phases))
	sys := make([]time.Duration, len(phases))
	own := make([]time.Duration, len(phases))
	it := 0
	for b.Loop() {
		for k := range phases {
			i := (k + it) % len(phases)
			t, c, s, o := time.Now(), cpuTime(), machineBusy(), ownCPU()
			if _, err := parallel(w, calls, phases[i].call); err != nil {
				b.Fatalf("%s: %v", phases[i].name, err)
			}
			wall[i] += time.Since(t)
			cpu[i] += cpuTime() - c
			sys[i] += machineBusy() - s
			own[i] += ownCPU() - o
		}
		it++
	}
	n := float64(it * calls)
	var line strings.Builder
	for i, ph := range phases {
		rate := n / wall[i].Seconds()
		ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / n }
		b.ReportMetric(rate, ph.name+"-calls/s")
		b.ReportMetric(ms(cpu[i]), ph.name+"-cpu-ms/call")
		b.ReportMetric(ms(sys[i]), ph.name+"-machine-ms/call")
		b.ReportMetric(ms(own[i]), ph.name+"-caller-ms/call")
		fmt.Fprintf(&line, "%s %.1f calls/s (%.2f× host), CPU %.1f ms (caller %.1f, children %.1f), machine %.1f ms per call; ",
			ph.name, rate, rate/(n/wall[0].Seconds()), ms(cpu[i]), ms(own[i]), ms(cpu[i]-own[i]), ms(sys[i]))
	}
	report(b, fmt.Sprintf("workers=%d, %d calls per phase: %sload average %s", w, int(n), line.String(), loadAvg()))
}

// ownCPU is the CPU time of this process alone (the caller's side: the library, the client).
func ownCPU() time.Duration {
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// machineBusy is the CPU time every core spent not idle since boot (/proc/stat's cpu line:
// user, nice, system, irq, softirq, steal).
func machineBusy() time.Duration {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	f := strings.Fields(line)
	var ticks int64
	for i, v := range f[1:] {
		if i == 3 || i == 4 || i >= 8 { // idle, iowait; guest and guest_nice are in user already
			continue
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		ticks += n
	}
	return time.Duration(ticks) * time.Second / 100 // USER_HZ
}

// BenchmarkUsernsClone is the caller's CPU for starting /bin/true in a new user namespace (as
// spawn starts a sandbox's init) against the same start without one, with 0, 16 and 64 MiB
// of live heap in the caller, which writes one page in 16 of it between starts (as a busy
// daemon does). With CLONE_NEWUSER the Go runtime cannot vfork (the child waits for its uid
// and gid maps): the kernel copies the caller's page tables, the child's exec tears the copy
// down and the caller takes a write fault on each page it touches afterwards, so a create
// costs more the bigger the process that makes it.
func BenchmarkUsernsClone(b *testing.B) {
	needRoot(b)
	for _, mib := range []int{0, 16, 64} {
		heap := make([][]byte, mib*16)
		for i := range heap {
			heap[i] = make([]byte, 64<<10)
			for j := 0; j < len(heap[i]); j += 4096 {
				heap[i][j] = 1
			}
		}
		for _, userns := range []bool{false, true} {
			b.Run(fmt.Sprintf("heap=%dMiB/userns=%v", mib, userns), func(b *testing.B) {
				c0 := cpuTime()
				for b.Loop() {
					cmd := exec.Command("/bin/true")
					if userns {
						ids := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}}
						cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER, UidMappings: ids, GidMappings: ids}
					}
					if err := cmd.Run(); err != nil {
						b.Fatal(err)
					}
					for _, s := range heap {
						s[0]++
					}
				}
				b.ReportMetric(float64(cpuTime()-c0)/float64(b.N)/1e6, "cpu-ms/op")
			})
		}
		runtime.KeepAlive(heap)
	}
}
