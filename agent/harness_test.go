package agent_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/agent"
	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/token"
)

// The protocol suite drives a real agent process: this test binary re-executed with
// envConfig set runs agent.Serve exactly as "airlock-agent serve --config" does (the command
// itself is exercised in internal/agentcmd). Built with -race, the agent is race-checked too.
const envConfig = "AIRLOCK_AGENT_TEST_CONFIG"

// envUnfrozenRounds, set for a test agent, is its v1 kill's rounds without freezing; the agent
// then writes "freeze <dir>" to its stderr before each freeze of an exec cgroup.
const envUnfrozenRounds = "AIRLOCK_AGENT_TEST_UNFROZEN_ROUNDS"

// envNoReaper, set for a test agent, keeps it on the process-group scope where it has no
// cgroup, as an agent that cannot start reapers.
const envNoReaper = "AIRLOCK_AGENT_TEST_NO_REAPER"

// exitIdle is the test agent's exit status when Serve returned agent.ErrIdle.
const exitIdle = 3

// Locked in init, the main goroutine runs on the main thread (runtime.LockOSThread's
// documented guarantee) and nothing else ever does: TestMain keeps it to run onMainThread.
func init() { runtime.LockOSThread() }

var mainThread = make(chan func())

func TestMain(m *testing.M) {
	if cfgFile := os.Getenv(envConfig); cfgFile != "" {
		os.Exit(agentMain(cfgFile))
	}
	// VerifyTestMain exits the process; until then the main goroutine serves onMainThread.
	go goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/airlock-sandbox/airlock/agent_test.TestMain"))
	for f := range mainThread {
		f()
	}
}

// onMainThread runs f on the process's main thread (tid == pid) and returns when f does.
func onMainThread(f func()) {
	done := make(chan struct{})
	mainThread <- func() {
		defer close(done)
		f()
	}
	<-done
}

func agentMain(cfgFile string) int {
	b, err := os.ReadFile(cfgFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	var cfg agent.Config
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if v := os.Getenv(envUnfrozenRounds); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		defer agent.SetFreezeHook(func(dir string) { fmt.Fprintln(os.Stderr, "freeze", dir) }, n)()
	}
	if os.Getenv(envNoReaper) != "" {
		defer agent.DisableReaper()()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	err = agent.Serve(ctx, cfg, agent.Hooks{Ready: func(string) { fmt.Println("ready") }})
	if errors.Is(err, agent.ErrIdle) {
		fmt.Fprintln(os.Stderr, "serve:", err)
		return exitIdle
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "serve:", err)
		return 1
	}
	return 0
}

type harness struct {
	t      testing.TB
	dir    string // scratch space outside the files root
	root   string // the files root
	cfg    agent.Config
	key    ed25519.PrivateKey
	cl     *client.Client
	proc   *exec.Cmd
	stderr *testutil.SyncBuffer
	env    []string // added to the agent's environment
	exited chan struct{}
	// cloneflags start the agent in new namespaces (CLONE_NEWPID: the agent is PID 1).
	cloneflags uintptr
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// baseConfig is an unprivileged-safe agent: commands run as the test's own uid
// (AllowRootCode), files confined to a fresh temp dir.
func newHarness(t testing.TB) *harness {
	t.Helper()
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ring, err := token.NewKeyRing(pub).MarshalText()
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, dir: dir, root: root, key: key}
	h.cfg = agent.Config{
		SandboxID:        "sbx-" + randHex(4),
		SessionID:        "ses-" + randHex(4),
		Generation:       3,
		KeyRing:          string(ring),
		Listen:           "unix:" + filepath.Join(dir, "agent.sock"),
		FilesRoot:        root,
		Workdir:          "/",
		CodeUID:          uint32(os.Getuid()),
		CodeGID:          uint32(os.Getgid()),
		AllowRootCode:    true,
		ShutdownOnManage: true,
		Policy: wire.Policy{
			DenyPaths:        []string{"/.airlock", "/proc", "/sys", "/dev"},
			Env:              map[string]string{"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "LANG": "C.UTF-8", "BASE_ONLY": "base"},
			MaxTimeout:       time.Hour,
			DefaultOutputCap: 16 << 20,
		},
	}
	return h
}

// start runs the agent process and waits until it listens.
func (h *harness) start() *harness {
	t := h.t
	t.Helper()
	b, err := json.Marshal(h.cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(h.dir, "agent.json")
	if err := os.WriteFile(cfgFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	// atexit_sleep_ms: the race runtime otherwise sleeps a second at every agent exit.
	cmd.Env = append(os.Environ(), envConfig+"="+cfgFile, "GORACE=atexit_sleep_ms=0 halt_on_error=1")
	cmd.Env = append(cmd.Env, h.env...)
	// If the test binary dies (a timeout panic), its agent must not outlive it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Cloneflags: h.cloneflags}
	h.stderr = &testutil.SyncBuffer{}
	cmd.Stderr = h.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h.proc = cmd
	h.exited = make(chan struct{})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		_ = cmd.Wait()
		t.Fatalf("agent did not start: %q %v\nstderr:\n%s", line, err, h.stderr)
	}
	go func() {
		_, _ = io.Copy(io.Discard, out)
		_ = cmd.Wait()
		close(h.exited)
	}()
	h.cl = client.New(h.cfg.Listen, func() string { return h.token(token.Execute, nil) })
	t.Cleanup(h.stop)
	return h
}

func (h *harness) stop() {
	h.cl.Close()
	select {
	case <-h.exited:
	default:
		_ = h.proc.Process.Signal(syscall.SIGTERM)
		<-h.exited
	}
	if s := h.stderr.String(); strings.Contains(s, "DATA RACE") || strings.Contains(s, "panic:") {
		h.t.Errorf("agent stderr:\n%s", s)
	} else if h.t.Failed() && s != "" {
		h.t.Logf("agent stderr:\n%s", s)
	}
}

// token mints a token for this agent's sandbox, adjusted by mutate.
func (h *harness) token(class token.Class, mutate func(*token.Claims)) string {
	c := token.Claims{
		Sandbox: h.cfg.SandboxID, Session: h.cfg.SessionID, Generation: h.cfg.Generation,
		Class: class, Expiry: time.Now().Add(time.Hour).Unix(),
	}
	if mutate != nil {
		mutate(&c)
	}
	tok, err := token.Mint(h.key, c)
	if err != nil {
		h.t.Fatal(err)
	}
	return tok
}

// clientWith returns a client sending tok.
func (h *harness) clientWith(tok string) *client.Client {
	c := client.New(h.cfg.Listen, func() string { return tok })
	h.t.Cleanup(func() { c.Close() })
	return c
}

// raw sends a raw HTTP request over the agent's socket with a bearer token ("" for none).
func (h *harness) raw(method, path, tok string, body io.Reader) (int, []byte) {
	h.t.Helper()
	if tok != "" {
		tok = "Bearer " + tok
	}
	return h.rawHeader(method, path, tok, body)
}

// rawHeader sends a raw HTTP request with the given Authorization header ("" for none).
func (h *harness) rawHeader(method, path, auth string, body io.Reader) (int, []byte) {
	h.t.Helper()
	hdr := http.Header{}
	if auth != "" {
		hdr.Set("Authorization", auth)
	}
	return h.rawHeaders(method, path, hdr, body)
}

// rawHeaders sends a raw HTTP request with exactly the headers hdr.
func (h *harness) rawHeaders(method, path string, hdr http.Header, body io.Reader) (int, []byte) {
	h.t.Helper()
	sock := strings.TrimPrefix(h.cfg.Listen, "unix:")
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest(method, "http://agent"+path, body)
	if err != nil {
		h.t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// alive reports whether pid is a live (not zombie) process.
func alive(pid int) bool {
	if err := unix.Kill(pid, 0); err == unix.ESRCH {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// state is the field after the parenthesised command name
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// eventually polls cond until it holds; the bound is a hang guard, not a timing assertion.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 20s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
