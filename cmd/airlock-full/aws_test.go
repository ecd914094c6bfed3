package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/backend/aws/fake"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/platform"
	"github.com/airlock-sandbox/airlock/spec"
)

// TestPlatformAWS runs airlock run, mcp and serve on aws as users would, against the fake
// MicroVM service this test starts (its guests are local sandboxes running our agent): the
// endpoint, image and connector come from the config file, the credentials from the SDK's
// default chain ($AWS_ACCESS_KEY_ID and $AWS_SECRET_ACCESS_KEY).
func TestPlatformAWS(t *testing.T) {
	testutil.RequireRoot(t)
	bin := buildCLI(t, true)
	e := newRuntimeEnv(t)
	lb := e.open(t)
	t.Cleanup(func() { lb.Close() })
	const (
		region    = "eu-north-1"
		image     = "arn:aws:lambda:eu-north-1:123456789012:microvm-image:airlock-cli"
		imageRef  = "registry.example/airlock/python:3"
		connector = "arn:aws:lambda:eu-north-1:123456789012:network-connector:airlock-deny"
	)
	guests := &fake.LocalGuests{Backend: lb, StateDir: e.stateDir, Images: map[string]spec.Image{image: {Host: true}}}
	f := fake.New(region, guests.Start)
	f.Images, f.Connectors = []string{image}, []string{connector}
	f.RestoreFailures, f.StartDelayGets, f.TerminatingGets = 2, 1, 1
	t.Cleanup(f.Close)
	awsDir, err := os.MkdirTemp("", "aa")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(awsDir) })
	cfg := writeConfigFile(t, "aws:\n  region: "+region+"\n  endpoint: "+f.URL()+"\n  image: "+image+"\n  imageRef: "+imageRef+
		"\n  egressConnector: "+connector+"\n  stateDir: "+awsDir+"\n")
	none := filepath.Join(t.TempDir(), "none")
	env := []string{platform.EnvConfig + "=" + cfg, platform.EnvPlatform + "=", "AWS_REGION=", "AWS_PROFILE=",
		"AWS_ACCESS_KEY_ID=" + fake.AccessKey, "AWS_SECRET_ACCESS_KEY=" + fake.SecretKey, "AWS_SESSION_TOKEN=",
		"AWS_SHARED_CREDENTIALS_FILE=" + none, "AWS_CONFIG_FILE=" + none, "AWS_EC2_METADATA_DISABLED=true"}
	left := func(what string) {
		t.Helper()
		if run := f.Running(); len(run) != 0 {
			t.Errorf("after %s MicroVMs still run: %v", what, run)
		}
	}

	code, out, errs := runBin(t, env, bin, "run", "--platform", "aws", "--image", imageRef, "-c", "print(2+2)")
	if code != 0 || out != "4\n" {
		t.Fatalf("airlock run --platform aws: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if f.MicroVMs() != 1 {
		t.Errorf("%d MicroVMs run for one airlock run", f.MicroVMs())
	}
	left("airlock run")
	// An image the configured MicroVM image was not built from is refused, naming the setting.
	code, _, errs = runBin(t, env, bin, "run", "--platform", "aws", "--image", "python:3.12", "-c", "1")
	if code == 0 || !strings.Contains(errs, "aws.imageRef") {
		t.Errorf("run with another image: exit %d, %q", code, errs)
	}
	code, out, errs = runBin(t, env, bin, "capabilities", "--platform", "aws")
	if code != 0 || !strings.HasPrefix(out, "aws capabilities (the aws backend configured here: Lambda MicroVMs in "+region) {
		t.Errorf("capabilities: exit %d, %q %q", code, out, errs)
	}

	mcpArgs := []string{"mcp", "--platform", "aws", "--image", imageRef}
	cs, logs := connectMCP(t, bin, env, mcpArgs...)
	wantRunCode42(t, cs, logs)
	closeMCP(t, cs, logs)
	left("run_code")

	// The daemon on aws: its health says so.
	dir := t.TempDir()
	sock := filepath.Join(dir, "a.sock")
	c := startServeBin(t, bin, env, logs, "serve", "--platform", "aws", "--socket", sock, "--signing-key", filepath.Join(dir, "k"), "--log-level", "warn")
	if h, err := c.Health(t.Context()); err != nil || h.Platform != capability.AWS {
		t.Errorf("GET /healthz: %+v, %v; want platform aws", h, err)
	}
}
