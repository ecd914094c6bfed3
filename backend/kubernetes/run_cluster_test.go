//go:build cluster

package kubernetes_test

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/mcp"
	"github.com/airlock-sandbox/airlock/platform"
	"github.com/airlock-sandbox/airlock/runcode"
	"github.com/airlock-sandbox/airlock/spec"
)

// TestRunAndMCPThroughPlatform is `airlock run --platform kubernetes` and `airlock mcp
// --platform kubernetes` as far as main wires them: the platform settings the CLI reads (the
// flag's value, the config file at $AIRLOCK_CONFIG naming the kubeconfig hack/testcluster
// writes, a namespace, a ServiceAccount and the Sandbox that serves runs), platform.Open, then
// what run does (runcode.Run) and what mcp does (mcp.Server over stdio, a run_code call from an
// MCP client). Everything reaches the cluster from outside: the API server's service and pod
// proxies.
func TestRunAndMCPThroughPlatform(t *testing.T) {
	e := newEnv(t)
	img := spec.Image{Ref: testImage}
	// The Sandbox a run fits: run_code's template for this image, without the labels the
	// operator keeps for itself.
	d := runcode.PoolTemplate(runcode.Options{Image: img}, time.Minute)
	d.ID, d.Labels = "run", nil
	e.sandboxCR(d, 2, 2)

	cfgFile := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfgFile, []byte("kubernetes:\n  kubeconfig: "+kubeconfig+"\n  namespace: "+e.ns+
		"\n  serviceAccount: app\n  sandbox: run\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(platform.EnvConfig, cfgFile)
	t.Setenv(platform.EnvPlatform, "")
	c, err := platform.Settings("kubernetes", true) // --platform kubernetes
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	b, ch, err := platform.Open(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if ch.Platform != capability.Kubernetes || !strings.Contains(ch.Engine, "service proxy") {
		t.Fatalf("choice %+v", ch)
	}

	t.Run("run", func(t *testing.T) {
		res, err := runcode.Run(ctx, b, runcode.Request{Language: "python", Code: "print(2+2)"}, runcode.Options{Image: img})
		if err != nil || res.ExitCode != 0 || res.Stdout != "4\n" {
			t.Fatalf("run: %+v, %v", res, err)
		}
		// A run that does not fit the Sandbox is refused, naming what differs.
		_, err = runcode.Run(ctx, b, runcode.Request{Language: "python", Code: "print(1)", Network: true}, runcode.Options{Image: img})
		if err == nil || !strings.Contains(err.Error(), "egress") {
			t.Fatalf("run with network on a deny Sandbox: %v, want a refusal naming egress", err)
		}
	})

	// The shipped binaries, as a user runs them: airlock (the front), the full CLI it hands
	// other platforms to, and airlock-server (mcp).
	t.Run("binaries", func(t *testing.T) {
		dir := t.TempDir()
		build := exec.CommandContext(ctx, "go", "build", "-o", dir+"/", "github.com/airlock-sandbox/airlock/cmd/airlock", "github.com/airlock-sandbox/airlock/cmd/airlock-full", "github.com/airlock-sandbox/airlock/cmd/airlock-server")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("build: %v\n%s", err, out)
		}
		env := append(os.Environ(), platform.EnvConfig+"="+cfgFile, "AIRLOCK_SERVER="+filepath.Join(dir, "airlock-server"))
		run := exec.CommandContext(ctx, filepath.Join(dir, "airlock"), "run", "--platform", "kubernetes", "--image", testImage, "-c", "print(2+2)")
		run.Env = env
		out, err := run.Output()
		if err != nil || string(out) != "4\n" {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			t.Fatalf("airlock run --platform kubernetes: %q, %v\n%s", out, err, stderr)
		}

		cmd := exec.Command(filepath.Join(dir, "airlock"), "mcp", "--platform", "kubernetes", "--image", testImage)
		cmd.Env = env
		cmd.Stderr = os.Stderr
		client := sdk.NewClient(&sdk.Implementation{Name: "cluster-test", Version: "1"}, nil)
		cs, err := client.Connect(ctx, &sdk.CommandTransport{Command: cmd}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		runCodeFour(ctx, t, cs)
	})

	t.Run("mcp", func(t *testing.T) {
		srv := mcp.New(b, mcp.Options{Image: img, Version: "test"})
		// stdio: the server reads what the client writes and the other way round.
		cr, sw := io.Pipe()
		sr, cw := io.Pipe()
		sctx, stop := context.WithCancel(ctx)
		served := make(chan error, 1)
		go func() { served <- srv.ServeStdio(sctx, sr, sw) }()
		client := sdk.NewClient(&sdk.Implementation{Name: "cluster-test", Version: "1"}, nil)
		cs, err := client.Connect(ctx, &sdk.IOTransport{Reader: cr, Writer: cw}, nil)
		if err != nil {
			t.Fatal(err)
		}
		runCodeFour(ctx, t, cs)
		cs.Close()
		stop()
		cw.Close()
		if err := <-served; err != nil {
			t.Errorf("mcp server: %v", err)
		}
	})
}

// runCodeFour calls run_code with print(2+2) over an MCP session and wants 4 on stdout.
func runCodeFour(ctx context.Context, t *testing.T, cs *sdk.ClientSession) {
	t.Helper()
	r, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "run_code", Arguments: map[string]any{"language": "python", "code": "print(2+2)"}})
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		ExitCode int    `json:"exit_code"`
		Stdout   string `json:"stdout"`
	}
	js, _ := json.Marshal(r.StructuredContent)
	if err := json.Unmarshal(js, &out); err != nil {
		t.Fatalf("run_code result %s: %v", js, err)
	}
	if r.IsError || out.ExitCode != 0 || out.Stdout != "4\n" {
		t.Fatalf("run_code over stdio MCP: error %v, %s", r.IsError, js)
	}
}
