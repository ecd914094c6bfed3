package aws_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	awsb "github.com/airlock-sandbox/airlock/backend/aws"
	"github.com/airlock-sandbox/airlock/backend/aws/fake"
	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/spec"
)

// agentBin is the agent binary TestMain builds (root only), so the guests run what ships.
var agentBin string

func TestMain(m *testing.M) { os.Exit(testutil.MainWithAgent(m, &agentBin)) }

// Test values: the image's ARN, the reference it was built from, the deny connector.
const (
	testRegion    = "eu-north-1"
	testImage     = "arn:aws:lambda:eu-north-1:123456789012:microvm-image:airlock-test"
	testImageRef  = "registry.example/airlock/python:3"
	testConnector = "arn:aws:lambda:eu-north-1:123456789012:network-connector:airlock-deny"
)

// world is a fake MicroVM service whose guests are local sandboxes.
type world struct {
	fake   *fake.Server
	awsDir string
}

func tempDir(t testing.TB, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix) // short: unix socket paths are limited to 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// newWorld starts the local runtime (root) and the fake over it.
func newWorld(t testing.TB) *world {
	t.Helper()
	testutil.RequireRoot(t)
	localDir := tempDir(t, "aw")
	lb, err := local.New(context.Background(), local.Options{StateDir: localDir, AgentPath: agentBin, ImageCacheDir: filepath.Join(localDir, "images")})
	if err != nil {
		t.Fatal(err)
	}
	guests := &fake.LocalGuests{Backend: lb, StateDir: localDir, Images: map[string]spec.Image{testImage: {Host: true}}}
	f := fake.New(testRegion, guests.Start)
	f.Images = []string{testImage}
	f.Connectors = []string{testConnector}
	f.RestoreFailures = 3
	f.StartDelayGets = 2
	f.TerminatingGets = 2
	t.Cleanup(func() {
		f.Close()
		ctx := context.Background()
		list, _ := lb.List(ctx)
		for _, s := range list {
			if err := lb.Terminate(ctx, s.ID); err != nil {
				t.Errorf("cleanup: local sandbox %s: %v", s.ID, err)
			}
		}
		lb.Close()
	})
	return &world{fake: f, awsDir: tempDir(t, "awsb")}
}

func (w *world) config() awsb.Config {
	return awsb.Config{Region: testRegion, Endpoint: w.fake.URL(), Image: testImage, ImageRef: testImageRef,
		EgressConnector: testConnector, StateDir: w.awsDir, Credentials: fake.Credentials(), ReadyTimeout: 60 * time.Second}
}

func (w *world) backend(t testing.TB, mod ...func(*awsb.Config)) *awsb.Backend {
	t.Helper()
	c := w.config()
	for _, m := range mod {
		m(&c)
	}
	b, err := awsb.New(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func testDecl(id string) spec.Sandbox {
	return spec.Sandbox{ID: id, Image: spec.Image{Ref: testImageRef}}
}
