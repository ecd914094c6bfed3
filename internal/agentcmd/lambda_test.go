package agentcmd_test

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/agent"
	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
	"github.com/airlock-sandbox/airlock/token"
)

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestLambdaGuest: as a MicroVM's guest, the agent answers Lambda's lifecycle hooks, takes the
// session's configuration from the run hook's body (refusing what is the guest's to decide),
// then serves the protocol with the payload's key ring, code running as uid 60000 in the
// workdir it made.
func TestLambdaGuest(t *testing.T) {
	testutil.RequireRoot(t)
	hooks, listen := freePort(t), freePort(t)
	cmd := exec.Command(agentBin, "lambda", "--hooks", "tcp:"+hooks, "--listen", "tcp:"+listen)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Errorf("agent after SIGTERM: %v", err)
		}
	}()
	sc := bufio.NewScanner(stderr)
	if !sc.Scan() || !strings.Contains(sc.Text(), "lifecycle hooks on") {
		t.Fatalf("first stderr line %q", sc.Text())
	}
	go func() {
		for sc.Scan() {
		}
	}()
	defer http.DefaultClient.CloseIdleConnections()
	base := "http://" + hooks + "/aws/lambda-microvms/runtime/v1/"
	post := func(hook, body string) int {
		t.Helper()
		resp, err := http.Post(base+hook, "application/octet-stream", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if c := post("ready", ""); c != http.StatusOK {
		t.Errorf("ready hook: %d", c)
	}
	resp, err := http.Get("http://" + hooks + "/ready")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("the short path /ready: %d, want 404 (Lambda calls the long one)", resp.StatusCode)
	}
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ring, err := token.NewKeyRing(pub).MarshalText()
	if err != nil {
		t.Fatal(err)
	}
	parent, err := os.MkdirTemp("", "lam")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(parent)
	if err := os.Chmod(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	workdir := parent + "/workspace"
	// The payload carries the declaration's env and the lifetime; the rest of the policy is
	// the guest's (wire.NewPolicy), with the image's environment only it sees.
	cfg := agent.Config{SandboxID: "lam", SessionID: "microvm", Generation: 1, KeyRing: string(ring), Workdir: workdir,
		Policy: wire.Policy{Env: map[string]string{"FROM_DECL": "yes"}, MaxTimeout: time.Minute}}
	for name, mutate := range map[string]func(*agent.Config){
		"a listen address": func(c *agent.Config) { c.Listen = "tcp:0.0.0.0:1" },
		"refused paths":    func(c *agent.Config) { c.DenyPaths = []string{"/x"} },
		"an output cap":    func(c *agent.Config) { c.DefaultOutputCap = 1 << 20 },
	} {
		bad := cfg
		mutate(&bad)
		badJSON, _ := json.Marshal(bad)
		if c := post("run", string(badJSON)); c != http.StatusBadRequest {
			t.Errorf("run hook with %s: %d, want 400", name, c)
		}
	}
	js, _ := json.Marshal(cfg)
	if c := post("run", string(js)); c != http.StatusOK {
		t.Fatalf("run hook: %d", c)
	}
	if c := post("run", string(js)); c != http.StatusConflict {
		t.Errorf("second run hook: %d, want 409", c)
	}
	tok, err := token.Mint(key, token.Claims{Sandbox: "lam", Session: "microvm", Generation: 1, Class: token.Execute, Expiry: time.Now().Add(time.Hour).Unix()})
	if err != nil {
		t.Fatal(err)
	}
	cl := client.New("tcp:"+listen, func() string { return tok })
	defer cl.Close()
	var out strings.Builder
	res, err := cl.Exec(context.Background(), sbtypes.ExecRequest{Shell: `id -u; pwd; echo "$FROM_DECL"`, Timeout: 10 * time.Second}, &out, nil)
	if err != nil || res.ExitCode != 0 || out.String() != "60000\n"+workdir+"\nyes\n" {
		t.Errorf("exec through the guest: %q %+v %v", out.String(), res, err)
	}
	if c := post("resume", ""); c != http.StatusOK {
		t.Errorf("resume hook: %d", c)
	}
}
