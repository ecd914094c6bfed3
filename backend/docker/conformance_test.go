package docker

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/sandbox/conformance"
	"github.com/airlock-sandbox/airlock/spec"
)

// TestConformanceAPI runs the suite through the Engine API against the private dockerd, with
// the test image by reference (loaded by hack/dockerd.sh) and runtime docker declared; the
// tarball is the walk's other image kind.
func TestConformanceAPI(t *testing.T) {
	requireDocker(t)
	conformance.Run(t, func(t *testing.T) sandbox.Backend { return newTestBackend(t, EngineAPI) }, conformance.Options{
		Decl: func(id string) spec.Sandbox {
			return spec.Sandbox{ID: id, Image: spec.Image{Ref: testImageRef}, Runtime: spec.RuntimeDocker}
		},
		Images: []spec.Image{{Tarball: rootfsTar}},
	})
}

// TestConformanceDockerCLI runs the suite through the docker CLI against the same dockerd, with
// the image as a tarball (converted and loaded by the backend).
func TestConformanceDockerCLI(t *testing.T) {
	requireDocker(t)
	conformance.Run(t, func(t *testing.T) sandbox.Backend { return newTestBackend(t, EngineDocker) }, conformance.Options{
		Decl: func(id string) spec.Sandbox {
			return spec.Sandbox{ID: id, Image: spec.Image{Tarball: rootfsTar}, Runtime: spec.RuntimeDocker}
		},
		Images: []spec.Image{{Ref: testImageRef}},
	})
}

// TestConformancePodman runs the suite through the podman CLI (no daemon), with the image as a
// tarball. TestMain installs podman when it is missing.
func TestConformancePodman(t *testing.T) {
	requirePodman(t)
	t.Setenv("CONTAINERS_CONF", podmanConf(t))
	conformance.Run(t, func(t *testing.T) sandbox.Backend { return newTestBackend(t, EnginePodman) }, conformance.Options{
		Decl: func(id string) spec.Sandbox {
			return spec.Sandbox{ID: id, Image: spec.Image{Tarball: rootfsTar}, Runtime: spec.RuntimeDocker}
		},
		// The tarball as podman stored it: a reference to an image in the engine's own store.
		Images: []spec.Image{{Ref: loadedRef(t)}},
	})
}

// loadedRef is the reference the backend tags a loaded tarball with (ensureImage).
func loadedRef(t *testing.T) string {
	img, err := tarball.ImageFromPath(rootfsTar, nil)
	if err != nil {
		t.Fatal(err)
	}
	digest, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	return "airlock.local/image:" + digest.Hex
}

// podmanConf writes a containers.conf that podman 4.3 needs on this kind of machine:
//   - default_ulimits within what a root without CAP_SYS_RESOURCE may set (podman's defaults,
//     nofile 1048576 and nproc 4194304, make every start fail with "setrlimit: Operation not
//     permitted"; nproc above 32768 fails too, podman runs the runtime with that hard limit);
//   - runtime runc: crun 1.8 refuses the hybrid cgroup v1 layout ("cgroups in hybrid mode not
//     supported, drop all controllers from cgroupv2").
func podmanConf(t *testing.T) string {
	var nofile unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &nofile); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf("[containers]\ndefault_ulimits = [\"nofile=%d:%d\", \"nproc=32768:32768\"]\n\n[engine]\nruntime = \"runc\"\n", nofile.Max, nofile.Max)
	p := filepath.Join(t.TempDir(), "containers.conf")
	if err := os.WriteFile(p, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
