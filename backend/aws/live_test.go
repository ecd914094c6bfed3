package aws_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	awsb "github.com/airlock-sandbox/airlock/backend/aws"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/sandbox/conformance"
	"github.com/airlock-sandbox/airlock/spec"
)

// Live tests against the real service, given a region: they run only where
// AIRLOCK_LIVE_AWS_REGION is set, and then every other setting they need must be set too (a
// missing one fails, it never skips). Credentials come from the SDK's default chain.
//
//	AIRLOCK_LIVE_AWS_REGION     the region of the MicroVM image
//	AIRLOCK_LIVE_AWS_IMAGE      the MicroVM image's ARN (built as docs/platforms/aws.md says)
//	AIRLOCK_LIVE_AWS_IMAGE_REF  the reference its Dockerfile starts FROM
//	AIRLOCK_LIVE_AWS_CONNECTOR  a VPC egress connector whose security group lets nothing out
func liveConfig(t *testing.T) awsb.Config {
	t.Helper()
	region := os.Getenv("AIRLOCK_LIVE_AWS_REGION")
	if region == "" {
		t.Skip("AIRLOCK_LIVE_AWS_REGION is not set: no live AWS tests")
	}
	c := awsb.Config{Region: region, Image: os.Getenv("AIRLOCK_LIVE_AWS_IMAGE"), ImageRef: os.Getenv("AIRLOCK_LIVE_AWS_IMAGE_REF"),
		EgressConnector: os.Getenv("AIRLOCK_LIVE_AWS_CONNECTOR"), StateDir: t.TempDir()}
	for name, v := range map[string]string{"AIRLOCK_LIVE_AWS_IMAGE": c.Image, "AIRLOCK_LIVE_AWS_IMAGE_REF": c.ImageRef, "AIRLOCK_LIVE_AWS_CONNECTOR": c.EgressConnector} {
		if v == "" {
			t.Fatalf("AIRLOCK_LIVE_AWS_REGION is set but %s is not: the live tests need it", name)
		}
	}
	return c
}

// TestLiveConformance runs the suite against real Lambda MicroVMs.
func TestLiveConformance(t *testing.T) {
	c := liveConfig(t)
	conformance.Run(t, func(t *testing.T) sandbox.Backend {
		b, err := awsb.New(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}, conformance.Options{Decl: func(id string) spec.Sandbox { return spec.Sandbox{ID: id, Image: spec.Image{Ref: c.ImageRef}} }})
}

// TestLiveTerminateConfirmed: a terminated MicroVM reads back as gone, and a second terminate
// of it succeeds (the service's terminate is idempotent).
func TestLiveTerminateConfirmed(t *testing.T) {
	c := liveConfig(t)
	b, err := awsb.New(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	sess, err := b.Create(t.Context(), spec.Sandbox{ID: "live-term", Image: spec.Image{Ref: c.ImageRef}})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Terminate(t.Context(), sess.ID); err != nil {
		t.Fatal(err)
	}
	m, err := b.API().Get(t.Context(), sess.ID)
	if err != nil && !awsb.IsNotFound(err) {
		t.Fatal(err)
	}
	if err == nil && m.State != awsb.StateTerminated {
		t.Errorf("after a confirmed Terminate the MicroVM is %s", m.State)
	}
	if err := b.Terminate(t.Context(), sess.ID); err != nil {
		t.Errorf("second Terminate: %v", err)
	}
}

// TestLivePush builds a MicroVM image with airlock image push's code path against the real
// service: AIRLOCK_LIVE_AWS_BUCKET (the bundle's bucket, in the region),
// AIRLOCK_LIVE_AWS_BUILD_ROLE (the build role's ARN) and AIRLOCK_LIVE_AWS_IMAGE_REF (its FROM).
// The image, airlock-live-<random>, is left for the operator to delete.
func TestLivePush(t *testing.T) {
	region := os.Getenv("AIRLOCK_LIVE_AWS_REGION")
	if region == "" {
		t.Skip("AIRLOCK_LIVE_AWS_REGION is not set: no live AWS tests")
	}
	o := awsb.PushOptions{Region: region, Bucket: os.Getenv("AIRLOCK_LIVE_AWS_BUCKET"), BuildRole: os.Getenv("AIRLOCK_LIVE_AWS_BUILD_ROLE"),
		Ref: os.Getenv("AIRLOCK_LIVE_AWS_IMAGE_REF"), PollInterval: 10 * time.Second, Progress: func(s string) { t.Log(s) }}
	for name, v := range map[string]string{"AIRLOCK_LIVE_AWS_BUCKET": o.Bucket, "AIRLOCK_LIVE_AWS_BUILD_ROLE": o.BuildRole, "AIRLOCK_LIVE_AWS_IMAGE_REF": o.Ref} {
		if v == "" {
			t.Fatalf("AIRLOCK_LIVE_AWS_REGION is set but %s is not: the live push needs it", name)
		}
	}
	agent := filepath.Join(t.TempDir(), "airlock-agent")
	build := exec.Command("go", "build", "-trimpath", "-o", agent, "github.com/airlock-sandbox/airlock/cmd/airlock-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=arm64")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build the arm64 agent: %v\n%s", err, out)
	}
	var err error
	if o.Agent, err = os.ReadFile(agent); err != nil {
		t.Fatal(err)
	}
	var b [4]byte
	rand.Read(b[:])
	o.Name = "airlock-live-" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(t.Context(), 45*time.Minute)
	defer cancel()
	res, err := awsb.Push(ctx, o)
	if err != nil {
		t.Fatalf("push: %v", err)
	}
	t.Logf("built %s version %s (delete it when done)", res.Image, res.ImageVersion)
	if res.State != awsb.VersionSuccessful || res.Status != awsb.VersionActive {
		t.Errorf("result %+v", res)
	}
}
