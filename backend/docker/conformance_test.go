package docker

import (
	"os/exec"
	"testing"

	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/sandbox/conformance"
	"github.com/airlock-sandbox/airlock/spec"
)

// TestConformanceAPI runs the suite through the Engine API against the private dockerd, with
// the test image by reference (loaded by hack/dockerd.sh).
func TestConformanceAPI(t *testing.T) {
	requireDocker(t)
	conformance.Run(t, func(t *testing.T) sandbox.Backend { return newTestBackend(t, EngineAPI) }, conformance.Options{
		Decl: func(id string) spec.Sandbox { return spec.Sandbox{ID: id, Image: spec.Image{Ref: testImageRef}} },
	})
}

// TestConformanceDockerCLI runs the suite through the docker CLI against the same dockerd, with
// the image as a tarball (converted and loaded by the backend).
func TestConformanceDockerCLI(t *testing.T) {
	requireDocker(t)
	conformance.Run(t, func(t *testing.T) sandbox.Backend { return newTestBackend(t, EngineDocker) }, conformance.Options{
		Decl: func(id string) spec.Sandbox { return spec.Sandbox{ID: id, Image: spec.Image{Tarball: rootfsTar}} },
	})
}

// TestConformancePodman runs the suite through the podman CLI (no daemon), with the image as a
// tarball. It runs when podman is installed.
func TestConformancePodman(t *testing.T) {
	requireDocker(t) // for the test image
	if _, err := exec.LookPath("podman"); err != nil {
		t.Skip("podman is not installed (apt-get install podman)")
	}
	conformance.Run(t, func(t *testing.T) sandbox.Backend { return newTestBackend(t, EnginePodman) }, conformance.Options{
		Decl: func(id string) spec.Sandbox { return spec.Sandbox{ID: id, Image: spec.Image{Tarball: rootfsTar}} },
	})
}
