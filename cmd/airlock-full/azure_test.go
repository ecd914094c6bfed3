package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/backend/azure/azurefake"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/client"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/platform"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// fakeAz is an az CLI for azidentity's AzureCLICredential: it prints a token the fake
// accepts for the resource asked for.
const fakeAz = `#!/bin/sh
while [ $# -gt 0 ]; do
	case "$1" in --resource) r=$2; shift;; esac
	shift
done
printf '{"accessToken":"aud=%s","expires_on":4102444800,"expiresOn":"2099-12-31 00:00:00.000000"}' "$r"
`

// TestPlatformAzure runs airlock run, capabilities, mcp, serve and egress from the built binaries against the
// Azure fake, as users would: the sandbox group in the config file, credentials through
// DefaultAzureCredential (here the az CLI's, restricted by AZURE_TOKEN_CREDENTIALS), the
// fake's certificate trusted through SSL_CERT_FILE. The fake's sandboxes are local ones.
func TestPlatformAzure(t *testing.T) {
	testutil.RequireRoot(t)
	bin := buildCLI(t, true)
	env := newRuntimeEnv(t)
	lb := env.open(t)
	t.Cleanup(func() { lb.Close() })
	f := azurefake.New(azurefake.Config{Groups: []string{"sg"}, Local: lb, CreatingPolls: 1, DeletingPolls: 1})
	t.Cleanup(f.Close)
	dir := t.TempDir()
	cert := filepath.Join(dir, "fake.pem")
	if err := f.WriteCert(cert); err != nil {
		t.Fatal(err)
	}
	azDir := filepath.Join(dir, "bin")
	if err := os.Mkdir(azDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(azDir, "az"), []byte(fakeAz), 0o755); err != nil {
		t.Fatal(err)
	}
	config := writeConfigFile(t, fmt.Sprintf(`platform: azure
azure:
  subscription: 00000000-0000-0000-0000-000000000000
  resourceGroup: rg
  sandboxGroup: sg
  region: westus2
  dataPlaneEndpoint: %s
  armEndpoint: %s
`, f.DataPlane.URL, f.ARM.URL))
	t.Setenv(envServer, "")
	runEnv := []string{
		platform.EnvConfig + "=" + config, platform.EnvPlatform + "=",
		"SSL_CERT_FILE=" + cert, "AZURE_TOKEN_CREDENTIALS=AzureCLICredential",
		"PATH=" + azDir + ":" + os.Getenv("PATH"),
	}

	code, out, errs := runBin(t, runEnv, bin, "run", "--image", "ubuntu", "-c", "import os; print(2+2, os.getcwd())")
	if code != 0 || out != "4 /workspace\n" {
		t.Errorf("airlock run on azure: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	code, out, errs = runBin(t, runEnv, bin, "run", "--image", "ubuntu", "-c", "import sys; sys.exit(3)")
	if code != 3 {
		t.Errorf("airlock run of exit 3 on azure: exit %d, %q %q", code, out, errs)
	}
	code, out, errs = runBin(t, runEnv, bin, "capabilities")
	if code != 0 || !strings.HasPrefix(out, "azure capabilities (the azure backend configured here)") || !strings.Contains(out, "domainEgressRules    yes") {
		t.Errorf("capabilities: exit %d, %q %q", code, out, errs)
	}

	cs, logs := connectMCP(t, bin, runEnv, "mcp", "--image", "ubuntu")
	wantRunCode42(t, cs, logs)
	closeMCP(t, cs, logs)

	// The daemon on azure: the SDK creates, execs, writes and reads a file, replaces the
	// egress policy while the sandbox runs, and terminates.
	sock := filepath.Join(dir, "a.sock")
	c := startServeBin(t, bin, runEnv, logs, "serve", "--socket", sock, "--signing-key", filepath.Join(dir, "k"), "--log-level", "warn")
	if h, err := c.Health(t.Context()); err != nil || h.Platform != capability.Azure {
		t.Errorf("GET /healthz: %+v, %v; want platform azure", h, err)
	}
	sb, err := c.Create(t.Context(), spec.Sandbox{ID: "svc", Image: spec.Image{Ref: "ubuntu"}, Labels: map[string]string{"team": "t"}})
	if err != nil {
		t.Fatalf("create through the daemon: %v\n%s", err, logs.String())
	}
	var o strings.Builder
	if res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Shell: "echo hi; exit 4", Timeout: time.Minute}, &o, nil); err != nil || res.ExitCode != 4 || o.String() != "hi\n" {
		t.Errorf("exec through the daemon: %+v %v %q", res, err, o.String())
	}
	if err := sb.WriteFile(t.Context(), "/workspace/f.txt", strings.NewReader("data"), 0o600); err != nil {
		t.Errorf("write through the daemon: %v", err)
	} else if rc, err := sb.ReadFile(t.Context(), "/workspace/f.txt"); err != nil {
		t.Errorf("read through the daemon: %v", err)
	} else {
		b, _ := io.ReadAll(rc)
		rc.Close()
		if string(b) != "data" {
			t.Errorf("read back %q", b)
		}
	}
	ifaces := func() string {
		var o strings.Builder
		if _, err := sb.Exec(t.Context(), sandbox.ExecRequest{Shell: "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort | tr '\\n' ' '", Timeout: time.Minute}, &o, nil); err != nil {
			t.Errorf("exec: %v", err)
		}
		return o.String()
	}
	if got := ifaces(); got != "lo " {
		t.Errorf("deny sandbox interfaces %q", got)
	}
	code, out, errs = runBin(t, append(runEnv, client.EnvSocket+"="+sock, client.EnvURL+"=", client.EnvToken+"=", client.EnvAPIKey+"="), bin,
		"egress", sb.ID, "--mode", "allowDomains", "--allow-domain", "example.com")
	if code != 0 {
		t.Errorf("airlock egress: exit %d, %q %q", code, out, errs)
	}
	if got := ifaces(); got == "lo " {
		t.Errorf("after airlock egress allowDomains the sandbox has only loopback")
	}
	if err := sb.Terminate(t.Context()); err != nil {
		t.Errorf("terminate through the daemon: %v", err)
	}

	// Every sandbox the commands made is gone from the data plane and from the local runtime.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if n := f.Count(); n != 0 {
		t.Errorf("%d sandboxes left on the fake's data plane", n)
	}
	if list, _ := lb.List(ctx); len(list) != 0 {
		t.Errorf("%d local sandboxes left behind the fake", len(list))
	}
	if a := f.Audiences(); a[azurefake.AudienceDynamicSessions] == 0 {
		t.Errorf("data-plane audiences seen: %v", a)
	}
}
