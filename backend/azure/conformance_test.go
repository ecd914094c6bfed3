package azure

import (
	"testing"

	"github.com/airlock-sandbox/airlock/backend/azure/azurefake"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/sandbox/conformance"
	"github.com/airlock-sandbox/airlock/spec"
)

// TestConformance runs the suite against the fake, whose sandboxes are local ones: the
// published set, with create and delete eventually consistent and the sandbox's state in the
// field the SDK reads. Undeclared properties take the platform's values (PlatformDefaults:
// azure cannot hold airlock's lifetime, idle, disk and process defaults); the workdir the
// suite's subtests look at is declared.
func TestConformance(t *testing.T) {
	f := newFake(t, azurefake.Config{Local: newLocal(t), CreatingPolls: 2, DeletingPolls: 2})
	conformance.Run(t, func(t *testing.T) sandbox.Backend { return newBackend(t, fakeOptions(f)) }, conformance.Options{
		Decl: func(id string) spec.Sandbox {
			return spec.Sandbox{ID: id, Image: spec.Image{Ref: "ubuntu"}, Workdir: spec.DefaultWorkdir}
		},
		PlatformDefaults: true,
	})
}
