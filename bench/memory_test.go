package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// idleSandboxes is how many idle sandboxes of each runtime BenchmarkIdleMemorySideBySide keeps
// at once (gVisor's are ~100 MiB each).
const idleSandboxes = 10

// procTable is one scan of /proc: every process's parent and command line.
type procTable struct {
	ppid    map[int]int
	cmdline map[int]string
}

func scanProcs() procTable {
	t := procTable{ppid: map[int]int{}, cmdline: map[int]string{}}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		rest := string(stat[strings.LastIndexByte(string(stat), ')')+1:])
		f := strings.Fields(rest)
		if len(f) < 2 {
			continue
		}
		t.ppid[pid], _ = strconv.Atoi(f[1])
		cl, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		t.cmdline[pid] = strings.ReplaceAll(string(cl), "\x00", " ")
	}
	return t
}

// withDescendants is roots and every process below them.
func (t procTable) withDescendants(roots []int) []int {
	in := map[int]bool{}
	for _, r := range roots {
		if _, ok := t.ppid[r]; ok {
			in[r] = true
		}
	}
	for grew := true; grew; {
		grew = false
		for pid, pp := range t.ppid {
			if in[pp] && !in[pid] {
				in[pid], grew = true, true
			}
		}
	}
	out := make([]int, 0, len(in))
	for pid := range in {
		out = append(out, pid)
	}
	return out
}

// matching is every process whose command line contains all of subs.
func (t procTable) matching(subs ...string) []int {
	var out []int
	for pid, cl := range t.cmdline {
		ok := true
		for _, s := range subs {
			ok = ok && strings.Contains(cl, s)
		}
		if ok {
			out = append(out, pid)
		}
	}
	return out
}

// pssOf sums the proportional set size of pids (a process that exited meanwhile counts 0).
func pssOf(pids []int) int64 {
	var total int64
	for _, pid := range pids {
		rollup, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(rollup), "\n") {
			if rest, ok := strings.CutPrefix(line, "Pss:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
				total += kb << 10
			}
		}
	}
	return total
}

// idleRuntime starts idle sandboxes of one runtime and finds the host processes they cost.
type idleRuntime struct {
	name string
	// start starts one idle sandbox (its process: sleep) and returns a handle for stop.
	start func() (string, error)
	// procs lists, given the handles, the host processes that exist for those sandboxes.
	procs func(t procTable, handles []string) []int
	stop  func(handle string)
}

// BenchmarkIdleMemorySideBySide is issue 3's idle host memory per sandbox, next to the other
// runtimes: idleSandboxes idle sandboxes of each runtime at once (the same rootfs; the sandbox's
// process is `sleep`, airlock's is its agent, waiting), then the PSS of every host process that
// exists for them (the runtime's per-sandbox processes: bwrap's, the container's, gVisor's
// sentry and gofer, docker's shim), divided by their number. Kernel memory (namespaces, page
// tables, cgroups) is in no row; the daemons docker needs whether or not a container runs
// (dockerd, containerd) are reported on their own. airlock's fuller figure (its memory cgroup's
// charge, kernel memory included) is BenchmarkIdleMemory's.
func BenchmarkIdleMemorySideBySide(b *testing.B) {
	needRoot(b)
	if bundleRoot == "" {
		b.Skip("set AIRLOCK_BENCH_ROOTFS to a rootfs (bench/run.sh does)")
	}
	req := requiredRows()
	var rts []idleRuntime

	be := newBackend(b, stateDir(b))
	ctx := context.Background()
	rts = append(rts, idleRuntime{
		name: "airlock",
		start: func() (string, error) {
			s, err := be.Create(ctx, dirDecl(bundleRoot))
			if err != nil {
				return "", err
			}
			return s.ID, nil
		},
		procs: func(t procTable, ids []string) []int {
			var pids []int
			for _, id := range ids {
				m, _ := filepath.Glob("/sys/fs/cgroup/memory/*/" + id + "/cgroup.procs")
				for _, f := range m {
					raw, _ := os.ReadFile(f)
					for _, s := range strings.Fields(string(raw)) {
						p, _ := strconv.Atoi(s)
						pids = append(pids, p)
					}
				}
			}
			return t.withDescendants(pids)
		},
		stop: func(id string) { be.Terminate(context.WithoutCancel(ctx), id) },
	})

	if bw, err := exec.LookPath("bwrap"); err == nil {
		cmds := map[string]*exec.Cmd{}
		rts = append(rts, idleRuntime{
			name: "bwrap",
			start: func() (string, error) {
				cmd := exec.Command(bw, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session",
					"--ro-bind", bundleRoot, "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
					"/usr/bin/sleep", "3600")
				if err := cmd.Start(); err != nil {
					return "", err
				}
				h := strconv.Itoa(cmd.Process.Pid)
				cmds[h] = cmd
				return h, nil
			},
			procs: func(t procTable, hs []string) []int { return t.withDescendants(atois(hs)) },
			stop: func(h string) {
				cmds[h].Process.Kill()
				cmds[h].Wait()
			},
		})
	} else if req["bwrap"] {
		b.Fatal("bwrap is required but not installed")
	}

	var n atomic.Int64
	for _, rt := range []string{"runc", "crun", "runsc"} {
		bin, err := exec.LookPath(rt)
		if err != nil {
			if req[rt] {
				b.Fatalf("%s is required but not installed", rt)
			}
			continue
		}
		var start func(*exec.Cmd) error
		if rt == "crun" {
			start = legacyCgroupStarter(b)
		}
		bundle := ociBundle(b, rt)
		setArgs(b, bundle, "/usr/bin/sleep", "3600")
		global := []string{bin}
		if rt == "runsc" {
			global = append(global, "--network=none", "--root", filepath.Join(bundle, "state"))
		}
		runIt := func(args ...string) error {
			cmd := exec.Command(global[0], append(global[1:], args...)...)
			out := &strings.Builder{}
			cmd.Stdout, cmd.Stderr = out, out
			var err error
			if start != nil {
				if err = start(cmd); err == nil {
					err = cmd.Wait()
				}
			} else {
				err = cmd.Run()
			}
			if err != nil {
				return fmt.Errorf("%s %v: %v: %s", rt, args, err, out)
			}
			return nil
		}
		rts = append(rts, idleRuntime{
			name: rt,
			start: func() (string, error) {
				id := fmt.Sprintf("airlock-idle-%s-%d-%d", rt, os.Getpid(), n.Add(1))
				detach := "-d"
				if rt == "runsc" {
					detach = "-detach"
				}
				// Detached: the container's stdio is /dev/null (exec.Cmd's default for a nil
				// writer would be a pipe the detached container keeps open).
				cmd := exec.Command(global[0], append(global[1:], "run", detach, "--bundle", bundle, id)...)
				var err error
				if start != nil {
					if err = start(cmd); err == nil {
						err = cmd.Wait()
					}
				} else {
					err = cmd.Run()
				}
				if err != nil {
					return "", fmt.Errorf("%s run %s: %w", rt, id, err)
				}
				return id, nil
			},
			procs: func(t procTable, ids []string) []int {
				if rt == "runsc" {
					// The sentry and the gofer name the bundle; the `runsc run` that started
					// them has exited.
					return t.withDescendants(t.matching(bundle))
				}
				var pids []int
				for _, id := range ids {
					out, err := exec.Command(global[0], append(global[1:], "state", id)...).Output()
					if err != nil {
						continue
					}
					var st struct {
						Pid int `json:"pid"`
					}
					if json.Unmarshal(out, &st) == nil && st.Pid > 0 {
						pids = append(pids, st.Pid)
					}
				}
				return t.withDescendants(pids)
			},
			stop: func(id string) {
				_ = runIt("delete", "--force", id)
			},
		})
	}

	docker := os.Getenv("AIRLOCK_BENCH_DOCKER_CLI")
	if docker == "" {
		docker, _ = exec.LookPath("docker")
	}
	img := os.Getenv("AIRLOCK_BENCH_DOCKER_IMAGE")
	if docker != "" && img != "" && exec.Command(docker, "info").Run() == nil {
		rts = append(rts, idleRuntime{
			name: "docker",
			start: func() (string, error) {
				out, err := exec.Command(docker, "run", "-d", "--rm", "--network", "none", img, "/usr/bin/sleep", "3600").Output()
				if err != nil {
					return "", fmt.Errorf("docker run -d: %w", err)
				}
				return strings.TrimSpace(string(out)), nil
			},
			procs: func(t procTable, ids []string) []int {
				var shims []int
				for _, id := range ids {
					shims = append(shims, t.matching("containerd-shim", id)...)
				}
				return t.withDescendants(shims)
			},
			stop: func(id string) { exec.Command(docker, "rm", "-f", id).Run() },
		})
	} else if req["docker"] {
		b.Fatal("docker is required but no engine answers with AIRLOCK_BENCH_DOCKER_IMAGE set")
	}

	var tab strings.Builder
	fmt.Fprintf(&tab, "\n| runtime | idle sandboxes | host processes per sandbox | PSS MiB per sandbox |\n|---|---|---|---|\n")
	measured := false
	for b.Loop() {
		if measured {
			continue
		}
		measured = true
		for _, rt := range rts {
			var hs []string
			stopAll := func() {
				for _, h := range hs {
					rt.stop(h)
				}
			}
			for range idleSandboxes {
				h, err := rt.start()
				if err != nil {
					stopAll()
					b.Fatalf("%s: %v", rt.name, err)
				}
				hs = append(hs, h)
			}
			time.Sleep(2 * time.Second) // start-up garbage settles; a reading, not a timing
			pids := rt.procs(scanProcs(), hs)
			pss := pssOf(pids)
			stopAll()
			if len(pids) < idleSandboxes {
				b.Fatalf("%s: found %d host processes for %d sandboxes", rt.name, len(pids), idleSandboxes)
			}
			mib := float64(pss) / idleSandboxes / (1 << 20)
			b.ReportMetric(mib, rt.name+"-pss-MiB/sandbox")
			fmt.Fprintf(&tab, "| %s | %d | %.1f | %.2f |\n", rt.name, idleSandboxes, float64(len(pids))/idleSandboxes, mib)
		}
		if sock, ok := strings.CutPrefix(os.Getenv("DOCKER_HOST"), "unix://"); ok && img != "" {
			// bench/run.sh's engine: dockerd and the containerd it started both name its
			// directory (data and exec roots) on their command lines.
			daemons := scanProcs().matching(filepath.Dir(sock))
			fmt.Fprintf(&tab, "\ndocker's daemons (%d processes: dockerd and its containerd), with no container running: %.1f MiB PSS\n",
				len(daemons), float64(pssOf(daemons))/(1<<20))
		}
	}
	report(b, tab.String())
}

func atois(ss []string) []int {
	out := make([]int, 0, len(ss))
	for _, s := range ss {
		n, _ := strconv.Atoi(s)
		out = append(out, n)
	}
	return out
}

// setArgs rewrites the process args of the bundle's config.json.
func setArgs(b *testing.B, bundle string, args ...string) {
	b.Helper()
	p := filepath.Join(bundle, "config.json")
	raw, err := os.ReadFile(p)
	if err != nil {
		b.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		b.Fatal(err)
	}
	cfg["process"].(map[string]any)["args"] = args
	out, err := json.Marshal(cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(p, out, 0o644); err != nil {
		b.Fatal(err)
	}
}
