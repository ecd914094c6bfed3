package local

import (
	"testing"

	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/sandbox/conformance"
	"github.com/airlock-sandbox/airlock/spec"
)

func TestConformance(t *testing.T) {
	conformance.Run(t, func(t *testing.T) sandbox.Backend { return newTestBackend(t) }, conformance.Options{
		Decl: func(id string) spec.Sandbox { return spec.Sandbox{ID: id, Image: spec.Image{Host: true}} },
	})
}
