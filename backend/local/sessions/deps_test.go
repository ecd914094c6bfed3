package sessions

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLightDependencies keeps this package off the runtime and its heavy libraries: airlock
// run's lean front claims a parked sandbox through it, and every package init it links is paid by every
// run (backend/local's cost a one-shot run ~2 ms).
func TestLightDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	const mod = "github.com/airlock-sandbox/airlock/"
	forbiddenExact := map[string]bool{}
	for _, p := range []string{"sandbox", "spec", "capability", "plan", "backend/local", "backend/local/nsinit", "agent"} {
		forbiddenExact[mod+p] = true
	}
	forbidden := []string{
		"k8s.io/", "sigs.k8s.io/", "gopkg.in/yaml", "go.yaml.in/", "github.com/spf13/",
		"github.com/containerd/", "github.com/google/", "github.com/elastic/", "github.com/landlock-lsm/",
		"github.com/mdlayher/", "github.com/vishvananda/", "github.com/opencontainers/",
	}
	for _, pkg := range strings.Fields(string(out)) {
		if forbiddenExact[pkg] {
			t.Errorf("backend/local/sessions links %s", pkg)
		}
		for _, f := range forbidden {
			if strings.HasPrefix(pkg, f) {
				t.Errorf("backend/local/sessions links %s", pkg)
			}
		}
	}
}
