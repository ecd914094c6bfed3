package azure

import (
	"context"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/airlock-sandbox/airlock/backend/azure/azurefake"
	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/spec"
)

// agentBin is the agent binary TestMain builds for the fake's local sandboxes (root only).
var agentBin string

func TestMain(m *testing.M) {
	os.Exit(testutil.MainWithAgent(m, &agentBin, goleak.IgnoreAnyFunction("github.com/Azure/azure-sdk-for-go/sdk/azcore/internal/temporal.(*Resource[...]).Get.func1")))
}

// newLocal is a local runtime over a fresh short state dir, for the fake's sandboxes.
func newLocal(t testing.TB) *local.Backend {
	t.Helper()
	testutil.RequireRoot(t)
	dir, err := os.MkdirTemp("", "az")
	if err != nil {
		t.Fatal(err)
	}
	lb, err := local.New(context.Background(), local.Options{StateDir: dir, AgentPath: agentBin})
	if err != nil {
		os.RemoveAll(dir)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		list, _ := lb.List(ctx)
		for _, s := range list {
			if err := lb.Terminate(ctx, s.ID); err != nil {
				t.Errorf("local cleanup: terminate %s: %v", s.ID, err)
			}
		}
		lb.Close()
		os.RemoveAll(dir)
	})
	return lb
}

// newFake starts a fake with one sandbox group "sg"; cfg.Local may be nil for tests that
// make no sandbox.
func newFake(t testing.TB, cfg azurefake.Config) *azurefake.Fake {
	t.Helper()
	if cfg.Groups == nil {
		cfg.Groups = []string{"sg"}
	}
	f := azurefake.New(cfg)
	t.Cleanup(f.Close)
	return f
}

// fakeOptions are Options reaching f's group "sg" with the fake's credential.
func fakeOptions(f *azurefake.Fake) Options {
	return Options{
		SubscriptionID: "00000000-0000-0000-0000-000000000000", ResourceGroup: "rg", SandboxGroup: "sg", Region: "westus2",
		DataPlaneEndpoint: f.DataPlane.URL, ARMEndpoint: f.ARM.URL,
		Credential: azurefake.Credential{}, HTTPClient: f.DataPlane.Client(),
		PollInterval: 100 * time.Millisecond, RetryDelay: 10 * time.Millisecond,
	}
}

func newBackend(t testing.TB, o Options) *Backend {
	t.Helper()
	b, err := New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// planDefaults is the declaration callers hand Create (plan.Defaults on the backend's set).
func planDefaults(b *Backend, d spec.Sandbox) spec.Sandbox {
	return plan.Defaults(b.Platform(), b.Capabilities(context.Background()), d)
}
