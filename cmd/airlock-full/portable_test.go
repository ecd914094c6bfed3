package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestOffLinuxLinksNoLocalRuntime: built for darwin or windows, the two CLI binaries link none
// of the local runtime's Linux-only packages (they are behind build tags, and what only the
// local runtime does refuses naming the platform). hack/test-all.sh cross-compiles them too;
// this names the package that crept in.
func TestOffLinuxLinksNoLocalRuntime(t *testing.T) {
	linuxOnly := []string{
		"github.com/airlock-sandbox/airlock/backend/local", // and its sub-packages
		"github.com/airlock-sandbox/airlock/internal/agentcmd",
		"github.com/airlock-sandbox/airlock/internal/gc",
		"github.com/containerd/cgroups", "github.com/google/nftables", "github.com/mdlayher/",
	}
	// Packages off Linux that hold only what is portable of a Linux-only whole.
	portableParts := map[string]bool{"github.com/airlock-sandbox/airlock/backend/local/sessions": true}
	for _, goos := range []string{"darwin", "windows"} {
		cmd := exec.Command("go", "list", "-deps", "../airlock", ".")
		cmd.Env = append(os.Environ(), "GOOS="+goos)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("GOOS=%s go list: %v", goos, err)
		}
		for _, pkg := range strings.Fields(string(out)) {
			if portableParts[pkg] {
				continue
			}
			for _, l := range linuxOnly {
				if strings.HasPrefix(pkg, l) {
					t.Errorf("GOOS=%s: the CLI links %s", goos, pkg)
				}
			}
		}
	}
}
