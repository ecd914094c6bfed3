package platform

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/backend/gcp"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// TestOpenGCP: gcp opens where its launcher is (from the config's gcp section), and where it
// is not, Open says what is missing while plan and capabilities read the published set.
func TestOpenGCP(t *testing.T) {
	t.Setenv("AIRLOCK_GCP_LAUNCHER", "")
	dir := t.TempDir()
	launcher, agent := filepath.Join(dir, "sandbox"), filepath.Join(dir, "airlock-agent")
	for _, f := range []string{launcher, agent} {
		if err := os.WriteFile(f, []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b, ch, err := Open(t.Context(), Config{Platform: "gcp", Gcp: GcpConfig{Launcher: launcher, Agent: agent}})
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	if b.Platform() != capability.GCP || ch.Engine != "launcher "+launcher {
		t.Errorf("Open: %s, choice %+v", b.Platform(), ch)
	}
	missing := filepath.Join(dir, "none")
	_, _, err = Open(t.Context(), Config{Platform: "gcp", Gcp: GcpConfig{Launcher: missing, Agent: agent}})
	if !errors.Is(err, sandbox.ErrUnsupported) || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "sandboxLauncher: true") {
		t.Errorf("Open without the launcher: %v", err)
	}
	set, src, err := Capabilities(t.Context(), Config{Platform: "gcp", Gcp: GcpConfig{Launcher: missing, Agent: agent}})
	if err != nil || src.Instance || !reflect.DeepEqual(set, gcp.Published()) || !strings.HasPrefix(src.Text, "as airlock's gcp backend publishes it; none can be opened here") {
		t.Errorf("Capabilities without the launcher: %v %+v", err, src)
	}
	// Configured without the agent, plan reads that path's set, here and where it opens.
	for _, l := range []string{missing, launcher} {
		set, _, err := Capabilities(t.Context(), Config{Platform: "gcp", Gcp: GcpConfig{Launcher: l, NoAgent: true}})
		if err != nil || !reflect.DeepEqual(set, gcp.PublishedNoAgent()) || set.Has(capability.Files) {
			t.Errorf("Capabilities with noAgent, launcher %s: %v, files %v", l, err, set.Has(capability.Files))
		}
	}
}

// TestDeployGCPConfig: the config file deploy/gcp puts in its image is one airlock reads.
func TestDeployGCPConfig(t *testing.T) {
	f, err := LoadFile("../deploy/gcp/config.yaml", true)
	if err != nil {
		t.Fatal(err)
	}
	if f.Platform != "gcp" || f.Gcp.Launcher != gcp.DefaultLauncher || f.Gcp.Agent != "/usr/local/bin/airlock-agent" {
		t.Errorf("deploy/gcp/config.yaml = %+v", f)
	}
}
