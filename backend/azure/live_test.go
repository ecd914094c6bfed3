package azure

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/sandbox/conformance"
	"github.com/airlock-sandbox/airlock/spec"
)

// Live tests run against a real sandbox group when AIRLOCK_LIVE_AZURE_SUBSCRIPTION,
// _RESOURCE_GROUP, _SANDBOX_GROUP and _REGION are set (credentials: DefaultAzureCredential;
// the caller needs Container Apps SandboxGroup Data Owner on the group). Optional:
// AIRLOCK_LIVE_AZURE_SCOPE (the data plane's token scope), AIRLOCK_LIVE_AZURE_DISK_IMAGE
// (default ubuntu). docs/platforms/azure.md says how to run them.

func liveOptions(t *testing.T) Options {
	t.Helper()
	o := Options{
		SubscriptionID: os.Getenv("AIRLOCK_LIVE_AZURE_SUBSCRIPTION"),
		ResourceGroup:  os.Getenv("AIRLOCK_LIVE_AZURE_RESOURCE_GROUP"),
		SandboxGroup:   os.Getenv("AIRLOCK_LIVE_AZURE_SANDBOX_GROUP"),
		Region:         os.Getenv("AIRLOCK_LIVE_AZURE_REGION"),
		DataPlaneScope: os.Getenv("AIRLOCK_LIVE_AZURE_SCOPE"),
	}
	if o.SubscriptionID == "" || o.ResourceGroup == "" || o.SandboxGroup == "" || o.Region == "" {
		t.Skip("AIRLOCK_LIVE_AZURE_SUBSCRIPTION, _RESOURCE_GROUP, _SANDBOX_GROUP and _REGION are not all set")
	}
	return o
}

func liveImage() string {
	if img := os.Getenv("AIRLOCK_LIVE_AZURE_DISK_IMAGE"); img != "" {
		return img
	}
	return "ubuntu"
}

// TestLiveAudience settles the disputed token audience (notes §6): it lists the group's
// sandboxes with each scope and reports which the data plane accepts.
func TestLiveAudience(t *testing.T) {
	o := liveOptions(t)
	ok := 0
	for _, scope := range []string{DefaultDataPlaneScope, "https://management.azuredevcompute.io/.default"} {
		o.DataPlaneScope = scope
		b := newBackend(t, o)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err := b.List(ctx)
		cancel()
		t.Logf("scope %s: %v", scope, err)
		if err == nil {
			ok++
		}
	}
	if ok == 0 {
		t.Fatal("the data plane accepted neither scope")
	}
}

// TestLiveConformance runs the suite's floor against the real data plane (the capability
// subtests assume a sandbox whose deny egress leaves only loopback, which a microVM's policy
// does not: they are the fake's).
func TestLiveConformance(t *testing.T) {
	o := liveOptions(t)
	conformance.Run(t, func(t *testing.T) sandbox.Backend { return newBackend(t, o) }, conformance.Options{
		Decl: func(id string) spec.Sandbox {
			return spec.Sandbox{ID: id, Image: spec.Image{Ref: liveImage()}, Workdir: spec.DefaultWorkdir}
		},
		OpTimeout:        5 * time.Minute,
		Basic:            true,
		PlatformDefaults: true,
	})
}
