package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/runcode"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
	"golang.org/x/sys/unix"
)

// A row of the side-by-side table: one way to run python3 -c 'print(2+2)' in a fresh sandbox
// (or, for host, in no sandbox), from creation to removal.
type row struct {
	name string
	call func() error
	// settle, when set, runs untimed after each call: background work the call left (a parked sandbox
	// or pool refill) finishes before the next row is timed, so it loads no other row.
	settle func() error
}

// settled runs the row's settle, if it has one.
func (r row) settled() error {
	if r.settle == nil {
		return nil
	}
	return r.settle()
}

// requiredRows is $AIRLOCK_BENCH_REQUIRE (comma-separated row names): rows that must run.
// bench/run.sh sets it to every runtime it installs, so a broken runtime fails the run instead
// of leaving its row out of the table.
func requiredRows() map[string]bool {
	req := map[string]bool{}
	for _, n := range strings.Split(os.Getenv("AIRLOCK_BENCH_REQUIRE"), ",") {
		if n = strings.TrimSpace(n); n != "" {
			req[n] = true
		}
	}
	return req
}

// runPython runs argv and checks that it printed 4 and nothing else.
func runPython(argv ...string) error { return runPythonOn(nil, argv...) }

// runPythonOn is runPython with the process started by start (nil: in this process's
// namespaces).
func runPythonOn(start func(*exec.Cmd) error, argv ...string) error {
	cmd := exec.Command(argv[0], argv[1:]...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	var err error
	if start != nil {
		err = start(cmd)
		if err == nil {
			err = cmd.Wait()
		}
	} else {
		err = cmd.Run()
	}
	if err != nil {
		return fmt.Errorf("%s: %w\n%s", strings.Join(argv, " "), err, errb.String())
	}
	if strings.TrimSpace(out.String()) != "4" {
		return fmt.Errorf("%s printed %q, want 4 (stderr %q)", strings.Join(argv, " "), out.String(), errb.String())
	}
	return nil
}

// dirDecl is the sandbox the airlock rows create: the shared rootfs, egress denied (the
// default), the other defaults as declared.
func dirDecl(root string) spec.Sandbox {
	d := spec.Sandbox{ID: "bench", Image: spec.Image{Dir: root}}
	d.ApplyDefaults()
	return d
}

// freshRunDecl is freshRun with a given declaration: create, exec python, terminate.
func freshRunDecl(ctx context.Context, be sandbox.Backend, decl spec.Sandbox) error {
	s, err := be.Create(ctx, decl)
	if err != nil {
		return err
	}
	terminated := false
	defer func() {
		if !terminated { // a failed call's sandbox; a second Terminate is work no caller does
			be.Terminate(context.WithoutCancel(ctx), s.ID)
		}
	}()
	ag, err := be.Connect(ctx, s.ID)
	if err != nil {
		return err
	}
	defer ag.Close()
	var out bytes.Buffer
	res, err := ag.Exec(ctx, sandbox.ExecRequest{Argv: []string{"/usr/bin/python3", "-c", snippet}, Timeout: 30 * time.Second}, &out, &out)
	if err != nil {
		return err
	}
	if res.ExitCode != 0 || strings.TrimSpace(out.String()) != "4" {
		return fmt.Errorf("exit %d output %q", res.ExitCode, out.String())
	}
	terminated = true
	return be.Terminate(ctx, s.ID)
}

// sideBySideRows builds every row this host can run; a missing runtime is left out unless
// required (then the benchmark fails).
func sideBySideRows(b *testing.B) []row {
	b.Helper()
	req := requiredRows()
	var rows []row
	missing := func(name, why string) {
		if req[name] {
			b.Fatalf("%s is required ($AIRLOCK_BENCH_REQUIRE) but %s", name, why)
		}
		b.Logf("%s: left out: %s", name, why)
	}
	rootfs := bundleRoot
	if rootfs == "" {
		b.Skip("set AIRLOCK_BENCH_ROOTFS to a rootfs (bench/run.sh does): every row runs in the same one")
	}

	rows = append(rows, row{name: "host", call: func() error { return runPython("/usr/bin/python3", "-c", snippet) }})
	// Host python on the rootfs's files (chroot, nothing else): the rows below run in the rootfs,
	// whose python has no dist-packages, so none of the .pth files this host's python imports at
	// start-up (here one imports certifi: ~7 ms of CPU per start). This row is their baseline.
	rows = append(rows, row{name: "host-rootfs", call: func() error {
		return runPythonOn(func(c *exec.Cmd) error {
			c.SysProcAttr = &syscall.SysProcAttr{Chroot: rootfs}
			c.Dir = "/"
			return c.Start()
		}, "/usr/bin/python3", "-c", snippet)
	}})
	// The floor under every namespace sandbox: python started by this process in six new
	// namespaces (user with root mapped to nobody, mount, pid, network, ipc, uts) among the
	// host's files: no rootfs, cgroup, seccomp, supervisor or teardown of its own.
	nobody := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 65534, Size: 1}}
	rows = append(rows, row{name: "namespaces", call: func() error {
		return runPythonOn(func(c *exec.Cmd) error {
			c.SysProcAttr = &syscall.SysProcAttr{
				Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID |
					syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
				UidMappings: nobody, GidMappings: nobody,
			}
			return c.Start()
		}, "/usr/bin/python3", "-c", snippet)
	}})

	state := stateDir(b)
	be := newBackend(b, state)
	decl := dirDecl(rootfs)
	rows = append(rows, row{name: "airlock-library", call: func() error { return freshRunDecl(context.Background(), be, decl) }})
	// The library with a warm pool (python pre-started in each sandbox): a fresh sandbox made
	// before the call, as a daemon or a long-lived caller has them.
	pool := newPrestartPoolOf(b, be, runcode.Options{Image: spec.Image{Dir: rootfs}}, 1, runcode.Python)
	rows = append(rows, row{name: "airlock-library-pool", call: func() error { return pooledRun(be, pool, rootfs) },
		settle: func() error { return waitSettled(pool, 1) }})
	if cli := filepath.Join(binDir, "airlock"); exec.Command(cli, "run", "--help").Run() == nil {
		rows = append(rows, row{name: "airlock-cli", call: func() error {
			return runPython(cli, "run", "--pool", "0", "--state-dir", state, "--image", rootfs, "-c", snippet)
		}})
		// The CLI taking the parked sandbox an earlier run parked (the default): settle waits for the
		// filler that run started to park the next one and exit.
		terminateParked(b, be, state)
		rows = append(rows, row{name: "airlock-cli-parked", call: func() error {
			return runPython(cli, "run", "--pool", "1", "--state-dir", state, "--image", rootfs, "-c", snippet)
		}, settle: func() error { return parkedOne(state) }})
		// The same through the full CLI itself: what the lean front saves.
		full := filepath.Join(binDir, "airlock-full")
		rows = append(rows, row{name: "airlock-full-parked", call: func() error {
			return runPython(full, "run", "--pool", "1", "--state-dir", state, "--image", rootfs, "-c", snippet)
		}, settle: func() error { return parkedOne(state) }})
	} else {
		missing("airlock-cli", "the airlock CLI did not build")
	}

	if bw, err := exec.LookPath("bwrap"); err == nil {
		// The same rootfs read-only as /, every namespace (network included) unshared.
		args := []string{bw, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session",
			"--ro-bind", rootfs, "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
			"/usr/bin/python3", "-c", snippet}
		rows = append(rows, row{name: "bwrap", call: func() error { return runPython(args...) }})
	} else {
		missing("bwrap", "bwrap is not installed")
	}

	var n atomic.Int64
	for _, rt := range []string{"runc", "crun", "runsc"} {
		bin, err := exec.LookPath(rt)
		if err != nil {
			missing(rt, rt+" is not installed")
			continue
		}
		var start func(*exec.Cmd) error
		if rt == "crun" {
			start = legacyCgroupStarter(b)
		}
		// `runc spec`'s namespaces include a new network namespace: loopback only.
		bundle := ociBundle(b, rt)
		rows = append(rows, row{name: rt, call: func() error {
			id := fmt.Sprintf("airlock-bench-%s-%d-%d", rt, os.Getpid(), n.Add(1))
			args := []string{bin}
			if rt == "runsc" {
				args = append(args, "--network=none", "--root", filepath.Join(bundle, "state"))
			}
			// run (not create+start): the container is deleted when its process exits.
			return runPythonOn(start, append(args, "run", "--bundle", bundle, id)...)
		}})
	}

	docker := os.Getenv("AIRLOCK_BENCH_DOCKER_CLI")
	if docker == "" {
		docker, _ = exec.LookPath("docker")
	}
	img := os.Getenv("AIRLOCK_BENCH_DOCKER_IMAGE")
	switch {
	case docker == "":
		missing("docker", "no docker CLI")
	case img == "":
		missing("docker", "AIRLOCK_BENCH_DOCKER_IMAGE is not set (bench/run.sh loads the rootfs as an image)")
	case exec.Command(docker, "info").Run() != nil:
		missing("docker", "no docker engine answers (bench/run.sh starts one)")
	default:
		rows = append(rows, row{name: "docker", call: func() error {
			return runPython(docker, "run", "--rm", "--network", "none", img, "/usr/bin/python3", "-c", snippet)
		}})
	}
	for name := range req {
		if !slices.ContainsFunc(rows, func(r row) bool { return r.name == name }) {
			b.Fatalf("required row %q is not a row of this benchmark", name)
		}
	}
	return rows
}

// BenchmarkSideBySide is issue 3's table in one run: every iteration runs each row once, in an
// order rotated by one per iteration, so every row sees the same load and no row always runs
// right after the same other. Each row is a fresh sandbox with the same rootfs
// ($AIRLOCK_BENCH_ROOTFS) running python3 -c 'print(2+2)', removed at the end, network none.
// Reported: each row's median (ms), the medians of its per-iteration ratios to host python and
// to airlock-library, docker/airlock (the "faster than docker run"), and each row's
// mean CPU time per call (see cpuTime; not docker's), which depends much less on the load.
func BenchmarkSideBySide(b *testing.B) {
	needRoot(b)
	rows := sideBySideRows(b)
	// One call of each before b.Loop (which starts the clock): page cache, the image's first
	// use, lazily built state.
	for _, r := range rows {
		if err := r.call(); err != nil {
			b.Fatalf("%s: %v", r.name, err)
		}
		if err := r.settled(); err != nil {
			b.Fatalf("%s: %v", r.name, err)
		}
	}
	times := make([][]float64, len(rows))
	// CPU time of this process and the descendants it waited for, per row. Not reported where
	// the accounting misses the call's work: docker's shim and container are no descendants of
	// ours (and its daemons work for it), and bwrap's outer process does not wait for the
	// namespace's init that ran python (measured: less CPU per call than python alone).
	cpu := make([]time.Duration, len(rows))
	// Nor where the sandbox was made outside the call (the pool's goroutines, the filler).
	noCPU := map[string]bool{"docker": true, "bwrap": true, "airlock-library-pool": true, "airlock-cli-parked": true, "airlock-full-parked": true}
	it := 0
	for b.Loop() {
		took := make([]float64, len(rows))
		for k := range rows {
			i := (k + it) % len(rows)
			t, c := time.Now(), cpuTime()
			if err := rows[i].call(); err != nil {
				b.Fatalf("%s: %v", rows[i].name, err)
			}
			took[i] = float64(time.Since(t)) / float64(time.Millisecond)
			cpu[i] += cpuTime() - c
			if err := rows[i].settled(); err != nil {
				b.Fatalf("%s: %v", rows[i].name, err)
			}
		}
		for i := range rows {
			times[i] = append(times[i], took[i])
		}
		it++
	}
	ratioTo := func(i, j int) float64 {
		var r []float64
		for k := range times[i] {
			r = append(r, times[i][k]/times[j][k])
		}
		return medianOf(r)
	}
	idx := func(name string) int {
		return slices.IndexFunc(rows, func(r row) bool { return r.name == name })
	}
	host, lib := idx("host"), idx("airlock-library")
	var tab strings.Builder
	fmt.Fprintf(&tab, "\n| row | median ms | min ms | / host | / airlock-library | CPU ms per call |\n|---|---|---|---|---|---|\n")
	for i, r := range rows {
		b.ReportMetric(medianOf(times[i]), r.name+"-ms")
		cpuMs := "n/a"
		if !noCPU[r.name] {
			v := float64(cpu[i]) / float64(time.Millisecond) / float64(len(times[i]))
			b.ReportMetric(v, r.name+"-cpu-ms")
			cpuMs = fmt.Sprintf("%.1f", v)
		}
		fmt.Fprintf(&tab, "| %s | %.1f | %.1f | %.2f× | %.2f× | %s |\n", r.name, medianOf(times[i]), slices.Min(times[i]), ratioTo(i, host), ratioTo(i, lib), cpuMs)
	}
	b.ReportMetric(ratioTo(lib, host), "airlock/host")
	if d := idx("docker"); d >= 0 {
		b.ReportMetric(ratioTo(d, lib), "docker/airlock")
		for _, r := range []string{"airlock-library-pool", "airlock-cli", "airlock-cli-parked", "airlock-full-parked"} {
			if i := idx(r); i >= 0 {
				b.ReportMetric(ratioTo(d, i), "docker/"+r)
				fmt.Fprintf(&tab, "\ndocker / %s: %.1f×", r, ratioTo(d, i))
			}
		}
	}
	fmt.Fprintf(&tab, "\n%d iterations; load average at the end: %s", len(times[0]), loadAvg())
	report(b, tab.String())
}

// legacyCgroupStarter starts processes in a mount namespace of their own where the cgroup2
// mount at /sys/fs/cgroup/unified is gone. crun 1.8 refuses this host's hybrid layout ("cgroups
// in hybrid mode not supported, drop all controllers from cgroupv2": hugetlb is bound to no v1
// hierarchy, so cgroup2 holds it); without that mount it sees plain cgroup v1, as runc does.
// Binding hugetlb to a v1 hierarchy instead would change the host for everyone. The processes
// are forked from one locked OS thread that unshared its mount namespace (made a slave first,
// so the unmount does not propagate to the host): no wrapper process on the timed path.
func legacyCgroupStarter(b *testing.B) func(*exec.Cmd) error {
	b.Helper()
	type req struct {
		cmd  *exec.Cmd
		done chan error
	}
	reqs := make(chan req)
	ready := make(chan error, 1)
	go func() {
		// Never unlocked: the thread, in its own mount namespace, ends with this goroutine.
		runtime.LockOSThread()
		err := unix.Unshare(unix.CLONE_NEWNS)
		if err == nil {
			err = unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, "")
		}
		if err == nil {
			err = unix.Unmount("/sys/fs/cgroup/unified", unix.MNT_DETACH)
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
				err = nil // not mounted: nothing to hide
			}
		}
		ready <- err
		if err != nil {
			return
		}
		for r := range reqs {
			r.done <- r.cmd.Start()
		}
	}()
	if err := <-ready; err != nil {
		b.Fatalf("a mount namespace without the cgroup2 mount: %v", err)
	}
	b.Cleanup(func() { close(reqs) })
	return func(cmd *exec.Cmd) error {
		done := make(chan error)
		reqs <- req{cmd, done}
		return <-done
	}
}

// ociBundle is makeBundle, plus, for runsc, the removal of the network namespace file runsc
// --network=none leaves bind-mounted in its root directory (state/null-netns), without which
// the bundle cannot be removed.
func ociBundle(b *testing.B, rt string) string {
	b.Helper()
	bundle := makeBundle(b, rt)
	if rt == "runsc" {
		// Cleanups run last-registered first: before makeBundle's TempDir is removed.
		b.Cleanup(func() {
			if err := unix.Unmount(filepath.Join(bundle, "state", "null-netns"), unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				b.Errorf("unmount runsc's null-netns: %v", err)
			}
		})
	}
	return bundle
}

// report logs text and appends it, under the benchmark's name, to $AIRLOCK_BENCH_REPORT when
// set: go test keeps only the first 10 lines of a benchmark's log, and the tables are longer.
func report(b *testing.B, text string) {
	b.Helper()
	b.Log(text)
	p := os.Getenv("AIRLOCK_BENCH_REPORT")
	if p == "" {
		return
	}
	f, err := os.OpenFile(p, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		b.Error(err)
		return
	}
	defer f.Close()
	if _, err := fmt.Fprintf(f, "### %s\n%s\n\n", b.Name(), strings.TrimSpace(text)); err != nil {
		b.Error(err)
	}
}
