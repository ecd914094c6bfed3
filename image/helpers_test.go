package image

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"go.uber.org/goleak"

	"github.com/airlock-sandbox/airlock/spec"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		childResolve()
		return
	}
	goleak.VerifyTestMain(m)
}

// childEnv makes the test binary a resolver process for TestTwoProcesses.
const childEnv = "AIRLOCK_IMAGE_TEST_CHILD"

// childResolve resolves AIRLOCK_IMAGE_TEST_CHILD=<layout>\n<cache> and prints
// "<dir> <unpacked 0|1>".
func childResolve() {
	layoutDir, cache, _ := strings.Cut(os.Getenv(childEnv), "\n")
	unpacked := 0
	dir, err := ResolveWith(context.Background(), spec.Image{OCILayout: layoutDir}, cache, ResolveOptions{onUnpack: func(string) { unpacked = 1 }})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(dir, unpacked)
	os.Exit(0)
}

// ent is one tar entry of a crafted layer.
type ent struct {
	name  string
	typ   byte // tar.TypeReg when zero
	body  string
	link  string
	mode  int64 // 0644 / 0755 when zero
	uid   int
	gid   int
	mtime time.Time
}

var testMtime = time.Date(2021, 3, 4, 5, 6, 7, 0, time.UTC)

// f, d, sym and hard build entries concisely.
func f(name, body string) ent     { return ent{name: name, body: body} }
func d(name string) ent           { return ent{name: name, typ: tar.TypeDir} }
func sym(name, target string) ent { return ent{name: name, typ: tar.TypeSymlink, link: target} }
func hard(name, target string) ent {
	return ent{name: name, typ: tar.TypeLink, link: target}
}
func wh(name string) ent { return ent{name: name} } // whiteout markers are empty regular files

func tarOf(t testing.TB, ents []ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{
			Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode,
			Uid: e.uid, Gid: e.gid, ModTime: e.mtime, Format: tar.FormatPAX,
		}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.ModTime.IsZero() {
			h.ModTime = testMtime
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("tar header %q: %v", e.name, err)
		}
		if h.Size > 0 {
			if _, err := io.WriteString(tw, e.body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// gzLayer is a gzip-compressed layer, as registries serve them.
func gzLayer(t testing.TB, ents ...ent) v1.Layer {
	t.Helper()
	b := tarOf(t, ents)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// rawLayer is an uncompressed layer, as `docker save` writes them.
func rawLayer(t testing.TB, ents ...ent) v1.Layer {
	t.Helper()
	return static.NewLayer(tarOf(t, ents), types.OCIUncompressedLayer)
}

func imageOf(t testing.TB, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// imageOfEnts builds one gzip layer per entry list.
func imageOfEnts(t testing.TB, layers ...[]ent) v1.Image {
	t.Helper()
	ls := make([]v1.Layer, len(layers))
	for i, es := range layers {
		ls[i] = gzLayer(t, es...)
	}
	return imageOf(t, ls...)
}

func writeLayout(t testing.TB, img v1.Image) spec.Image {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	return spec.Image{OCILayout: dir}
}

func writeArchive(t testing.TB, img v1.Image) spec.Image {
	t.Helper()
	p := filepath.Join(t.TempDir(), "image.tar")
	ref, err := name.ParseReference("airlock.test/image:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(p, ref, img); err != nil {
		t.Fatal(err)
	}
	return spec.Image{Tarball: p}
}

// serveRegistry runs go-containerregistry's in-memory registry on loopback.
func serveRegistry(t testing.TB) string {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(func() {
		srv.Close()
		if tr, ok := remote.DefaultTransport.(*http.Transport); ok {
			tr.CloseIdleConnections()
		}
		http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	})
	return strings.TrimPrefix(srv.URL, "http://")
}

func pushImage(t testing.TB, host, repoTag string, img v1.Image) spec.Image {
	t.Helper()
	ref, err := name.ParseReference(host + "/" + repoTag)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	return spec.Image{Ref: ref.String()}
}

// counting returns options whose unpack hook counts cache misses.
func counting(n *int) ResolveOptions {
	return ResolveOptions{onUnpack: func(string) { *n++ }}
}

func resolveOK(t testing.TB, src spec.Image, cache string, opts ResolveOptions) string {
	t.Helper()
	dir, err := ResolveWith(context.Background(), src, cache, opts)
	if err != nil {
		t.Fatalf("ResolveWith: %v", err)
	}
	return dir
}

// tree describes a directory: "f:<content>", "d", "l:<target>" per relative path.
func tree(t testing.TB, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			out[rel] = "l:" + l
		case fi.IsDir():
			out[rel] = "d"
		default:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = "f:" + string(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
