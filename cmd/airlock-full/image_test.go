package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	awsb "github.com/airlock-sandbox/airlock/backend/aws"
	"github.com/airlock-sandbox/airlock/backend/aws/fake"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/platform"
	"github.com/airlock-sandbox/airlock/spec"
)

// buildArm64Agent cross-compiles our agent for arm64, as a MicroVM image carries it.
func buildArm64Agent(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "airlock-agent-linux-arm64")
	build := exec.Command("go", "build", "-trimpath", "-o", out, "github.com/airlock-sandbox/airlock/cmd/airlock-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=arm64")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build airlock-agent for arm64: %v\n%s", err, b)
	}
	return out
}

// TestImagePushAWS runs airlock image push --platform aws from the built binary against the
// fake (its MicroVM API and S3): a stack's image is built into a MicroVM image with our arm64
// agent, the build's states are shown, and what the aws section takes is printed, as text and
// as JSON; faults in the upload and the build are retried through, a failed build names the
// service's reason, and what cannot be built is refused. As root, airlock run then runs a
// sandbox on the pushed image, whose guest the fake starts from the bundle's FROM.
func TestImagePushAWS(t *testing.T) {
	bin := buildCLI(t, false)
	agent := buildArm64Agent(t)
	const (
		region = "eu-north-1"
		ref    = "registry.example/airlock/python:3"
		bucket = "airlock-images"
		role   = "arn:aws:iam::123456789012:role/airlock-microvm-build"
		arn    = "arn:aws:lambda:eu-north-1:123456789012:microvm-image:airlock-cli"
		conn   = "arn:aws:lambda:eu-north-1:123456789012:network-connector:airlock-deny"
	)
	guests := &fake.LocalGuests{FromRef: map[string]spec.Image{ref: {Host: true}}}
	f := fake.New(region, guests.Start)
	f.Buckets, f.BuildSteps, f.Connectors = []string{bucket}, 3, []string{conn}
	t.Cleanup(f.Close)
	dir := t.TempDir()
	stack := filepath.Join(dir, "stack.yaml")
	if err := os.WriteFile(stack, []byte("apiVersion: airlock.dev/v1alpha1\nsandboxes:\n  - id: tool\n    image: "+ref+"\n  - id: local\n    image: ./root\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	section := "aws:\n  region: " + region + "\n  endpoint: " + f.URL() + "\n  s3Endpoint: " + f.S3URL() + "\n  imageBucket: " + bucket + "\n  buildRole: " + role + "\n"
	cfg := writeConfigFile(t, section)
	none := filepath.Join(dir, "none")
	env := []string{platform.EnvConfig + "=" + cfg, platform.EnvPlatform + "=", "AWS_REGION=", "AWS_PROFILE=",
		"AWS_ACCESS_KEY_ID=" + fake.AccessKey, "AWS_SECRET_ACCESS_KEY=" + fake.SecretKey, "AWS_SESSION_TOKEN=",
		"AWS_SHARED_CREDENTIALS_FILE=" + none, "AWS_CONFIG_FILE=" + none, "AWS_EC2_METADATA_DISABLED=true", "AIRLOCK_AGENT_ARM64=" + agent}
	push := func(args ...string) (int, string, string) {
		t.Helper()
		return runBin(t, env, bin, append([]string{"image", "push", "--platform", "aws", "--poll", "10ms"}, args...)...)
	}

	// A throttled upload and throttled reads of the build are retried through.
	f.Inject("PutObject", fake.Fault{Status: 503, Type: "SlowDown", Message: "Please reduce your request rate."})
	f.Inject("GetMicrovmImageVersion", fake.Fault{Status: 429, Type: awsb.TypeThrottling, Message: "Rate exceeded"})
	code, out, errs := push("-f", stack, "--sandbox", "tool", "--name", "airlock-cli")
	if code != 0 {
		t.Fatalf("image push: exit %d\nstdout %s\nstderr %s", code, out, errs)
	}
	for _, want := range []string{"\n  image: " + arn + "\n", "\n  imageVersion: \"1.0\"\n", "\n  imageRef: " + ref + "\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	i, j, k := strings.Index(errs, "build PENDING"), strings.Index(errs, "build IN_PROGRESS"), strings.Index(errs, "build SUCCESSFUL")
	if i < 0 || j < i || k < j || !strings.Contains(errs, "image push: uploaded s3://"+bucket+"/airlock/images/airlock-cli/") {
		t.Errorf("progress does not show the upload and the build's states in order:\n%s", errs)
	}
	if f.Calls("PutObject") != 2 {
		t.Errorf("PutObject calls %d, want 2 (one throttled)", f.Calls("PutObject"))
	}
	// What went up is our agent, for arm64, executable.
	objs := f.Objects()
	if len(objs) != 1 {
		t.Fatalf("objects %v", objs)
	}
	obj, _ := f.Object(bucket, strings.TrimPrefix(objs[0], bucket+"/"))
	files, err := awsb.ReadBundle(obj, 256<<20)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(agent)
	if a := files[awsb.BundleAgentPath]; string(a.Data) != string(want) || a.Mode.Perm() != 0o755 {
		t.Errorf("the bundle's agent is not the arm64 agent, or mode %v", a.Mode)
	}

	// A second version, as JSON.
	code, out, errs = runBin(t, env, bin, "-o", "json", "image", "push", "--platform", "aws", "--poll", "10ms", "--ref", ref, "--image", arn)
	var res awsb.PushResult
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || res.Image != arn || res.ImageVersion != "2.0" || res.ImageRef != ref || res.State != awsb.VersionSuccessful {
		t.Errorf("push -o json: exit %d, %+v\nstdout %s\nstderr %s", code, res, out, errs)
	}

	// A build the service fails: exit 1, its reason on stderr.
	f.FailBuild("Step 1/6 : FROM registry.example/airlock/python:3: pull access denied")
	code, _, errs = push("--ref", ref, "--image", arn)
	if code != 1 || !strings.Contains(errs, "build FAILED") || !strings.Contains(errs, "pull access denied") {
		t.Errorf("failed build: exit %d, stderr %s", code, errs)
	}

	script := filepath.Join(dir, "agent.sh")
	os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"a local image", []string{"-f", stack, "--sandbox", "local", "--name", "x"}, "a dir image is on this machine only"},
		{"several images", []string{"-f", stack, "--name", "x"}, "declare 2 images"},
		{"no image", []string{"--name", "x"}, "a stack file (-f) or a reference (--ref)"},
		{"not an arm64 agent", []string{"--ref", ref, "--name", "x", "--agent", script}, "not an ELF executable"},
		{"name and image", []string{"--ref", ref, "--name", "x", "--image", arn}, "not both or neither"},
		{"another platform", []string{"--ref", ref, "--name", "x", "--platform", "local"}, "builds images for aws only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errs := push(tc.args...)
			if code != 2 || !strings.Contains(errs, tc.want) {
				t.Errorf("exit %d, stderr %s; want 2 naming %q", code, errs, tc.want)
			}
		})
	}
	if n := f.ImageNames(); len(n) != 1 {
		t.Errorf("images the fake holds: %v", n)
	}

	t.Run("run the pushed image", func(t *testing.T) {
		testutil.RequireRoot(t)
		e := newRuntimeEnv(t)
		lb := e.open(t)
		t.Cleanup(func() { lb.Close() })
		guests.Backend, guests.StateDir = lb, e.stateDir
		awsDir, err := os.MkdirTemp("", "aa")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(awsDir) })
		runCfg := writeConfigFile(t, section+"  image: "+arn+"\n  imageRef: "+ref+"\n  egressConnector: "+conn+"\n  stateDir: "+awsDir+"\n")
		renv := append(env[1:len(env):len(env)], platform.EnvConfig+"="+runCfg)
		code, out, errs := runBin(t, renv, bin, "run", "--platform", "aws", "--image", ref, "-c", "print(6*7)")
		if code != 0 || out != "42\n" {
			t.Errorf("airlock run on the pushed image: exit %d, stdout %q, stderr %q", code, out, errs)
		}
		if run := f.Running(); len(run) != 0 {
			t.Errorf("MicroVMs still run: %v", run)
		}
	})
}
