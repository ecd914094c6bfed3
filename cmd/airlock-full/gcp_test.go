package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/platform"
)

// TestPlatformGCP runs the shipped binary on gcp as a Cloud Run workload would, with the fake
// launcher (backend/gcp/fakelauncher) in the launcher's place: the launcher and the agent come
// from the config file's gcp section, the platform from --platform and then from the file.
func TestPlatformGCP(t *testing.T) {
	testutil.RequireRoot(t)
	bin := buildCLI(t, true)
	// The fake's sandboxes see this machine's root (and a /tmp of their own): the agent must
	// be where they can reach it, as it is in a Cloud Run container's image.
	dir, err := os.MkdirTemp("/var/lib", "airlock-gcp-cli-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	agent, launcher := filepath.Join(dir, "airlock-agent"), filepath.Join(dir, "sandbox")
	for out, pkg := range map[string]string{agent: "./cmd/airlock-agent", launcher: "./backend/gcp/fakelauncher"} {
		build := exec.Command("go", "build", "-o", out, pkg)
		build.Dir = "../.."
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, b)
		}
	}
	state, err := os.MkdirTemp("/run", "agc-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(state, 0o711); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		names, _ := os.ReadDir(filepath.Join(state, "names"))
		if len(names) != 0 {
			t.Errorf("sandboxes left behind in the launcher: %v", names)
		}
		for _, n := range names {
			del := exec.Command(launcher, "delete", "--force", n.Name())
			del.Env = append(os.Environ(), "AIRLOCK_FAKE_LAUNCHER_STATE="+state, "AIRLOCK_AGENT="+agent)
			_ = del.Run()
		}
		// The launcher's local runtime made its state dir there: a tmpfs of its own on /run's disk.
		_ = local.RemoveStateDir(state)
	})
	t.Setenv(envServer, "")
	conf := "gcp:\n  launcher: " + launcher + "\n  agent: " + agent + "\n"
	// The fake launcher's own settings (its local runtime's agent, its state).
	fake := []string{"AIRLOCK_FAKE_LAUNCHER_STATE=" + state, "AIRLOCK_AGENT=" + agent, "AIRLOCK_GCP_LAUNCHER=", platform.EnvPlatform + "="}
	for _, tc := range []struct {
		name string
		conf string
		args []string
	}{
		{"by flag", conf, []string{"--platform", "gcp"}},
		{"by config file", "platform: gcp\n" + conf, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := append([]string{platform.EnvConfig + "=" + writeConfigFile(t, tc.conf)}, fake...)
			// The command's own exit status, not the launcher's 0/1, and its output.
			args := append([]string{"run", "-c", "import sys; print(6*7); sys.exit(7)"}, tc.args...)
			code, out, errs := runBin(t, env, bin, args...)
			if code != 7 || out != "42\n" {
				t.Errorf("airlock %q: exit %d, stdout %q, stderr %q", args, code, out, errs)
			}
			code, out, errs = runBin(t, env, bin, append([]string{"capabilities"}, tc.args...)...)
			if code != 0 || !strings.HasPrefix(out, "gcp capabilities (the gcp backend configured here") {
				t.Errorf("capabilities: exit %d, %q %q", code, out, errs)
			}

			cs, logs := connectMCP(t, bin, env, append([]string{"mcp"}, tc.args...)...)
			wantRunCode42(t, cs, logs)
			r, err := cs.CallTool(t.Context(), &sdk.CallToolParams{Name: "sandbox_create", Arguments: map[string]any{}})
			if err != nil || r.IsError {
				t.Errorf("sandbox_create through airlock mcp: %v %s\n%s", err, textOf(r), logs.String())
			}
			closeMCP(t, cs, logs)
		})
	}
}
