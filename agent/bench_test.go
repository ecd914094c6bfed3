package agent_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

// BenchmarkExecTrue is one exec round trip of `true` over the agent's unix socket: request,
// fork/exec, exit, kill-scope cleanup, terminal frame.
func BenchmarkExecTrue(b *testing.B) {
	h := newHarness(b).start()
	ctx := context.Background()
	req := sbtypes.ExecRequest{Argv: []string{"true"}, Timeout: time.Minute}
	b.ResetTimer()
	for b.Loop() {
		res, err := h.cl.Exec(ctx, req, nil, nil)
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("%+v %v", res, err)
		}
	}
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
	for b.Loop() {
		if gap > 0 {
			b.StopTimer()
			time.Sleep(gap)
			b.StartTimer()
		}
		res, err := h.cl.Exec(ctx, req, nil, nil)
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("%+v %v", res, err)
		}
	}
}
