package aws_test

import (
	"testing"

	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/sandbox/conformance"
)

// TestConformance runs the suite against the fake service, whose guests are local sandboxes
// running our agent behind each MicroVM's endpoint, with the published capabilities.
func TestConformance(t *testing.T) {
	w := newWorld(t)
	conformance.Run(t, func(t *testing.T) sandbox.Backend { return w.backend(t) }, conformance.Options{Decl: testDecl})
}
