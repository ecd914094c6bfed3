package local

import (
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/sandbox/conformance"
	"github.com/airlock-sandbox/airlock/spec"
)

// TestConformance runs the suite with the host image, and the other image kinds (a directory,
// an OCI layout of it, the same image pushed to a loopback registry) for the walk.
func TestConformance(t *testing.T) {
	root := minimalRootfs(t)
	layoutDir := writeOCILayout(t, root)
	conformance.Run(t, func(t *testing.T) sandbox.Backend { return newTestBackend(t) }, conformance.Options{
		Decl:   func(id string) spec.Sandbox { return spec.Sandbox{ID: id, Image: spec.Image{Host: true}} },
		Images: []spec.Image{{Dir: root}, {OCILayout: layoutDir}, pushLayout(t, layoutDir)},
		// Egress other than deny, against hosts the tests make in their own namespaces.
		Extra: []conformance.Subtest{
			{Name: "EgressAllowPublicOnly", Exercises: []capability.Name{capability.PublicOnlyEgress}, Run: TestEgressAllow},
			{Name: "EgressAllowDomains", Exercises: []capability.Name{capability.DomainEgressRules}, Run: TestEgressAllowDomains},
		},
	})
}

// pushLayout pushes the layout's one image to go-containerregistry's in-memory registry on
// loopback and returns its reference.
func pushLayout(t *testing.T, layoutDir string) spec.Image {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(func() {
		srv.Close()
		if tr, ok := remote.DefaultTransport.(*http.Transport); ok {
			tr.CloseIdleConnections()
		}
		http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	})
	p, err := layout.FromPath(layoutDir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	img, err := idx.Image(m.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(strings.TrimPrefix(srv.URL, "http://") + "/conformance/minimal:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	return spec.Image{Ref: ref.String()}
}
