package core

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLeanDependencies keeps this package off what airlock run's front must not link: each
// costs start-up time on every run (DESIGN: start-up is on the hot path).
func TestLeanDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	forbiddenExact := map[string]bool{
		"github.com/airlock-sandbox/airlock/sandbox":    true,
		"github.com/airlock-sandbox/airlock/spec":       true,
		"github.com/airlock-sandbox/airlock/capability": true,
		"github.com/airlock-sandbox/airlock/plan":       true,
	}
	forbidden := []string{
		"github.com/airlock-sandbox/airlock/backend/",
		"k8s.io/", "sigs.k8s.io/", "gopkg.in/yaml", "go.yaml.in/", "github.com/spf13/",
		"github.com/containerd/", "github.com/google/go-containerregistry", "github.com/google/nftables",
		"github.com/mdlayher/", "github.com/elastic/", "github.com/landlock-lsm/", "github.com/fxamacker/",
	}
	for _, pkg := range strings.Fields(string(out)) {
		if forbiddenExact[pkg] {
			t.Errorf("runcode/core links %s", pkg)
		}
		for _, f := range forbidden {
			if strings.HasPrefix(pkg, f) {
				t.Errorf("runcode/core links %s", pkg)
			}
		}
	}
}
