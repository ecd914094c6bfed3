package platform

import (
	"context"

	"github.com/airlock-sandbox/airlock/backend/gcp"
	"github.com/airlock-sandbox/airlock/capability"
)

// GcpConfig places Cloud Run's sandbox launcher and our agent (backend/gcp's Options). It
// applies inside a launcher-enabled Cloud Run container, where a sandbox's root is this
// container's own, so both paths are this container's.
type GcpConfig struct {
	// Launcher is the launcher CLI (default $AIRLOCK_GCP_LAUNCHER, else /usr/local/gcp/bin/sandbox).
	Launcher string `json:"launcher,omitempty"`
	// Agent is the agent binary a sandbox starts (default $AIRLOCK_AGENT, airlock-agent next to
	// airlock or on PATH, else airlock itself).
	Agent string `json:"agent,omitempty"`
	// NoAgent runs commands through the launcher's own exec, for an image the agent cannot
	// run in: no files, pty or background processes (backend/gcp.PublishedNoAgent).
	NoAgent bool `json:"noAgent,omitempty"`
}

// openGcp checks the launcher and the agent; it starts nothing.
func openGcp(ctx context.Context, c Config) (Backend, string, error) {
	b, err := gcp.New(ctx, gcp.Options{Launcher: c.Gcp.Launcher, AgentPath: c.Gcp.Agent, NoAgent: c.Gcp.NoAgent, Logger: c.Logger})
	if err != nil {
		return nil, "", err
	}
	return b, "launcher " + b.Launcher(), nil
}

// publishedGcp is the set gcp publishes for this configuration.
func publishedGcp(c GcpConfig) capability.Set {
	if c.NoAgent {
		return gcp.PublishedNoAgent()
	}
	return gcp.Published()
}
