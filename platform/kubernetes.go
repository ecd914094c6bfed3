package platform

import (
	"context"

	"github.com/airlock-sandbox/airlock/backend/kubernetes"
	"github.com/airlock-sandbox/airlock/capability"
)

// KubernetesConfig says how to reach a cluster's airlock broker (backend/kubernetes' Config).
type KubernetesConfig struct {
	BrokerURL  string `json:"brokerURL,omitempty"`
	Namespace  string `json:"namespace,omitempty"`
	TokenFile  string `json:"tokenFile,omitempty"`
	CAFile     string `json:"caFile,omitempty"`
	ServerName string `json:"serverName,omitempty"`
}

// openKubernetes builds the broker client; it reaches the cluster at the first call.
func openKubernetes(_ context.Context, c Config) (Backend, string, error) {
	k := c.Kubernetes
	b, err := kubernetes.New(kubernetes.Config{BrokerURL: k.BrokerURL, Namespace: k.Namespace,
		TokenFile: k.TokenFile, CAFile: k.CAFile, ServerName: k.ServerName})
	if err != nil {
		return nil, "", err
	}
	return b, "", nil
}

// publishedKubernetes is the kubernetes backend's published set.
func publishedKubernetes() capability.Set { return kubernetes.Published() }
