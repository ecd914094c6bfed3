package platform

import (
	"context"

	"github.com/airlock-sandbox/airlock/backend/kubernetes"
	"github.com/airlock-sandbox/airlock/capability"
)

// KubernetesConfig says how to reach a cluster's airlock broker (backend/kubernetes'
// Discovery): a kubeconfig (from outside: the API server's proxies, as ServiceAccount), the
// pod's own ServiceAccount (inside), or an explicit broker URL with a token file.
type KubernetesConfig struct {
	// Kubeconfig is a path or a $KUBECONFIG-style list (default $KUBECONFIG, ~/.kube/config);
	// Context its context (default the current one).
	Kubeconfig string `json:"kubeconfig,omitempty"`
	Context    string `json:"context,omitempty"`
	// Namespace holds the Sandboxes (default the pod's, the context's, or "default").
	Namespace string `json:"namespace,omitempty"`
	// ServiceAccount ("name" or "namespace/name") is who the broker sees when airlock asks the
	// TokenRequest API for a token.
	ServiceAccount string `json:"serviceAccount,omitempty"`
	// Sandbox serves declarations whose id names no Sandbox (airlock run and run_code
	// generate theirs) when they fit it: same image, limits, egress, env, workdir, ports.
	Sandbox string `json:"sandbox,omitempty"`
	// Broker is the broker's Service, namespace/name:port (default airlock-system/airlock-broker:443).
	Broker string `json:"broker,omitempty"`
	// BrokerURL, set, is dialled directly with TokenFile, CAFile and ServerName.
	BrokerURL  string `json:"brokerURL,omitempty"`
	TokenFile  string `json:"tokenFile,omitempty"`
	CAFile     string `json:"caFile,omitempty"`
	ServerName string `json:"serverName,omitempty"`
	// DirectAgents dials claimed pods' addresses from a kubeconfig too, not the pod proxy.
	DirectAgents bool `json:"directAgents,omitempty"`
}

// openKubernetes finds the broker (files only); it reaches the cluster at the first call. The
// second result says how the cluster was found.
func openKubernetes(ctx context.Context, c Config) (Backend, string, error) {
	k := c.Kubernetes
	cfg, how, err := kubernetes.Discover(ctx, kubernetes.Discovery{
		Kubeconfig: k.Kubeconfig, Context: k.Context, Namespace: k.Namespace, ServiceAccount: k.ServiceAccount,
		Sandbox: k.Sandbox, Broker: k.Broker, BrokerURL: k.BrokerURL, TokenFile: k.TokenFile, CAFile: k.CAFile, ServerName: k.ServerName,
		DirectAgents: k.DirectAgents,
	})
	if err != nil {
		return nil, "", err
	}
	b, err := kubernetes.New(cfg)
	if err != nil {
		return nil, "", err
	}
	return b, how, nil
}

// publishedKubernetes is the kubernetes backend's published set.
func publishedKubernetes() capability.Set { return kubernetes.Published() }
