package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/backend/docker"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/client"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/platform"
)

// dockerdDir is where hack/dockerd.sh keeps the private engine the docker tests share.
func dockerdDir() string {
	if d := os.Getenv("AIRLOCK_DOCKER_DIR"); d != "" {
		return d
	}
	return "/var/cache/airlock-docker"
}

// privateDockerd starts (or finds) the private dockerd with hack/dockerd.sh, which also builds
// the test image (hack/mkrootfs.sh: python3 and its stdlib) as a docker-archive. It returns the
// engine's DOCKER_HOST and that archive, which the tests give as --image: loaded through the
// CLI, the same way on docker and on podman (no registry here). The engine is stopped at the
// end only if this call started it.
func privateDockerd(t *testing.T) (host, tarball string) {
	t.Helper()
	script, err := filepath.Abs("../../hack/dockerd.sh")
	if err != nil {
		t.Fatal(err)
	}
	dir := dockerdDir()
	// Asked before test-image starts it: an engine this call starts is this call's to stop.
	wasRunning := dockerdAlive(dir)
	cmd := exec.Command(script, "test-image", "--dir", dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if !wasRunning {
		t.Cleanup(func() {
			if out, err := exec.Command(script, "stop", "--dir", dir).CombinedOutput(); err != nil {
				t.Errorf("stop dockerd: %v\n%s", err, out)
			}
		})
	}
	if err != nil {
		t.Fatalf("%s test-image: %v\n%s", script, err, stderr.String())
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if h, ok := strings.CutPrefix(sc.Text(), "DOCKER_HOST="); ok {
			host = h
		}
	}
	if host == "" {
		t.Fatalf("%s printed no DOCKER_HOST:\n%s", script, out)
	}
	return host, filepath.Join(dir, "rootfs.tar")
}

// dockerdAlive reports whether the pidfile in dir names a live dockerd.
func dockerdAlive(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "docker.pid"))
	if err != nil {
		return false
	}
	comm, err := os.ReadFile("/proc/" + strings.TrimSpace(string(b)) + "/comm")
	return err == nil && strings.TrimSpace(string(comm)) == "dockerd"
}

// havePodman installs podman from Debian's packages when it is missing, as the docker backend's
// tests do, so that CI runs the podman cases too.
func havePodman(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("podman"); err == nil {
		return
	}
	cmd := exec.Command("apt-get", "install", "-y", "-o", "DPkg::Lock::Timeout=600", "--no-install-recommends", "podman", "runc")
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("apt-get install podman: %v\n%s", err, out)
	}
}

// podmanConf writes the containers.conf podman 4.3 needs on this kind of machine, as the docker
// backend's tests do: default_ulimits a root without CAP_SYS_RESOURCE may set, and runc (crun
// 1.8 refuses the hybrid cgroup v1 layout).
func podmanConf(t *testing.T) string {
	t.Helper()
	var nofile unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &nofile); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf("[containers]\ndefault_ulimits = [\"nofile=%d:%d\", \"nproc=32768:32768\"]\n\n[engine]\nruntime = \"runc\"\n", nofile.Max, nofile.Max)
	p := filepath.Join(t.TempDir(), "containers.conf")
	if err := os.WriteFile(p, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// dockerStateDir is a short state dir for the docker backend; when the test ends no container
// of it may be left.
func dockerStateDir(t *testing.T, engine, host string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ad")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		defer os.RemoveAll(dir)
		b, err := docker.New(context.Background(), docker.Options{StateDir: dir, Engine: engine, Host: host})
		if err != nil {
			t.Errorf("checking for containers left behind: %v", err)
			return
		}
		defer b.Close()
		list, _ := b.List(context.Background())
		for _, s := range list {
			t.Errorf("container of sandbox %s (%s) outlived its command", s.ID, s.SandboxID)
			_ = b.Terminate(context.Background(), s.ID)
		}
	})
	return dir
}

// writeConfigFile writes an airlock config file and returns its path.
func writeConfigFile(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPlatformDocker runs airlock run and airlock mcp on docker, as users would: the private
// dockerd chosen by --platform, then podman chosen by the config file.
func TestPlatformDocker(t *testing.T) {
	testutil.RequireRoot(t)
	bin := buildCLI(t, true)
	agent := newAgent(t)
	host, tarball := privateDockerd(t)
	havePodman(t)
	t.Setenv(envServer, "")
	for _, tc := range []struct {
		name   string
		engine string // docker.Options' Engine
		args   []string
		env    func(t *testing.T) []string
	}{
		{name: "docker engine by flag", engine: docker.EngineAPI, args: []string{"--platform", "docker"},
			env: func(t *testing.T) []string {
				return []string{"DOCKER_HOST=" + host, platform.EnvConfig + "=" + writeConfigFile(t, "")}
			}},
		{name: "podman by config file", engine: docker.EnginePodman,
			env: func(t *testing.T) []string {
				return []string{platform.EnvConfig + "=" + writeConfigFile(t, "platform: docker\ndocker:\n  engine: podman\n"), "CONTAINERS_CONF=" + podmanConf(t)}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			engineHost := ""
			if tc.engine == docker.EngineAPI {
				engineHost = host
			}
			sd := dockerStateDir(t, tc.engine, engineHost)
			env := append(tc.env(t), "AIRLOCK_AGENT="+agent, platform.EnvPlatform+"=")
			args := append([]string{"run", "--state-dir", sd, "--image", tarball, "-c", "print(2+2)"}, tc.args...)
			code, out, errs := runBin(t, env, bin, args...)
			if code != 0 || out != "4\n" {
				t.Errorf("airlock %q: exit %d, stdout %q, stderr %q", args, code, out, errs)
			}
			if strings.Contains(errs, "local runtime") {
				t.Errorf("an explicit platform is not auto's choice, yet stderr says %q", errs)
			}
			// The host image is the local runtime's: its default is refused, naming what to give.
			code, _, errs = runBin(t, env, bin, append([]string{"run", "--state-dir", sd, "-c", "1"}, tc.args...)...)
			if code != 2 || !strings.Contains(errs, "--image: the default image, host, is the local runtime's") || !strings.Contains(errs, "docker has no imageHost") {
				t.Errorf("run without --image: exit %d, %q", code, errs)
			}
			// Asked for, it is refused by the capability, by name.
			code, _, errs = runBin(t, env, bin, append([]string{"run", "--state-dir", sd, "--image", "host", "-c", "1"}, tc.args...)...)
			if code != exitRunFailed || !strings.Contains(errs, `image "host"`) || !strings.Contains(errs, "(needs imageHost)") {
				t.Errorf("run --image host: exit %d, %q", code, errs)
			}
			// Spares are the local runtime's: asked for on docker, they are refused.
			code, _, errs = runBin(t, env, bin, append([]string{"run", "--state-dir", sd, "--image", tarball, "--spares", "1", "-c", "1"}, tc.args...)...)
			if code != 2 || !strings.Contains(errs, "--spares: spares are the local runtime's; the platform is docker") {
				t.Errorf("run --spares 1: exit %d, %q", code, errs)
			}
			// plan and capabilities read the set of the engine run uses.
			code, out, errs = runBin(t, env, bin, append([]string{"capabilities"}, tc.args...)...)
			if code != 0 || !strings.HasPrefix(out, "docker capabilities (docker engine: ") {
				t.Errorf("capabilities: exit %d, %q %q", code, out, errs)
			}

			mcpArgs := append([]string{"mcp", "--state-dir", sd, "--image", tarball}, tc.args...)
			cs, logs := connectMCP(t, bin, env, mcpArgs...)
			wantRunCode42(t, cs, logs)
			closeMCP(t, cs, logs)

			// The warm pool is the local runtime's: an explicit --pool is refused.
			code, _, errs = runBin(t, env, bin, append(mcpArgs, "--pool", "2")...)
			if code != 2 || !strings.Contains(errs, "--pool: the warm pool is the local runtime's; the platform is docker") {
				t.Errorf("mcp --pool 2: exit %d, %q", code, errs)
			}

			// The daemon on docker: its health, its set, and airlock sandbox say so.
			dir := t.TempDir()
			sock := filepath.Join(dir, "a.sock")
			c := startServeBin(t, bin, env, logs, append([]string{"serve", "--socket", sock, "--signing-key", filepath.Join(dir, "k"), "--state-dir", sd, "--log-level", "warn"}, tc.args...)...)
			h, err := c.Health(t.Context())
			if err != nil || h.Platform != capability.Docker {
				t.Errorf("GET /healthz: %+v, %v; want platform docker", h, err)
			}
			code, out, errs = runBin(t, append(env, client.EnvSocket+"="+sock, client.EnvURL+"=", client.EnvToken+"=", client.EnvAPIKey+"="), bin, "sandbox", "capabilities")
			if code != 0 || !strings.HasPrefix(out, "docker capabilities (the daemon's)\n") {
				t.Errorf("sandbox capabilities: exit %d, %q %q", code, out, errs)
			}
		})
	}
}

// newAgent builds the static agent the docker backend bind-mounts into its containers.
func newAgent(t *testing.T) string {
	t.Helper()
	env := newRuntimeEnv(t)
	return env.agent
}

func closeMCP(t *testing.T, cs *sdk.ClientSession, logs *testutil.SyncBuffer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- cs.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("airlock mcp after its client closed: %v\n%s", err, logs.String())
		}
	case <-ctx.Done():
		t.Errorf("airlock mcp did not stop when its client closed\n%s", logs.String())
	}
}

// TestAutoFallsBackToDocker: on a host where the local runtime is refused (here: no cgroup
// hierarchy, hidden in a mount namespace of the command's own), airlock run with no platform
// setting runs on the docker engine and says so on stderr, once.
func TestAutoFallsBackToDocker(t *testing.T) {
	testutil.RequireRoot(t)
	bin := buildCLI(t, false)
	agent := newAgent(t)
	host, tarball := privateDockerd(t)
	// The docker backend mounts each sandbox's scratch tmpfs in its state dir, which the engine
	// (outside the command's mount namespace) must see: the state dir is a shared mount, so
	// those mounts propagate back.
	sd := dockerStateDir(t, docker.EngineAPI, host)
	if err := unix.Mount(sd, sd, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(sd, unix.MNT_DETACH) })
	if err := unix.Mount("", sd, "", unix.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	// The config file puts capabilities' docker backend in the test's state dir too.
	env := []string{"DOCKER_HOST=" + host, "AIRLOCK_AGENT=" + agent, platform.EnvPlatform + "=",
		platform.EnvConfig + "=" + writeConfigFile(t, "docker:\n  stateDir: "+sd+"\n"), "AIRLOCK_SPARES=0"}
	noCgroups := func(args ...string) (int, string, string) {
		return runBin(t, env, "unshare", append([]string{"--mount", "--propagation", "unchanged", "sh", "-c",
			`mount -t tmpfs none /sys/fs/cgroup && exec "$0" "$@"`, bin}, args...)...)
	}
	code, out, errs := noCgroups("run", "--state-dir", sd, "--image", tarball, "-c", "print(2+2)")
	if code != 0 || out != "4\n" {
		t.Fatalf("airlock run without cgroups: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	const notice = "airlock: the local runtime cannot run here (unsupported: "
	if strings.Count(errs, notice) != 1 || !strings.Contains(errs, "cgroup") || !strings.Contains(errs, "; using docker (Docker Engine API at "+host+")\n") || strings.Count(errs, "\n") != 1 {
		t.Errorf("stderr %q: want one line saying the local runtime was passed over, why, and the engine used", errs)
	}
	// capabilities without a platform says what auto chooses there, and why.
	code, out, _ = noCgroups("capabilities")
	if code != 0 || !strings.HasPrefix(out, "platform: docker (auto: the local runtime cannot run here (unsupported: ") || !strings.Contains(out, "docker can (Docker Engine API at "+host+")") {
		t.Errorf("capabilities: exit %d, %q", code, out)
	}
	// Where the local runtime runs, auto takes it, silently.
	code, out, errs = runBin(t, env, bin, "capabilities")
	if code != 0 || !strings.HasPrefix(out, "platform: local (auto: the local runtime can run on this host)\nlocal capabilities (this host's local runtime)\n") || errs != "" {
		t.Errorf("capabilities here: exit %d, %q %q", code, out, errs)
	}
}

// nobody is the unprivileged user the tests run the CLI as: no subordinate ids, no groups.
const nobody = 65534

// asNobody copies bin into a directory nobody can reach and returns that copy, nobody's home
// (owned by it) and the credentials to run as it.
func asNobody(t *testing.T, bin string) (userBin, home string, cred *syscall.SysProcAttr) {
	t.Helper()
	dir, err := os.MkdirTemp("", "au")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	userBin = filepath.Join(dir, filepath.Base(bin))
	copyFile(t, bin, userBin)
	home = filepath.Join(dir, "home")
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	return userBin, home, &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
}

// TestAutoAsUnprivilegedUser: a user the local runtime refuses (no subordinate ids) and who
// reaches no rootful engine gets one error naming both reasons and what to do.
func TestAutoAsUnprivilegedUser(t *testing.T) {
	testutil.RequireRoot(t)
	userBin, home, cred := asNobody(t, buildCLI(t, false))
	cmd := exec.Command(userBin, "run", "--state-dir", filepath.Join(home, "state"), "-c", "print(1)")
	cfg := filepath.Join(home, "config.yaml")
	if err := os.WriteFile(cfg, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// No engine's socket is reachable: DOCKER_HOST names none, and nobody may not use the
	// host's (a podman on PATH is rootless for nobody, and passed over).
	cmd.Env = []string{"HOME=" + home, "PATH=/usr/bin:/bin", platform.EnvConfig + "=" + cfg, "AIRLOCK_SPARES=0",
		"DOCKER_HOST=unix://" + filepath.Join(home, "no-engine.sock")}
	cmd.SysProcAttr = cred
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	_ = cmd.Run()
	errs := errb.String()
	if cmd.ProcessState.ExitCode() != exitRunFailed || out.Len() != 0 {
		t.Errorf("exit %d, stdout %q: want %d and nothing", cmd.ProcessState.ExitCode(), out.String(), exitRunFailed)
	}
	for _, want := range []string{"no platform can run sandboxes here (auto)", "local: unsupported: not root", "docs/rootless.md",
		"docker: unsupported: no container engine found", "no-engine.sock (no such socket)", "--platform kubernetes"} {
		if !strings.Contains(errs, want) {
			t.Errorf("stderr does not say %q:\n%s", want, errs)
		}
	}
	// capabilities (and plan) still answer there: this host's probe, and why nothing runs.
	caps := exec.Command(userBin, "capabilities")
	caps.Env, caps.SysProcAttr = append(cmd.Env, "XDG_RUNTIME_DIR="+home), cred
	got, err := caps.Output()
	if err != nil || !strings.HasPrefix(string(got), "platform: local (auto: nothing can run sandboxes here)\nlocal capabilities (probed from this host; nothing can run sandboxes here: local: unsupported: not root") ||
		!strings.Contains(string(got), "; docker: unsupported: no container engine found") {
		t.Errorf("capabilities as an unprivileged user: %v\n%s", err, got)
	}
}

// TestAutoPicksDockerAsUnprivilegedUser: a user the local runtime refuses (no subordinate ids)
// who may use a rootful engine's socket gets it from auto: airlock run says so on stderr once
// and runs the code there; what that user's docker backend cannot hold is in its set.
func TestAutoPicksDockerAsUnprivilegedUser(t *testing.T) {
	testutil.RequireRoot(t)
	userBin, home, cred := asNobody(t, buildCLI(t, false))
	agent := filepath.Join(filepath.Dir(userBin), "airlock-agent")
	copyFile(t, newAgent(t), agent)
	host, tarball := privateDockerd(t)
	// The engine's socket, made reachable for nobody alone (the group a docker user is in).
	sock := filepath.Join(home, "docker.sock")
	forwardUnix(t, sock, strings.TrimPrefix(host, "unix://"))
	if err := os.Chown(sock, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	run := filepath.Join(home, "run") // $XDG_RUNTIME_DIR: both runtimes' state dirs default there
	if err := os.Mkdir(run, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(run, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(home, "config.yaml")
	if err := os.WriteFile(cfg, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"HOME=" + home, "PATH=/usr/bin:/bin", "XDG_RUNTIME_DIR=" + run, platform.EnvConfig + "=" + cfg,
		"AIRLOCK_SPARES=0", "AIRLOCK_AGENT=" + agent, "DOCKER_HOST=unix://" + sock}
	runAs := func(args ...string) (int, string, string) {
		cmd := exec.Command(userBin, args...)
		cmd.Env, cmd.SysProcAttr = env, cred
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		_ = cmd.Run()
		return cmd.ProcessState.ExitCode(), out.String(), errb.String()
	}
	stateDir := filepath.Join(run, "airlock-docker")
	t.Cleanup(func() {
		// No container of nobody's state dir may outlive the command.
		b, err := docker.New(context.Background(), docker.Options{StateDir: stateDir, Engine: docker.EngineAPI, Host: host})
		if err != nil {
			t.Errorf("checking for containers left behind: %v", err)
			return
		}
		defer b.Close()
		list, _ := b.List(context.Background())
		for _, s := range list {
			t.Errorf("container of sandbox %s (%s) outlived its command", s.ID, s.SandboxID)
			_ = b.Terminate(context.Background(), s.ID)
		}
	})
	code, out, errs := runAs("run", "--image", tarball, "-c", "import os; print(2+2, os.getuid())")
	if code != 0 || out != "4 1000\n" {
		t.Fatalf("airlock run as nobody: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	const notice = "airlock: the local runtime cannot run here (unsupported: not root"
	if strings.Count(errs, notice) != 1 || !strings.Contains(errs, "; using docker (Docker Engine API at unix://"+sock+")\n") || strings.Count(errs, "\n") != 1 {
		t.Errorf("stderr %q: want one line saying the local runtime was passed over, why, and the engine used", errs)
	}
	// The workdir and /tmp are the engine's tmpfs mounts, writable by the code.
	code, out, errs = runAs("run", "--image", tarball, "--lang", "bash", "-c", "touch /tmp/t ./w && grep -E ' (/workspace|/tmp) tmpfs ' /proc/mounts | wc -l")
	if code != 0 || out != "2\n" {
		t.Errorf("scratch as nobody: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	// Its set says what this user's docker backend cannot hold, and why.
	code, out, _ = runAs("capabilities")
	if code != 0 || !strings.HasPrefix(out, "platform: docker (auto: the local runtime cannot run here (unsupported: not root") ||
		!strings.Contains(out, "diskLimit            no        as a user other than root") ||
		!strings.Contains(out, "backgroundProcesses  no        as a user other than root") {
		t.Errorf("capabilities as nobody: exit %d\n%s", code, out)
	}
	// A declared disk limit is refused by name; an undeclared one is the platform's.
	stack := filepath.Join(home, "stack.yaml")
	if err := os.WriteFile(stack, []byte("apiVersion: airlock.dev/v1alpha1\nkind: Stack\nsandboxes:\n- id: a\n  image: python:3.12\n- id: b\n  image: python:3.12\n  limits:\n    disk: 1Gi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs = runAs("plan", "-f", stack)
	if code != 1 || !strings.Contains(out+errs, "sandboxes[1].limits.disk") || !strings.Contains(out+errs, "diskLimit") || strings.Contains(out+errs, "sandboxes[0].limits.disk") ||
		!strings.Contains(out, "sandbox=a  limits.disk                 platform value   within the memory limit") {
		t.Errorf("plan as nobody: exit %d\n%s%s", code, out, errs)
	}
}

// forwardUnix listens on path and relays each connection to the unix socket at to, until the
// test ends.
func forwardUnix(t *testing.T, path, to string) {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() {
		ln.Close()
		<-done
	})
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		defer wg.Wait()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				u, err := net.Dial("unix", to)
				if err != nil {
					return
				}
				defer u.Close()
				half := func(dst, src net.Conn) {
					_, _ = io.Copy(dst, src)
					_ = dst.(*net.UnixConn).CloseWrite()
				}
				var both sync.WaitGroup
				both.Add(1)
				go func() { defer both.Done(); half(u, c) }()
				half(c, u)
				both.Wait()
			}()
		}
	}()
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}

// Every command that opens a platform refuses the same way: a platform whose binding is not
// built names its issue and what works instead; an unknown one is a usage error naming where
// it came from.
func TestPlatformRefusals(t *testing.T) {
	t.Setenv(platform.EnvConfig, writeConfigFile(t, ""))
	t.Setenv("AWS_REGION", "")
	t.Setenv("AWS_DEFAULT_REGION", "")
	t.Setenv("AIRLOCK_GCP_LAUNCHER", "")
	t.Setenv(platform.EnvPlatform, "")
	sock := filepath.Join(t.TempDir(), "a.sock")
	stack, err := filepath.Abs("../../examples/python-tool.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		server bool
		env    string
		args   []string
		code   int
		stderr []string
	}{
		{server: true, args: []string{"serve", "--platform", "aws", "--socket", sock, "--signing-key", filepath.Join(t.TempDir(), "k")}, code: 1,
			stderr: []string{"platform aws", "aws.region is not set"}},
		{env: "aws", args: []string{"run", "-c", "1"}, code: exitRunFailed, stderr: []string{"aws.region is not set"}},
		{server: true, args: []string{"mcp", "--platform", "gcp"}, code: 1, stderr: []string{"platform gcp", "the Cloud Run sandbox launcher /usr/local/gcp/bin/sandbox", "sandboxLauncher: true"}},
		{server: true, args: []string{"mcp", "--platform", "openstack"}, code: 2, stderr: []string{`platform "openstack" (from --platform): allowed are auto, local`}},
		{args: []string{"run", "--platform", "azure", "-c", "1"}, code: exitRunFailed, stderr: []string{"platform azure (chosen by --platform)", "azure subscription is not set (config file key azure.subscription)"}},
		{env: "lambda", args: []string{"run", "-c", "1"}, code: 2, stderr: []string{`platform "lambda" (from $AIRLOCK_PLATFORM)`}},
		{env: "lambda", args: []string{"plan", "-f", stack}, code: 2, stderr: []string{`platform "lambda" (from $AIRLOCK_PLATFORM)`}},
		{args: []string{"run", "--platform", "kubernetes", "--cgroup-parent", "x", "-c", "1"}, code: 2, stderr: []string{"--cgroup-parent is the local runtime's; the platform is kubernetes (from --platform)"}},
	} {
		t.Setenv(platform.EnvPlatform, tc.env)
		var code int
		var errs string
		if tc.server {
			code, _, errs = serverIn(t, tc.args...)
		} else {
			code, _, errs = cliIn(t, "", tc.args...)
		}
		if code != tc.code {
			t.Errorf("%q: exit %d, want %d: %s", tc.args, code, tc.code, errs)
		}
		for _, w := range tc.stderr {
			if !strings.Contains(errs, w) {
				t.Errorf("%q: stderr %q does not say %q", tc.args, errs, w)
			}
		}
	}
}

// startServeBin runs the built `airlock args...` (a serve on a unix socket given in args as --socket), waits
// until its socket answers, and returns an SDK client of it; at the test's end the client closes
// and the daemon must end cleanly on SIGTERM.
func startServeBin(t *testing.T, bin string, env []string, logs *testutil.SyncBuffer, args ...string) *client.Client {
	t.Helper()
	sock := ""
	for i, a := range args {
		if a == "--socket" && i+1 < len(args) {
			sock = args[i+1]
		}
	}
	serve := exec.Command(bin, args...)
	serve.Env = append(os.Environ(), env...)
	serve.Stdout, serve.Stderr = logs, logs
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- serve.Wait() }()
	t.Cleanup(func() {
		_ = serve.Process.Signal(syscall.SIGTERM)
		if err := <-exited; err != nil {
			t.Errorf("airlock serve on SIGTERM: %v\n%s", err, logs.String())
		}
	})
	for ready := false; !ready; {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("airlock serve ended: %v\n%s", err, logs.String())
		case <-time.After(10 * time.Millisecond):
		}
		if conn, err := net.Dial("unix", sock); err == nil {
			conn.Close()
			ready = true
		}
	}
	c, err := client.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// connectMCP starts the built `airlock args...` (an mcp command) with env and connects the
// official MCP client to it over stdio; logs holds its stderr.
func connectMCP(t *testing.T, bin string, env []string, args ...string) (*sdk.ClientSession, *testutil.SyncBuffer) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	logs := &testutil.SyncBuffer{}
	cmd.Stderr = logs
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "airlock-test", Version: "1"}, nil).Connect(t.Context(), &sdk.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, logs.String())
	}
	return cs, logs
}

// wantRunCode42 calls run_code with print(6*7) and wants its exact text.
func wantRunCode42(t *testing.T, cs *sdk.ClientSession, logs *testutil.SyncBuffer) {
	t.Helper()
	r, err := cs.CallTool(t.Context(), &sdk.CallToolParams{Name: "run_code", Arguments: map[string]any{"language": "python", "code": "print(6*7)"}})
	if err != nil || textOf(r) != "Exit code: 0\n\n--- stdout ---\n42\n" {
		t.Errorf("run_code: %v %s\n%s", err, textOf(r), logs.String())
	}
}
