package docker

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"go.uber.org/goleak"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// What TestMain sets up for the root tests (all empty when not root).
var (
	// agentBin is the agent, built static as shipped.
	agentBin string
	// dockerHost is the private dockerd TestMain started (or found running) via hack/dockerd.sh.
	dockerHost string
	// rootfsTar is the test image as a docker-archive (hack/mkrootfs.sh plus shadowedBins),
	// loaded into that dockerd as testImageRef.
	rootfsTar string
	// setupErr is why the engine or image could not be set up; root tests fail with it.
	setupErr error
	// podmanErr is why podman could not be installed.
	podmanErr error
)

const testImageRef = "airlock.local/rootfs:conformance"

// cacheDir holds the private dockerd's data and the test rootfs between runs (outside the repo).
func cacheDir() string {
	if d := os.Getenv("AIRLOCK_DOCKER_DIR"); d != "" {
		return d
	}
	return "/var/cache/airlock-docker"
}

func TestMain(m *testing.M) {
	code := func() int {
		if os.Geteuid() == 0 {
			dir, err := os.MkdirTemp("", "airlock-agent-")
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			defer os.RemoveAll(dir)
			agentBin = filepath.Join(dir, "airlock-agent")
			build := exec.Command("go", "build", "-o", agentBin, "github.com/airlock-sandbox/airlock/cmd/airlock-agent")
			build.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := build.CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "build agent: %v\n%s", err, out)
				return 1
			}
			stop, err := setupDocker()
			if err != nil {
				setupErr = err
				fmt.Fprintln(os.Stderr, "docker setup failed:", err)
			}
			defer stop()
			podmanErr = installPodman()
		}
		return goleakMain(m)
	}()
	os.Exit(code)
}

func goleakMain(m *testing.M) int {
	code := m.Run()
	if code != 0 {
		return code
	}
	if err := goleak.Find(); err != nil {
		fmt.Fprintln(os.Stderr, "goleak:", err)
		return 1
	}
	return 0
}

// setupDocker installs docker.io if needed, starts the private dockerd (unless one already runs
// in the cache dir) and loads the test image. stop stops the dockerd only if this call started it.
func setupDocker() (stop func(), err error) {
	stop = func() {}
	script, err := filepath.Abs("../../hack/dockerd.sh")
	if err != nil {
		return stop, err
	}
	dir := cacheDir()
	wasRunning := dockerdRunning(dir)
	cmd := exec.Command(script, "test-image", "--dir", dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if !wasRunning {
		stop = func() {
			if out, err := exec.Command(script, "stop", "--dir", dir).CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "stop dockerd: %v\n%s", err, out)
			}
		}
	}
	if err != nil {
		return stop, fmt.Errorf("%s test-image --dir %s: %v\n%s", script, dir, err, stderr.String())
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if h, ok := strings.CutPrefix(sc.Text(), "DOCKER_HOST="); ok {
			dockerHost = h
		}
	}
	if dockerHost == "" {
		return stop, fmt.Errorf("%s printed no DOCKER_HOST:\n%s", script, out)
	}
	if rootfsTar, err = conformanceImage(dir); err != nil {
		return stop, err
	}
	if out, err := exec.Command(script, "load", rootfsTar, "--dir", dir).CombinedOutput(); err != nil {
		return stop, fmt.Errorf("%s load %s: %v\n%s", script, rootfsTar, err, out)
	}
	return stop, nil
}

// shadowedBins are coreutils programs hack/mkrootfs.sh leaves out (`command -v` finds the
// shell builtin of the same name, not the file) but the conformance suite runs as argv[0].
var shadowedBins = []string{"/usr/bin/echo", "/usr/bin/test", "/usr/bin/[", "/usr/bin/pwd", "/usr/bin/printf", "/usr/bin/true", "/usr/bin/false"}

// conformanceImage writes dir/rootfs-conformance.tar: the mkrootfs image plus a layer with
// shadowedBins, tagged testImageRef.
func conformanceImage(dir string) (string, error) {
	base, err := tarball.ImageFromPath(filepath.Join(dir, "rootfs.tar"), nil)
	if err != nil {
		return "", err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range shadowedBins {
		b, err := os.ReadFile(p)
		if err != nil {
			return "", fmt.Errorf("conformance image: %w", err)
		}
		hdr := &tar.Header{Name: strings.TrimPrefix(p, "/"), Mode: 0o755, Size: int64(len(b)), Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(hdr); err != nil {
			return "", err
		}
		if _, err := tw.Write(b); err != nil {
			return "", err
		}
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	layerBytes := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerBytes)), nil })
	if err != nil {
		return "", err
	}
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return "", err
	}
	tag, err := name.NewTag(testImageRef)
	if err != nil {
		return "", err
	}
	// Written beside and renamed into place: another test binary may be reading the old one.
	tmp, err := os.CreateTemp(dir, "rootfs-conformance-*.tmp")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if err := tarball.Write(tag, img, tmp); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	out := filepath.Join(dir, "rootfs-conformance.tar")
	return out, os.Rename(tmp.Name(), out)
}

// installPodman installs podman from Debian's packages when it is missing, so that CI runs the
// podman suites too.
func installPodman() error {
	if _, err := exec.LookPath("podman"); err == nil {
		return nil
	}
	cmd := exec.Command("apt-get", "install", "-y", "-o", "DPkg::Lock::Timeout=600", "--no-install-recommends", "podman", "runc")
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get install podman: %v\n%s", err, out)
	}
	return nil
}

// requirePodman is requireDocker (the test image comes from it) plus podman.
func requirePodman(t *testing.T) {
	t.Helper()
	requireDocker(t)
	if podmanErr != nil {
		if os.Getenv("AIRLOCK_REQUIRE_ROOT") == "1" {
			t.Fatalf("podman is not available: %v", podmanErr)
		}
		t.Skipf("podman is not available: %v", podmanErr)
	}
}

// dockerdRunning reports whether the pidfile in dir names a live dockerd.
func dockerdRunning(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "docker.pid"))
	if err != nil {
		return false
	}
	comm, err := os.ReadFile("/proc/" + strings.TrimSpace(string(b)) + "/comm")
	return err == nil && strings.TrimSpace(string(comm)) == "dockerd"
}

// requireDocker skips without root (failing under AIRLOCK_REQUIRE_ROOT=1) and fails when the
// engine could not be set up: a CI run without docker fails rather than skips.
func requireDocker(t *testing.T) {
	t.Helper()
	testutil.RequireRoot(t)
	if setupErr != nil {
		t.Fatalf("the private dockerd and test image are not available: %v", setupErr)
	}
}

// testStateDir is a short state dir (unix socket paths are limited to 107 bytes).
func testStateDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ad")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// newTestBackend returns a backend over a fresh state dir on the given engine; the cleanup
// terminates whatever the test left and checks that nothing remains.
func newTestBackend(t *testing.T, engine string) *Backend {
	t.Helper()
	dir := testStateDir(t)
	b, err := New(context.Background(), Options{StateDir: dir, AgentPath: agentBin, Engine: engine, Host: dockerHost})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		list, err := b.List(ctx)
		if err != nil {
			t.Errorf("cleanup: list: %v", err)
		}
		for _, s := range list {
			if err := b.Terminate(ctx, s.ID); err != nil {
				t.Errorf("cleanup: terminate %s: %v", s.ID, err)
			}
		}
		if left, err := b.eng.list(ctx, map[string]string{labelState: b.tag}); err != nil || len(left) > 0 {
			t.Errorf("cleanup: containers left: %v %v", left, err)
		}
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if e.IsDir() {
				t.Errorf("cleanup: session dir %s left", e.Name())
			}
		}
		cgs, _ := os.ReadDir(b.freezerParent())
		for _, e := range cgs {
			if e.IsDir() {
				t.Errorf("cleanup: freezer cgroup %s left", e.Name())
			}
		}
		if err := os.Remove(b.freezerParent()); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cleanup: %v", err)
		}
		b.Close()
	})
	return b
}
