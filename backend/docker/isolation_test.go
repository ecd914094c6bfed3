package docker

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/moby/moby/client"

	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

func run(t *testing.T, a sandbox.Agent, shell string) (string, string, sandbox.ExecResult) {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	res, err := a.Exec(ctx, sandbox.ExecRequest{Shell: shell, Timeout: 60 * time.Second}, &out, &errb)
	if err != nil {
		t.Fatalf("exec %q: %v", shell, err)
	}
	return out.String(), errb.String(), res
}

func createAndConnect(t *testing.T, b *Backend, d spec.Sandbox) (*sandbox.Session, sandbox.Agent) {
	t.Helper()
	d.ApplyDefaults()
	ctx := context.Background()
	s, err := b.Create(ctx, d)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Terminate(context.Background(), s.ID); err != nil {
			t.Errorf("Terminate: %v", err)
		}
	})
	a, err := b.Connect(ctx, s.ID)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Cleanup(func() { a.Close() })
	return s, a
}

// TestIsolation checks, from inside a container, every confinement the backend promises.
func TestIsolation(t *testing.T) {
	requireDocker(t)
	t.Run("api", func(t *testing.T) { testIsolation(t, EngineAPI, spec.Image{Ref: testImageRef}) })
	t.Run("docker", func(t *testing.T) { testIsolation(t, EngineDocker, spec.Image{Ref: testImageRef}) })
	t.Run("podman", func(t *testing.T) {
		requirePodman(t)
		t.Setenv("CONTAINERS_CONF", podmanConf(t))
		testIsolation(t, EnginePodman, spec.Image{Tarball: rootfsTar})
	})
}

func testIsolation(t *testing.T, engine string, img spec.Image) {
	b := newTestBackend(t, engine)
	procs := int64(48)
	s, a := createAndConnect(t, b, spec.Sandbox{
		ID: "iso", Image: img,
		Limits: spec.Limits{CPU: "500m", Memory: "96Mi", Disk: "8Mi", MaxProcesses: &procs},
	})

	t.Run("EngineHoldsTheHardening", func(t *testing.T) {
		// What cannot be seen from inside on this machine (no swap; a dockerd without a bridge
		// gives even a "bridge" container only lo) is checked in the engine's own record.
		api, ok := b.eng.(*apiEngine)
		if !ok {
			t.Skip("read through the Engine API; the CLI renderings are checked by TestCLIArgsCarryEveryHardeningFlag")
		}
		cs, err := b.eng.list(context.Background(), map[string]string{labelSession: s.ID})
		if err != nil || len(cs) != 1 {
			t.Fatalf("list: %v %v", cs, err)
		}
		r, err := api.c.ContainerInspect(context.Background(), cs[0].ID, client.ContainerInspectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		hc := r.Container.HostConfig
		checks := []struct {
			what string
			ok   bool
		}{
			{"network none", hc.NetworkMode == "none"},
			{"memory", hc.Memory == 96<<20},
			{"memory-swap equal to memory", hc.MemorySwap == hc.Memory},
			{"cpus", hc.NanoCPUs == 500e6},
			{"pids limit", hc.PidsLimit != nil && *hc.PidsLimit == procs},
			{"read-only root", hc.ReadonlyRootfs},
			{"no-new-privileges", slices.Contains(hc.SecurityOpt, "no-new-privileges")},
			{"cap-drop ALL", slices.Equal(hc.CapDrop, []string{"ALL"})},
			{"auto-remove", hc.AutoRemove},
			{"not privileged", !hc.Privileged},
		}
		for _, c := range checks {
			if !c.ok {
				t.Errorf("%s: not in the engine's record %+v", c.what, hc)
			}
		}
	})
	t.Run("KillScopeIsTheCgroup", func(t *testing.T) {
		if !b.freezer {
			t.Skip("no cgroup v1 freezer on this host: the agent kills by process group")
		}
		h, err := a.Health(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if h.KillScope != "cgroup-v1" {
			t.Fatalf("kill scope %q, want cgroup-v1", h.KillScope)
		}
		// A child in its own session survives a process-group kill, not a cgroup kill.
		var out bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		res, err := a.Exec(ctx, sandbox.ExecRequest{Timeout: 2 * time.Second, Shell: `python3 -c '
import os, time
if os.fork() == 0:
    os.setsid()
    time.sleep(600)
time.sleep(600)
'`}, &out, &out)
		if err != nil || !res.TimedOut {
			t.Fatalf("exec: %+v %v", res, err)
		}
		if got, _, _ := run(t, a, "ps -e -o comm= | grep -c python3 || true"); strings.TrimSpace(got) != "0" {
			t.Errorf("%s python3 processes survived the timeout", strings.TrimSpace(got))
		}
	})
	t.Run("CodeIsUnprivileged", func(t *testing.T) {
		out, _, _ := run(t, a, "id -u; id -g; id -G; grep -E '^(CapPrm|CapEff|CapAmb|NoNewPrivs)' /proc/self/status")
		want := "1000\n1000\n1000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\n"
		if out != want {
			t.Errorf("credentials:\n%s\nwant:\n%s", out, want)
		}
	})
	t.Run("BoundingSetIsTheAgentsCaps", func(t *testing.T) {
		out, _, _ := run(t, a, "grep CapBnd /proc/self/status")
		// CHOWN 0, DAC_OVERRIDE 1, FOWNER 3, KILL 5, SETGID 6, SETUID 7.
		if want := "CapBnd:\t00000000000000eb\n"; out != want {
			t.Errorf("%q, want %q", out, want)
		}
	})
	t.Run("RootIsReadOnly", func(t *testing.T) {
		// /run and /var/tmp: podman's --read-only would mount writable tmpfs there by default.
		for _, p := range []string{"/x", "/usr/x", "/etc/x", "/.airlock/x", "/run/x", "/var/tmp/x", "/dev/x"} {
			if _, _, res := run(t, a, "touch "+p); res.ExitCode == 0 {
				t.Errorf("touch %s succeeded", p)
			}
		}
		// Even the agent (root) cannot write the root: it is mounted read-only.
		err := a.WriteFile(context.Background(), "/etc/probe", strings.NewReader("x"), 0o644)
		if err == nil {
			t.Error("the files API wrote /etc/probe")
		}
	})
	t.Run("NoNetwork", func(t *testing.T) {
		out, _, _ := run(t, a, "ls /sys/class/net")
		if strings.Fields(out)[0] != "lo" || len(strings.Fields(out)) != 1 {
			t.Errorf("interfaces: %q, want only lo", out)
		}
	})
	t.Run("DiskLimitSpansWorkdirAndTmp", func(t *testing.T) {
		// 8Mi in all: 5Mi in the workdir, then 5Mi in /tmp must not fit.
		if _, errs, res := run(t, a, "head -c 5242880 /dev/zero > big"); res.ExitCode != 0 {
			t.Fatalf("5Mi in the workdir: %+v %s", res, errs)
		}
		_, errs, res := run(t, a, "head -c 5242880 /dev/zero > /tmp/big")
		if res.ExitCode == 0 || !strings.Contains(errs, "No space left") {
			t.Errorf("5Mi more in /tmp: %+v %q, want ENOSPC", res, errs)
		}
		run(t, a, "rm -f big /tmp/big")
	})
	t.Run("MemoryLimit", func(t *testing.T) {
		_, _, res := run(t, a, "exec python3 -c 'b = bytearray(400 << 20); print(len(b))'")
		if res.ExitCode == 0 {
			t.Errorf("400Mi allocated under a 96Mi limit: %+v", res)
		}
		if b.freezer && !res.OOMKilled {
			t.Errorf("result %+v: the agent reads the container's memory cgroup, want oomKilled", res)
		}
		if out, _, _ := run(t, a, "echo alive"); out != "alive\n" {
			t.Errorf("the agent did not survive the code's OOM: %q", out)
		}
	})
	t.Run("CPULimit", func(t *testing.T) {
		out, _, _ := run(t, a, "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us")
		f := strings.Fields(out)
		if len(f) != 2 {
			t.Fatalf("cfs files: %q", out)
		}
		q, _ := strconv.Atoi(f[0])
		p, _ := strconv.Atoi(f[1])
		if p == 0 || q*1000/p != 500 {
			t.Errorf("quota/period = %s/%s, want 500m", f[0], f[1])
		}
	})
	t.Run("PidsLimit", func(t *testing.T) {
		// python, because dash gives up on the first failed fork.
		out, errs, res := run(t, a, `python3 -c '
import os, time
n = 0
for i in range(80):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    n += 1
rd = lambda f: open("/sys/fs/cgroup/pids/" + f).read().split()[-1]
print(n, rd("pids.max"), rd("pids.current"), flush=True)
os.killpg(0, 9)
'`)
		f := strings.Fields(out)
		if len(f) != 3 {
			t.Fatalf("fork count and pids cgroup: %q %q %+v", out, errs, res)
		}
		forked, _ := strconv.Atoi(f[0])
		cur, _ := strconv.Atoi(f[2])
		if forked >= 80 || f[1] != strconv.FormatInt(procs, 10) || cur > int(procs) {
			t.Errorf("forked %d of 80, pids max %s, current %s: want forks refused at the limit %d", forked, f[1], f[2], procs)
		}
	})
	t.Run("AgentSocketAndConfigUnreachable", func(t *testing.T) {
		for _, c := range []string{"ls /.airlock/run", "cat /.airlock/agent.json"} {
			if _, _, res := run(t, a, c); res.ExitCode == 0 {
				t.Errorf("%s succeeded as the code's uid", c)
			}
		}
	})
	t.Run("FilesAPIDeniesEngineFiles", func(t *testing.T) {
		ctx := context.Background()
		for _, p := range []string{"/etc/hosts", "/etc/resolv.conf", "/etc/hostname", "/.airlock/agent.json", "/proc/1/environ"} {
			if err := a.WriteFile(ctx, p, strings.NewReader("x"), 0o644); err == nil {
				t.Errorf("files API wrote %s", p)
			}
		}
		// Refused outright, not merely read-only: podman's may be writable.
		for _, p := range []string{"/.airlock/agent.json", "/etc/hosts", "/etc/resolv.conf"} {
			if _, err := a.ReadFile(ctx, p, 0, -1); !errors.Is(err, sandbox.ErrForbidden) {
				t.Errorf("files API read of %s: %v, want ErrForbidden", p, err)
			}
		}
	})
	t.Run("TerminateLeavesNothing", func(t *testing.T) {
		ctx := context.Background()
		if err := b.Terminate(ctx, s.ID); err != nil {
			t.Fatal(err)
		}
		if mi, err := os.ReadFile("/proc/self/mountinfo"); err != nil || strings.Contains(string(mi), s.ID) {
			t.Errorf("a host mount naming %s remains (%v)", s.ID, err)
		}
		for _, p := range []string{filepath.Join(b.opts.StateDir, s.ID), filepath.Join(b.freezerParent(), s.ID)} {
			if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s remains: %v", p, err)
			}
		}
		if cs, err := b.eng.list(ctx, map[string]string{labelSession: s.ID}); err != nil || len(cs) != 0 {
			t.Errorf("containers remain: %v %v", cs, err)
		}
	})
}

// TestDeadContainerIsReconciled: a container that disappears without Terminate (its agent died,
// or someone removed it) is not found, and the next New removes what the session left on the host.
func TestDeadContainerIsReconciled(t *testing.T) {
	requireDocker(t)
	b := newTestBackend(t, EngineAPI)
	d := spec.Sandbox{ID: "dead", Image: spec.Image{Ref: testImageRef}}
	d.ApplyDefaults()
	ctx := context.Background()
	s, err := b.Create(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := b.eng.list(ctx, map[string]string{labelSession: s.ID})
	if err != nil || len(cs) != 1 {
		t.Fatalf("list: %v %v", cs, err)
	}
	if err := b.eng.remove(ctx, cs[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Get(ctx, s.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("Get of a removed container: %v, want ErrNotFound", err)
	}
	if _, err := b.Connect(ctx, s.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("Connect to a removed container: %v, want ErrNotFound", err)
	}
	dir := filepath.Join(b.opts.StateDir, s.ID)
	if mounted, _ := isMountPoint(filepath.Join(dir, rwDir)); !mounted {
		t.Fatal("the scratch tmpfs is not mounted before reconcile; the test proves nothing")
	}
	b2, err := New(ctx, Options{StateDir: b.opts.StateDir, AgentPath: agentBin, Engine: EngineAPI, Host: dockerHost})
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("New left the dead session's dir: %v", err)
	}
	if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), s.ID) {
		t.Errorf("New left the dead session's tmpfs mounted")
	}
	// Terminate of the (already gone) session is still a success.
	if err := b.Terminate(ctx, s.ID); err != nil {
		t.Errorf("Terminate of a reconciled session: %v", err)
	}
}

// TestImageSources: an OCI layout is loaded and runs; an image that declares a VOLUME is refused
// (the engine would give it writable storage outside the disk limit).
func TestImageSources(t *testing.T) {
	requireDocker(t)
	base, err := tarball.ImageFromPath(rootfsTar, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	lp, err := layout.Write(filepath.Join(dir, "layout"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(base); err != nil {
		t.Fatal(err)
	}
	b := newTestBackend(t, EngineAPI)
	_, a := createAndConnect(t, b, spec.Sandbox{ID: "layout", Image: spec.Image{OCILayout: filepath.Join(dir, "layout")}})
	if out, _, _ := run(t, a, "echo from-layout"); out != "from-layout\n" {
		t.Errorf("exec in an OCI layout image: %q", out)
	}

	cf, err := base.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cfg := cf.Config
	cfg.Volumes = map[string]struct{}{"/data": {}}
	withVol, err := mutate.Config(base, cfg)
	if err != nil {
		t.Fatal(err)
	}
	volTar := filepath.Join(dir, "vol.tar")
	if err := tarball.WriteToFile(volTar, name.MustParseReference("airlock.local/test:volume"), withVol); err != nil {
		t.Fatal(err)
	}
	d := spec.Sandbox{ID: "vol", Image: spec.Image{Tarball: volTar}}
	d.ApplyDefaults()
	_, err = b.Create(context.Background(), d)
	if !errors.Is(err, sandbox.ErrUnsupported) || !strings.Contains(err.Error(), "VOLUME /data") {
		t.Errorf("Create with a VOLUME image: %v, want ErrUnsupported naming VOLUME /data", err)
	}
}

// TestPrivateDockerdFlags: the dockerd hack/dockerd.sh started runs with the flags that leave
// host networking alone, and nothing it did added a bridge.
func TestPrivateDockerdFlags(t *testing.T) {
	requireDocker(t)
	pid, err := os.ReadFile(filepath.Join(cacheDir(), "docker.pid"))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile("/proc/" + strings.TrimSpace(string(pid)) + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
	for _, want := range []string{"--iptables=false", "--ip6tables=false", "--ip-forward=false", "--ip-masq=false", "--bridge=none"} {
		if !slices.Contains(args, want) {
			t.Errorf("dockerd %q lacks %s", args, want)
		}
	}
	for _, flag := range []string{"--data-root", "--exec-root", "-H", "--pidfile"} {
		i := slices.Index(args, flag)
		if i < 0 || i+1 >= len(args) || !strings.Contains(args[i+1], cacheDir()) {
			t.Errorf("dockerd %q: %s is not inside %s", args, flag, cacheDir())
		}
	}
	if _, err := os.Stat("/sys/class/net/docker0"); err == nil {
		t.Error("a docker0 bridge exists on the host")
	}
}

// TestCreateFailureLeavesNothing: an agent that exits at once fails Create with ErrUnreachable,
// and the attempt's container, directory, mount and cgroup are all gone.
func TestCreateFailureLeavesNothing(t *testing.T) {
	requireDocker(t)
	dir := testStateDir(t)
	ctx := context.Background()
	// "bogus serve --config ...": the agent refuses an unknown command and exits 2.
	b, err := New(ctx, Options{StateDir: dir, AgentPath: agentBin, AgentArgs: []string{"bogus"}, Engine: EngineAPI, Host: dockerHost})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	defer os.Remove(b.freezerParent())
	d := spec.Sandbox{ID: "broken", Image: spec.Image{Ref: testImageRef}}
	d.ApplyDefaults()
	_, err = b.Create(ctx, d)
	if !errors.Is(err, sandbox.ErrUnreachable) {
		t.Fatalf("Create with an agent that exits: %v, want ErrUnreachable", err)
	}
	t.Logf("Create: %v", err)
	if !strings.Contains(err.Error(), `unknown command "bogus"`) {
		t.Errorf("the error does not carry what the agent printed: %v", err)
	}
	if cs, err := b.eng.list(ctx, map[string]string{labelState: b.tag}); err != nil || len(cs) != 0 {
		t.Errorf("containers left: %v %v", cs, err)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.IsDir() {
			t.Errorf("session dir %s left", e.Name())
		}
	}
	if cgs, _ := os.ReadDir(b.freezerParent()); len(cgs) > 0 {
		for _, e := range cgs {
			if e.IsDir() {
				t.Errorf("freezer cgroup %s left", e.Name())
			}
		}
	}
	if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), dir) {
		t.Errorf("a mount under %s is left", dir)
	}
}
