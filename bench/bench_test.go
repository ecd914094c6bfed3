// Package bench measures a fresh sandbox per call side by side with the alternatives, in one run.
package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/runcode"
	"github.com/airlock-sandbox/airlock/runcode/runcodetest"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

const snippet = "print(2+2)"

var (
	binDir     string // airlock and airlock-agent, built once
	bundleRoot string // $AIRLOCK_BENCH_ROOTFS: a rootfs for runc/crun/runsc (hack/mkrootfs.sh)
)

func TestMain(m *testing.M) {
	flagBench := false
	for _, a := range os.Args {
		if strings.HasPrefix(a, "-test.bench") {
			flagBench = true
		}
	}
	if !flagBench || os.Geteuid() != 0 {
		// Nothing to build for plain `go test`: this package has only benchmarks.
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "airlock-bench-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	// As installed: the lean front as airlock, the full CLI next to it as airlock-full.
	for _, b := range []struct{ name, pkg string }{{"airlock", "airlock"}, {"airlock-full", "airlock-full"}, {"airlock-agent", "airlock-agent"}} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, b.name), "../cmd/"+b.pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0") // static, as shipped: no cgo
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			if b.name != "airlock-agent" {
				// The CLI benchmarks skip themselves; the rest still runs.
				fmt.Fprintln(os.Stderr, "build", b.pkg, err, "(CLI benchmarks will skip)")
				continue
			}
			fmt.Fprintln(os.Stderr, "build", b.pkg, err)
			os.Exit(1)
		}
	}
	bundleRoot = os.Getenv("AIRLOCK_BENCH_ROOTFS")
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func needRoot(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
}

func runOnce(b *testing.B, name string, args ...string) {
	b.Helper()
	cmd := exec.Command(name, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		b.Fatalf("%s %v: %v\n%s", name, args, err, errb.String())
	}
	if strings.TrimSpace(out.String()) != "4" {
		b.Fatalf("%s printed %q, want 4 (stderr %q)", name, out.String(), errb.String())
	}
}

func newBackend(b *testing.B, stateDir string) *local.Backend {
	b.Helper()
	be, err := local.New(context.Background(), local.Options{
		StateDir:  stateDir,
		AgentPath: filepath.Join(binDir, "airlock-agent"),
		Logger:    slog.New(slog.DiscardHandler),
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { be.Close() })
	return be
}

// stateDir is a fresh state dir whose parents the sandbox's mapped root can traverse, under
// $AIRLOCK_BENCH_STATE_PARENT (default /run: ext4 on this machine, where a host's /run is
// usually a tmpfs). The runtime makes the dir itself, so on a disk parent it mounts a tmpfs of
// its own there; AIRLOCK_BENCH_STATE_ON_DISK=1 makes it beforehand, which keeps it on disk.
func stateDir(b *testing.B) string {
	b.Helper()
	parent := os.Getenv("AIRLOCK_BENCH_STATE_PARENT")
	if parent == "" {
		parent = "/run"
	}
	return stateDirIn(b, parent, os.Getenv("AIRLOCK_BENCH_STATE_ON_DISK") == "1")
}

// stateDirIn is stateDir under parent, made beforehand if onDisk.
func stateDirIn(b *testing.B, parent string, onDisk bool) string {
	b.Helper()
	dir, err := os.MkdirTemp(parent, "airlock-bench-")
	if err != nil {
		b.Fatal(err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		b.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	if onDisk {
		// Made here, not by the runtime: it stays on the parent's filesystem (no tmpfs of the
		// runtime's own), as before issue 26.
		if err := os.Mkdir(state, 0o711); err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() {
		if err := local.RemoveStateDir(dir); err != nil {
			b.Errorf("remove %s: %v", dir, err)
		}
		// The CLI runs' and backends' default parent for this state dir, empty by now.
		runcodetest.RemoveCgroupParent(b, local.CgroupParentFor(state))
	})
	return state
}

func hostDecl() spec.Sandbox {
	d := spec.Sandbox{ID: "bench", Image: spec.Image{Host: true}}
	d.ApplyDefaults()
	return d
}

// freshRun is one run_code-shaped call through the library: create, exec, terminate.
func freshRun(ctx context.Context, be sandbox.Backend) error {
	_, err := freshRunTimed(ctx, be)
	return err
}

// phases are the moments of one freshRunTimed call, from its start.
type phases struct {
	created, result, terminated time.Duration
}

// freshRunTimed is freshRun, timed: created is when Create returned, result when the exec's
// result was in hand (a caller such as runcode.RunDetached or a daemon answers then and
// terminates meanwhile), terminated when Terminate confirmed the sandbox gone.
func freshRunTimed(ctx context.Context, be sandbox.Backend) (phases, error) {
	var p phases
	start := time.Now()
	s, err := be.Create(ctx, hostDecl())
	if err != nil {
		return p, err
	}
	p.created = time.Since(start)
	terminated := false
	defer func() {
		if !terminated { // a failed call's sandbox; a second Terminate is work no caller does
			be.Terminate(context.WithoutCancel(ctx), s.ID)
		}
	}()
	ag, err := be.Connect(ctx, s.ID)
	if err != nil {
		return p, err
	}
	var out bytes.Buffer
	res, err := ag.Exec(ctx, sandbox.ExecRequest{Argv: []string{"/usr/bin/python3", "-c", snippet}, Timeout: 30 * time.Second}, &out, &out)
	ag.Close()
	if err != nil {
		return p, err
	}
	if res.ExitCode != 0 || strings.TrimSpace(out.String()) != "4" {
		return p, fmt.Errorf("exit %d output %q", res.ExitCode, out.String())
	}
	p.result = time.Since(start)
	terminated = true
	if err := be.Terminate(ctx, s.ID); err != nil {
		return p, err
	}
	p.terminated = time.Since(start)
	return p, nil
}

// runcodeRun is the same call through runcode.RunDetached (what the CLI, the daemon and MCP
// run): the plan check, create, main.py written, python3 main.py, terminate in the background.
// result is when RunDetached returned; terminated when its Termination confirmed the sandbox gone.
func runcodeRun(ctx context.Context, be sandbox.Backend) (phases, error) {
	var p phases
	start := time.Now()
	res, term, err := runcode.RunDetached(ctx, be, runcode.Request{Language: "python", Code: snippet}, runcode.Options{})
	p.result = time.Since(start)
	if terr := term.Wait(); terr != nil {
		err = errors.Join(err, terr)
	}
	p.terminated = time.Since(start)
	if err != nil {
		return p, err
	}
	if res.ExitCode != 0 || strings.TrimSpace(res.Stdout) != "4" {
		return p, fmt.Errorf("exit %d output %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	return p, nil
}

// BenchmarkFreshPython is the headline: a fresh isolated python3 -c 'print(2+2)' per call,
// next to the same snippet unsandboxed and under the other runtimes found on this host.
func BenchmarkFreshPython(b *testing.B) {
	b.Run("host", func(b *testing.B) {
		for b.Loop() {
			runOnce(b, "/usr/bin/python3", "-c", snippet)
		}
	})
	b.Run("airlock-library", func(b *testing.B) {
		needRoot(b)
		be := newBackend(b, stateDir(b))
		ctx := context.Background()
		for b.Loop() {
			if err := freshRun(ctx, be); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("airlock-cli", func(b *testing.B) {
		needRoot(b)
		state := stateDir(b)
		bin := filepath.Join(binDir, "airlock")
		if err := exec.Command(bin, "run", "--help").Run(); err != nil {
			b.Skip("airlock run is not available in this build")
		}
		for b.Loop() {
			runOnce(b, bin, "run", "--pool", "0", "--state-dir", state, "--lang", "python", "-c", snippet)
		}
	})
	b.Run("bwrap", func(b *testing.B) {
		bw := lookOrSkip(b, "bwrap")
		args := []string{"--unshare-all", "--unshare-user", "--die-with-parent", "--new-session",
			"--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
			"--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
			"/usr/bin/python3", "-c", snippet}
		for b.Loop() {
			runOnce(b, bw, args...)
		}
	})
	for _, rt := range []string{"runc", "crun", "runsc"} {
		b.Run(rt, func(b *testing.B) {
			bin := lookOrSkip(b, rt)
			if bundleRoot == "" {
				b.Skip("set AIRLOCK_BENCH_ROOTFS to a rootfs (bench/run.sh does)")
			}
			bundle := makeBundle(b, rt)
			var n atomic.Int64
			for b.Loop() {
				id := fmt.Sprintf("airlock-bench-%s-%d-%d", rt, os.Getpid(), n.Add(1))
				args := []string{"run", "--bundle", bundle, id}
				if rt == "runsc" {
					args = append([]string{"--network=none", "--root", filepath.Join(bundle, "state")}, args...)
				}
				runOnce(b, bin, args...)
			}
		})
	}
	b.Run("docker", func(b *testing.B) {
		bin := lookOrSkip(b, "docker")
		img := os.Getenv("AIRLOCK_BENCH_DOCKER_IMAGE")
		if img == "" || exec.Command(bin, "info").Run() != nil {
			b.Skip("no docker engine (bench/run.sh starts one and sets AIRLOCK_BENCH_DOCKER_IMAGE)")
		}
		for b.Loop() {
			runOnce(b, bin, "run", "--rm", "--network", "none", img, "/usr/bin/python3", "-c", snippet)
		}
	})
}

// BenchmarkFreshVsHostInterleaved runs, in every iteration, host python, a fresh sandbox through
// the library (create, exec python, terminate), the same through runcode.RunDetached and through
// the one-shot CLI, one after the other: on a shared machine they see the same load, so the
// per-iteration ratios are the ones to quote. Reported: medians of each (ms) and of the
// per-iteration ratios. library-ms and runcode-ms are call -> sandbox terminated (confirmed);
// *-result-ms are call -> result, the terminate still running (its outcome still awaited and
// reported: runcode.Termination); the CLI exits only after the terminate.
func BenchmarkFreshVsHostInterleaved(b *testing.B) {
	needRoot(b)
	state := stateDir(b)
	be := newBackend(b, state)
	ctx := context.Background()
	cli := filepath.Join(binDir, "airlock")
	timed := func(f func()) float64 {
		t := time.Now()
		f()
		return float64(time.Since(t)) / float64(time.Millisecond)
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	m := map[string][]float64{}
	add := func(k string, v float64) { m[k] = append(m[k], v) }
	for b.Loop() {
		h := timed(func() { runOnce(b, "/usr/bin/python3", "-c", snippet) })
		lp, err := freshRunTimed(ctx, be)
		if err != nil {
			b.Fatal(err)
		}
		rp, err := runcodeRun(ctx, be)
		if err != nil {
			b.Fatal(err)
		}
		c := timed(func() {
			runOnce(b, cli, "run", "--pool", "0", "--state-dir", state, "--lang", "python", "-c", snippet)
		})
		add("host-ms", h)
		add("library-ms", ms(lp.terminated))
		add("library-result-ms", ms(lp.result))
		add("library-create-ms", ms(lp.created))
		add("library-exec-ms", ms(lp.result-lp.created))
		add("library-terminate-ms", ms(lp.terminated-lp.result))
		add("runcode-ms", ms(rp.terminated))
		add("runcode-result-ms", ms(rp.result))
		add("cli-ms", c)
		add("library/host", ms(lp.terminated)/h)
		add("library-result/host", ms(lp.result)/h)
		add("runcode/host", ms(rp.terminated)/h)
		add("runcode-result/host", ms(rp.result)/h)
		add("cli/host", c/h)
	}
	for k, v := range m {
		b.ReportMetric(medianOf(v), k)
	}
}

func medianOf(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkCreateThroughput is fresh sandboxes (create, exec python, terminate) on every core.
// Sandboxes per second = 1e9 / ns/op.
func BenchmarkCreateThroughput(b *testing.B) {
	b.Run("host-python", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				runOnce(b, "/usr/bin/python3", "-c", snippet)
			}
		})
	})
	b.Run("airlock-library", func(b *testing.B) {
		needRoot(b)
		be := newBackend(b, stateDir(b))
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := freshRun(context.Background(), be); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// BenchmarkIdleMemory reports the host memory an idle sandbox costs: the memory cgroups' charge
// (agent, tmpfs, kernel objects charged there) and the agents' proportional set size.
func BenchmarkIdleMemory(b *testing.B) {
	needRoot(b)
	const n = 50
	be := newBackend(b, stateDir(b))
	ctx := context.Background()
	var ids []string
	b.Cleanup(func() {
		for _, id := range ids {
			be.Terminate(context.WithoutCancel(ctx), id)
		}
	})
	for b.Loop() {
		for len(ids) < n {
			s, err := be.Create(ctx, hostDecl())
			if err != nil {
				b.Fatal(err)
			}
			ids = append(ids, s.ID)
		}
	}
	time.Sleep(2 * time.Second) // let start-up garbage settle; this is a reading, not a timing
	var charged, pss int64
	for _, id := range ids {
		c, p, err := sessionMemory(id)
		if err != nil {
			b.Fatal(err)
		}
		charged += c
		pss += p
	}
	b.ReportMetric(float64(charged)/n/(1<<20), "cgroup-MiB/sandbox")
	b.ReportMetric(float64(pss)/n/(1<<20), "pss-MiB/sandbox")
}

// sessionMemory finds the sandbox's memory cgroup by its session id and sums its charge and
// the PSS of its processes.
func sessionMemory(id string) (charged, pss int64, err error) {
	matches, _ := filepath.Glob("/sys/fs/cgroup/memory/*/" + id)
	if len(matches) != 1 {
		return 0, 0, fmt.Errorf("memory cgroup of %s: found %v", id, matches)
	}
	raw, err := os.ReadFile(filepath.Join(matches[0], "memory.usage_in_bytes"))
	if err != nil {
		return 0, 0, err
	}
	charged, err = strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil {
		return 0, 0, err
	}
	procs, err := os.ReadFile(filepath.Join(matches[0], "cgroup.procs"))
	if err != nil {
		return 0, 0, err
	}
	for _, f := range strings.Fields(string(procs)) {
		rollup, err := os.ReadFile("/proc/" + f + "/smaps_rollup")
		if err != nil {
			continue // exited between the two reads
		}
		for _, line := range strings.Split(string(rollup), "\n") {
			if rest, ok := strings.CutPrefix(line, "Pss:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
				pss += kb << 10
			}
		}
	}
	return charged, pss, nil
}

func lookOrSkip(b *testing.B, name string) string {
	p, err := exec.LookPath(name)
	if err != nil {
		b.Skipf("%s not installed (bench/run.sh installs it)", name)
	}
	return p
}

// makeBundle writes an OCI bundle whose root is the shared rootfs, read-only, no network.
func makeBundle(b *testing.B, rt string) string {
	b.Helper()
	dir := b.TempDir()
	cmd := exec.Command("runc", "spec", "-b", dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("runc spec: %v %s", err, out)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		b.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		b.Fatal(err)
	}
	proc := cfg["process"].(map[string]any)
	proc["terminal"] = false
	proc["args"] = []string{"/usr/bin/python3", "-c", snippet}
	cfg["root"] = map[string]any{"path": bundleRoot, "readonly": true}
	if rt == "runsc" {
		// gVisor counts its own threads against the pids limit (see notes): no host pids limit.
		if lin, ok := cfg["linux"].(map[string]any); ok {
			delete(lin, "resources")
		}
	}
	out, err := json.Marshal(cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), out, 0o644); err != nil {
		b.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "state"), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		b.Fatal(err)
	}
	return dir
}
