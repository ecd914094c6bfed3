package platform

import (
	"context"

	"github.com/airlock-sandbox/airlock/backend/azure"
	"github.com/airlock-sandbox/airlock/capability"
)

// AzureConfig says where the Azure Container Apps sandbox group is (backend/azure's Options).
// Credentials come from the environment (azidentity's DefaultAzureCredential: environment
// variables, workload or managed identity, the az CLI's login).
type AzureConfig struct {
	Subscription  string `json:"subscription,omitempty"`
	ResourceGroup string `json:"resourceGroup,omitempty"`
	SandboxGroup  string `json:"sandboxGroup,omitempty"`
	// Region places the data plane (https://management.{region}.azuredevcompute.io) and a
	// group made by CreateGroup.
	Region      string `json:"region,omitempty"`
	CreateGroup bool   `json:"createGroup,omitempty"`
	// DataPlaneEndpoint and ARMEndpoint override the data plane's and ARM's https base URLs.
	DataPlaneEndpoint string `json:"dataPlaneEndpoint,omitempty"`
	ARMEndpoint       string `json:"armEndpoint,omitempty"`
	// DataPlaneScope is the data plane token's scope (default https://dynamicsessions.io/.default).
	DataPlaneScope string `json:"dataPlaneScope,omitempty"`
	// APIVersion overrides the api-version (default azure.DefaultAPIVersion).
	APIVersion string `json:"apiVersion,omitempty"`
}

// openAzure builds the azure backend; it reaches Azure at the first call.
func openAzure(ctx context.Context, c Config) (Backend, string, error) {
	a := c.Azure
	b, err := azure.New(ctx, azure.Options{
		SubscriptionID: a.Subscription, ResourceGroup: a.ResourceGroup, SandboxGroup: a.SandboxGroup, Region: a.Region,
		CreateGroup: a.CreateGroup, DataPlaneEndpoint: a.DataPlaneEndpoint, ARMEndpoint: a.ARMEndpoint,
		DataPlaneScope: a.DataPlaneScope, APIVersion: a.APIVersion, Logger: c.Logger,
	})
	if err != nil {
		return nil, "", err
	}
	return b, b.Describe(), nil
}

// publishedAzure is the azure backend's published set.
func publishedAzure() capability.Set { return azure.Published() }
