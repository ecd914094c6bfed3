package agent_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/agent"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

// BenchmarkExecTrue is one exec round trip of `true` over the agent's unix socket: request,
// fork/exec, exit, kill-scope cleanup, terminal frame. Without a cgroup, the scope is the
// subreaper: the reaper's start is part of the round trip.
func BenchmarkExecTrue(b *testing.B) { benchExecTrue(b, newHarness(b), 0) }

// BenchmarkExecTrueSpaced is BenchmarkExecTrue with spacedGap between execs (not timed), as a
// session issues them: the next exec's reaper has been started by then.
func BenchmarkExecTrueSpaced(b *testing.B) { benchExecTrue(b, newHarness(b), spacedGap) }

// spacedGap is the untimed pause of the Spaced exec benchmarks: more than a reaper's start
// takes on a loaded machine (15-20 ms at load average 30 on 2 cores).
const spacedGap = 100 * time.Millisecond

// BenchmarkExecTrueProcessGroup is BenchmarkExecTrue with the process group as the scope (no
// reaper): the difference is the reaper's cost.
func BenchmarkExecTrueProcessGroup(b *testing.B) {
	h := newHarness(b)
	h.env = []string{envNoReaper + "=1"}
	benchExecTrue(b, h, 0)
}

// BenchmarkExecTrueProcessGroupSpaced is BenchmarkExecTrueSpaced with the process group.
func BenchmarkExecTrueProcessGroupSpaced(b *testing.B) {
	h := newHarness(b)
	h.env = []string{envNoReaper + "=1"}
	benchExecTrue(b, h, spacedGap)
}

func benchExecTrue(b *testing.B, h *harness, gap time.Duration) {
	h.start()
	ctx := context.Background()
	req := sbtypes.ExecRequest{Argv: []string{"true"}, Timeout: time.Minute}
	m := h.meter(b)
	for b.Loop() {
		if gap > 0 {
			b.StopTimer()
			time.Sleep(gap)
			b.StartTimer()
		}
		t := time.Now()
		res, err := h.cl.Exec(ctx, req, nil, nil)
		m.add(time.Since(t))
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("%+v %v", res, err)
		}
	}
	m.report()
}

// meter adds two figures that hold up on a loaded machine better than the mean: the median
// round trip, and the CPU time the agent process spent per operation (its threads' run time
// from /proc/<pid>/task/*/schedstat; the commands it starts are not counted).
type meter struct {
	b     *testing.B
	pid   int
	cpu0  time.Duration
	times []time.Duration
}

func (h *harness) meter(b *testing.B) *meter {
	m := &meter{b: b, pid: h.proc.Process.Pid}
	m.cpu0 = m.cpu()
	return m
}

func (m *meter) add(d time.Duration) { m.times = append(m.times, d) }

func (m *meter) cpu() time.Duration {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", m.pid))
	var sum time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		var ns int64
		if _, err := fmt.Sscan(string(b), &ns); err == nil {
			sum += time.Duration(ns)
		}
	}
	return sum
}

func (m *meter) report() {
	if len(m.times) == 0 {
		return
	}
	slices.Sort(m.times)
	m.b.ReportMetric(float64(m.times[len(m.times)/2].Nanoseconds()), "p50-ns/op")
	m.b.ReportMetric(float64((m.cpu()-m.cpu0).Nanoseconds())/float64(len(m.times)), "agent-cpu-ns/op")
}

// BenchmarkOutputThroughput streams 64 MiB of stdout through the agent to the client.
func BenchmarkOutputThroughput(b *testing.B) {
	h := newHarness(b).start()
	ctx := context.Background()
	const n = 64 << 20
	req := sbtypes.ExecRequest{Shell: "head -c 67108864 /dev/zero", Timeout: time.Minute, MaxStdout: n}
	b.SetBytes(n)
	b.ResetTimer()
	for b.Loop() {
		cw := &countWriter{}
		res, err := h.cl.Exec(ctx, req, cw, nil)
		if err != nil || res.ExitCode != 0 || cw.n != n {
			b.Fatalf("%+v %v, %d bytes", res, err, cw.n)
		}
	}
}

// BenchmarkFileWriteRead writes and reads back 1 MiB through the files API.
func BenchmarkFileWriteRead(b *testing.B) {
	h := newHarness(b).start()
	ctx := context.Background()
	data := bytes.Repeat([]byte("x"), 1<<20)
	b.SetBytes(2 << 20)
	b.ResetTimer()
	for b.Loop() {
		if err := h.cl.WriteFile(ctx, "/bench", bytes.NewReader(data), 0); err != nil {
			b.Fatal(err)
		}
		rc, err := h.cl.ReadFile(ctx, "/bench", 0, 0)
		if err != nil {
			b.Fatal(err)
		}
		m, err := io.Copy(io.Discard, rc)
		rc.Close()
		if err != nil || m != int64(len(data)) {
			b.Fatal(m, err)
		}
	}
}

type countWriter struct{ n int64 }

func (c *countWriter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

// BenchmarkExecTrueCgroupV1 is BenchmarkExecTrue with a per-exec v1 freezer cgroup (root).
func BenchmarkExecTrueCgroupV1(b *testing.B) {
	benchExecTrueV1(b, 0)
}

// BenchmarkExecTrueCgroupV1Spaced is BenchmarkExecTrueCgroupV1 with 20 ms between execs (not
// timed), as a session issues them: back to back, the kernel's cgroup lock stays in its
// fast state and hides the cost of moving a thread by tid (an RCU grace period per move).
func BenchmarkExecTrueCgroupV1Spaced(b *testing.B) {
	benchExecTrueV1(b, 20*time.Millisecond)
}

func benchExecTrueV1(b *testing.B, gap time.Duration) {
	if os.Geteuid() != 0 {
		b.Skip("needs root for a freezer cgroup")
	}
	h := newHarness(b)
	dir := filepath.Join("/sys/fs/cgroup/freezer", "airlock-test-"+randHex(4))
	if err := os.Mkdir(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = syscall.Rmdir(dir) })
	h.cfg.CgroupV1Freezer = dir
	h.start()
	ctx := context.Background()
	req := sbtypes.ExecRequest{Argv: []string{"true"}, Timeout: time.Minute}
	m := h.meter(b)
	for b.Loop() {
		if gap > 0 {
			b.StopTimer()
			time.Sleep(gap)
			b.StartTimer()
		}
		t := time.Now()
		res, err := h.cl.Exec(ctx, req, nil, nil)
		m.add(time.Since(t))
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("%+v %v", res, err)
		}
	}
	m.report()
}

// BenchmarkServeReady is the agent's serve preamble, in process: agent.Serve called until its
// Ready hook runs (config check, files root, listen, the spawner thread ready), then stopped.
// "freezer-v1" (root) runs it as the local runtime does: the process already in the freezer
// cgroup the config names.
func BenchmarkServeReady(b *testing.B) {
	b.Run("plain", func(b *testing.B) { benchServeReady(b, "") })
	b.Run("freezer-v1", func(b *testing.B) {
		if os.Geteuid() != 0 {
			b.Skip("needs root for a freezer cgroup")
		}
		dir := filepath.Join("/sys/fs/cgroup/freezer", "airlock-test-"+randHex(4))
		if err := os.Mkdir(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		pid := fmt.Sprint(os.Getpid())
		if err := os.WriteFile(dir+"/cgroup.procs", []byte(pid), 0); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			_ = os.WriteFile("/sys/fs/cgroup/freezer/cgroup.procs", []byte(pid), 0)
			_ = syscall.Rmdir(dir)
		})
		benchServeReady(b, dir)
	})
}

func benchServeReady(b *testing.B, freezer string) {
	h := newHarness(b)
	h.cfg.CgroupV1Freezer = freezer
	var times []time.Duration
	for b.Loop() {
		ctx, cancel := context.WithCancel(context.Background())
		ready := make(chan struct{})
		served := make(chan error, 1)
		t := time.Now()
		go func() {
			served <- agent.Serve(ctx, h.cfg, agent.Hooks{Ready: func(string) { close(ready) }})
		}()
		select {
		case <-ready:
			times = append(times, time.Since(t))
		case err := <-served:
			b.Fatal(err)
		}
		cancel()
		if err := <-served; err != nil {
			b.Fatal(err)
		}
	}
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2].Nanoseconds()), "p50-ns/op")
}
