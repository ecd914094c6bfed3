package agentcmd_test

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/airlock-sandbox/airlock/agent"
	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/internal/agentcmd"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
	"github.com/airlock-sandbox/airlock/token"
)

var agentBin string

// TestMain builds the real airlock-agent binary once: the tests run what ships.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "airlock-agent-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	agentBin = filepath.Join(dir, "airlock-agent")
	build := exec.Command("go", "build", "-o", agentBin, "../../cmd/airlock-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0") // static, as shipped: no cgo
	out, err := build.CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build airlock-agent: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		os.RemoveAll(dir)
		os.Exit(code)
	}))
}

func TestVersionAndUsage(t *testing.T) {
	out, err := exec.Command(agentBin, "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "airlock-agent ") || !strings.Contains(string(out), "(protocol v1)") {
		t.Errorf("version: %q %v", out, err)
	}
	for _, args := range [][]string{nil, {"bogus"}, {"serve"}, {"serve", "--config"}, {"version", "extra"}} {
		cmd := exec.Command(agentBin, args...)
		out, err := cmd.CombinedOutput()
		if cmd.ProcessState.ExitCode() != 2 || !strings.Contains(string(out), "usage:") {
			t.Errorf("%v: exit %d %q %v, want 2 with usage", args, cmd.ProcessState.ExitCode(), out, err)
		}
	}
}

func testConfig(t *testing.T) (agent.Config, ed25519.PrivateKey) {
	dir := t.TempDir()
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ring, err := token.NewKeyRing(pub).MarshalText()
	if err != nil {
		t.Fatal(err)
	}
	return agent.Config{
		SandboxID: "sbx", SessionID: "ses", KeyRing: string(ring),
		Listen: "unix:" + filepath.Join(dir, "agent.sock"), FilesRoot: dir,
		CodeUID: uint32(os.Getuid()), CodeGID: uint32(os.Getgid()), AllowRootCode: true,
		Policy: wire.Policy{Env: map[string]string{"PATH": "/usr/bin:/bin"}, MaxTimeout: time.Minute, DefaultOutputCap: 1 << 20},
	}, key
}

func TestServeFromStdinAndFile(t *testing.T) {
	cfg, key := testConfig(t)
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "agent.json")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, src := range []string{"-", file} {
		t.Run(src, func(t *testing.T) {
			cmd := exec.Command(agentBin, "serve", "--config", src)
			cmd.Stdin = strings.NewReader(string(b))
			stderr, err := cmd.StderrPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			line, _ := bufio.NewReader(stderr).ReadString('\n')
			if !strings.Contains(line, "listening on") {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				t.Fatalf("first stderr line %q", line)
			}
			tok, err := token.Mint(key, token.Claims{Sandbox: "sbx", Session: "ses", Class: token.Execute, Expiry: time.Now().Add(time.Hour).Unix()})
			if err != nil {
				t.Fatal(err)
			}
			cl := client.New(cfg.Listen, func() string { return tok })
			defer cl.Close()
			var out strings.Builder
			res, err := cl.Exec(context.Background(), sbtypes.ExecRequest{Argv: []string{"echo", "hi"}, Timeout: 10 * time.Second}, &out, nil)
			if err != nil || out.String() != "hi\n" || res.ExitCode != 0 {
				t.Errorf("exec through the binary: %q %+v %v", out.String(), res, err)
			}
			_ = cmd.Process.Signal(syscall.SIGTERM)
			if err := cmd.Wait(); err != nil {
				t.Errorf("agent after SIGTERM: %v", err)
			}
		})
	}
}

func TestServeRefusesBadConfig(t *testing.T) {
	cfg, _ := testConfig(t)
	b, _ := json.Marshal(cfg)
	withTypo := strings.Replace(string(b), `"sandboxId"`, `"sandboxID_typo"`, 1)
	tests := map[string]string{
		"unknown field":   withTypo,
		"not JSON":        "listen: x",
		"trailing data":   string(b) + "{}",
		"invalid content": strings.Replace(string(b), `"maxTimeout":60000000000`, `"maxTimeout":0`, 1),
	}
	for name, in := range tests {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(agentBin, "serve", "--config", "-")
			cmd.Stdin = strings.NewReader(in)
			out, _ := cmd.CombinedOutput()
			if code := cmd.ProcessState.ExitCode(); code == 0 {
				t.Errorf("accepted: %q", out)
			}
		})
	}
	cmd := exec.Command(agentBin, "serve", "--config", "/nonexistent/agent.json")
	if out, _ := cmd.CombinedOutput(); cmd.ProcessState.ExitCode() != 2 || !strings.Contains(string(out), "no such file") {
		t.Errorf("missing config file: %q", out)
	}
}

// TestLeanDependencies keeps the agent binary off the heavy libraries (DESIGN: start-up is on
// the hot path): it is paid by every fresh sandbox.
func TestLeanDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "../../cmd/airlock-agent").Output()
	if err != nil {
		t.Fatal(err)
	}
	forbidden := []string{
		"github.com/spf13/cobra", "github.com/prometheus/", "k8s.io/client-go", "sigs.k8s.io/controller-runtime",
		"github.com/modelcontextprotocol/", "github.com/aws/", "cloud.google.com/", "github.com/Azure/",
		"github.com/moby/moby/client", "github.com/docker/docker", "github.com/google/go-containerregistry",
		"google.golang.org/grpc", "github.com/containerd/cgroups",
		// What sandbox → spec, capability pulled in before the agent's types moved to
		// sandbox/sbtypes: ~15 package inits and 1 MB of binary on every sandbox start.
		"k8s.io/", "sigs.k8s.io/", "gopkg.in/yaml", "go.yaml.in/", "github.com/fxamacker/cbor",
		"github.com/google/nftables", "github.com/mdlayher/",
	}
	// Exact packages: the agent's types come from sandbox/sbtypes, never these.
	forbiddenExact := map[string]bool{
		"github.com/airlock-sandbox/airlock/sandbox":    true,
		"github.com/airlock-sandbox/airlock/spec":       true,
		"github.com/airlock-sandbox/airlock/capability": true,
	}
	for _, pkg := range strings.Fields(string(out)) {
		if forbiddenExact[pkg] {
			t.Errorf("airlock-agent links %s", pkg)
		}
		for _, f := range forbidden {
			if strings.HasPrefix(pkg, f) {
				t.Errorf("airlock-agent links %s", pkg)
			}
		}
	}
}

// BenchmarkStartup is the agent binary's start-up as a sandbox pays it: exec, config read,
// listen, first health answer.
func BenchmarkStartup(b *testing.B) {
	dir := b.TempDir()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	ring, err := token.NewKeyRing(pub).MarshalText()
	if err != nil {
		b.Fatal(err)
	}
	cfg := agent.Config{
		SandboxID: "sbx", SessionID: "ses", KeyRing: string(ring),
		Listen: "unix:" + filepath.Join(dir, "agent.sock"), FilesRoot: dir,
		CodeUID: uint32(os.Getuid()), CodeGID: uint32(os.Getgid()), AllowRootCode: true,
		Policy: wire.Policy{MaxTimeout: time.Minute, DefaultOutputCap: 1 << 20},
	}
	js, err := json.Marshal(cfg)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		cmd := exec.Command(agentBin, "serve", "--config", "-")
		cmd.Stdin = strings.NewReader(string(js))
		stderr, err := cmd.StderrPipe()
		if err != nil {
			b.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		if line, _ := bufio.NewReader(stderr).ReadString('\n'); !strings.Contains(line, "listening") {
			b.Fatalf("agent: %q", line)
		}
		cl := client.New(cfg.Listen, nil)
		if _, err := cl.Health(context.Background()); err != nil {
			b.Fatal(err)
		}
		cl.Close()
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}
}

// TestInheritedDescriptorsDoNotReachCommands: descriptors the launcher passes without
// close-on-exec (a host directory, a host file open for append) are marked close-on-exec
// before the agent does anything else, and a command sees only its stdio.
func TestInheritedDescriptorsDoNotReachCommands(t *testing.T) {
	cfg, key := testConfig(t)
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hostDir := t.TempDir()
	hostDirF, err := os.Open(hostDir)
	if err != nil {
		t.Fatal(err)
	}
	defer hostDirF.Close()
	hostFile := filepath.Join(hostDir, "log")
	hostFileF, err := os.OpenFile(hostFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer hostFileF.Close()
	cmd := exec.Command(agentBin, "serve", "--config", "-")
	cmd.Stdin = strings.NewReader(string(b))
	// ExtraFiles arrive as fds 3 and 4 without close-on-exec, as a careless launcher leaves them.
	cmd.ExtraFiles = []*os.File{hostDirF, hostFileF}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	if line, _ := bufio.NewReader(stderr).ReadString('\n'); !strings.Contains(line, "listening on") {
		t.Fatalf("first stderr line %q", line)
	}
	// Before any command runs: the agent's own copies are already close-on-exec.
	for _, fd := range []int{3, 4} {
		info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%d", cmd.Process.Pid, fd))
		if err != nil {
			t.Fatal(err)
		}
		var flags int64
		for _, l := range strings.Split(string(info), "\n") {
			if v, ok := strings.CutPrefix(l, "flags:"); ok {
				flags, err = strconv.ParseInt(strings.TrimSpace(v), 8, 64)
				if err != nil {
					t.Fatalf("fdinfo %d: %q", fd, l)
				}
			}
		}
		if flags&syscall.O_CLOEXEC == 0 {
			t.Errorf("agent fd %d flags %#o: not close-on-exec", fd, flags)
		}
	}
	tok, err := token.Mint(key, token.Claims{Sandbox: "sbx", Session: "ses", Class: token.Execute, Expiry: time.Now().Add(time.Hour).Unix()})
	if err != nil {
		t.Fatal(err)
	}
	cl := client.New(cfg.Listen, func() string { return tok })
	defer cl.Close()
	var out strings.Builder
	res, err := cl.Exec(context.Background(), sbtypes.ExecRequest{Argv: []string{"ls", "-l", "/proc/self/fd"}, Timeout: 10 * time.Second}, &out, nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec %+v %v", res, err)
	}
	var fds []string
	for _, line := range strings.Split(out.String(), "\n") {
		f := strings.Fields(line)
		for i := 1; i+1 < len(f); i++ {
			// ls's own handle on /proc/self/fd is the one descriptor beyond stdio it may show.
			if f[i] == "->" && !regexp.MustCompile(`^/proc/[0-9]+/fd$`).MatchString(f[i+1]) {
				fds = append(fds, f[i-1])
			}
		}
	}
	if strings.Join(fds, ",") != "0,1,2" {
		t.Errorf("a command sees descriptors %v, want 0,1,2:\n%s", fds, out.String())
	}
	if strings.Contains(out.String(), hostDir) {
		t.Errorf("a command inherited a host descriptor:\n%s", out.String())
	}
}

// TestServeExitsIdle: an agent nobody talks to ends by itself with ExitIdle, so whoever
// started it (the container runtime, PID 1's parent) can tell why.
func TestServeExitsIdle(t *testing.T) {
	cfg, _ := testConfig(t)
	cfg.IdleTimeout = 200 * time.Millisecond
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(agentBin, "serve", "--config", "-")
	cmd.Stdin = strings.NewReader(string(b))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("the agent did not stop after being idle; stderr:\n%s", stderr.String())
	}
	if code := cmd.ProcessState.ExitCode(); code != agentcmd.ExitIdle || !strings.Contains(stderr.String(), "idle timeout") {
		t.Errorf("exit %d, stderr:\n%s\nwant exit %d naming the idle timeout", code, stderr.String(), agentcmd.ExitIdle)
	}
}

// TestServeUsesOneProcessor: the agent runs its Go code on one processor unless GOMAXPROCS
// says otherwise (read from the runtime's own scheduler trace of the shipped binary).
func TestServeUsesOneProcessor(t *testing.T) {
	cfg, _ := testConfig(t)
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ env, want string }{{"", "gomaxprocs=1 "}, {"GOMAXPROCS=2", "gomaxprocs=2 "}} {
		t.Run("env "+tc.env, func(t *testing.T) {
			cmd := exec.Command(agentBin, "serve", "--config", "-")
			cmd.Env = append(os.Environ(), "GODEBUG=schedtrace=10")
			for i, e := range cmd.Env {
				if strings.HasPrefix(e, "GOMAXPROCS=") {
					cmd.Env[i] = "AIRLOCK_TEST_UNSET=1"
				}
			}
			if tc.env != "" {
				cmd.Env = append(cmd.Env, tc.env)
			}
			cmd.Stdin = strings.NewReader(string(b))
			stderr, err := cmd.StderrPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				// Stop it, read its stderr to the end (it traces until it exits), then reap it.
				_ = cmd.Process.Signal(syscall.SIGTERM)
				_, _ = io.Copy(io.Discard, stderr)
				_ = cmd.Wait()
			}()
			sc := bufio.NewScanner(stderr)
			var seen []string
			for sc.Scan() {
				line := sc.Text()
				// The first trace may come before main sets the value; the ones after
				// "listening" come from the serving agent.
				if strings.Contains(line, "listening on") {
					seen = append(seen, line)
					continue
				}
				if len(seen) > 0 && strings.HasPrefix(line, "SCHED ") {
					if !strings.Contains(line, tc.want) {
						t.Errorf("scheduler trace %q, want %s", line, tc.want)
					}
					return
				}
			}
			t.Fatalf("no scheduler trace after listening (stderr ended: %v)", sc.Err())
		})
	}
}

// TestBridge: airlock-agent bridge carries bytes both ways between its stdio and a unix
// socket, passes the end of its stdin on as a half-close (the peer answers, then the bridge
// ends), and refuses anything but unix:<absolute path>.
func TestBridge(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c) // until the bridge's half-close
		_, _ = c.Write([]byte("got " + strings.ToUpper(string(b))))
	}()
	cmd := exec.Command(agentBin, "bridge", "unix:"+sock)
	cmd.Stdin = strings.NewReader("hello bridge")
	out, err := cmd.Output()
	if err != nil || string(out) != "got HELLO BRIDGE" {
		t.Fatalf("bridge: %q, %v", out, err)
	}
	for _, args := range [][]string{{"bridge"}, {"bridge", "tcp:127.0.0.1:1"}, {"bridge", "unix:rel.sock"}, {"bridge", "unix:/a", "x"}} {
		var exit *exec.ExitError
		if err := exec.Command(agentBin, args...).Run(); !errors.As(err, &exit) || exit.ExitCode() != 2 {
			t.Errorf("%q: %v, want exit 2", args, err)
		}
	}
	var exit *exec.ExitError
	if err := exec.Command(agentBin, "bridge", "unix:"+filepath.Join(t.TempDir(), "none.sock")).Run(); !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Errorf("bridge to no socket: %v, want exit 1", err)
	}
}
