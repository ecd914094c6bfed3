package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

func sampleImage(t testing.TB, tag string) v1.Image {
	t.Helper()
	img := imageOfEnts(t,
		[]ent{d("usr"), d("usr/bin"), f("usr/bin/tool", "v1 "+tag), sym("bin", "usr/bin"), f("etc/old", "x")},
		[]ent{f("usr/bin/tool", "v2 "+tag), wh("etc/.wh.old"), f("etc/new", "y")},
	)
	img, err := mutate.Config(img, v1.Config{Env: []string{"PATH=/usr/bin", "TAG=" + tag}, WorkingDir: "/work", User: "1000"})
	if err != nil {
		t.Fatal(err)
	}
	return img
}

var sampleTree = map[string]string{"usr": "d", "usr/bin": "d", "usr/bin/tool": "f:v2 %s", "bin": "l:usr/bin", "etc": "d", "etc/new": "f:y"}

func checkSample(t *testing.T, dir, tag string) {
	t.Helper()
	got := tree(t, dir)
	if len(got) != len(sampleTree) {
		t.Errorf("tree = %v", got)
	}
	for p, w := range sampleTree {
		w = strings.ReplaceAll(w, "%s", tag)
		if got[p] != w {
			t.Errorf("%s = %q, want %q", p, got[p], w)
		}
	}
}

// TestSources resolves the same kind of image from every source kind and checks the tree,
// the progress report and the metadata.
func TestSources(t *testing.T) {
	testutil.RequireRoot(t)
	host := serveRegistry(t)
	rawImg := imageOf(t,
		rawLayer(t, d("usr"), d("usr/bin"), f("usr/bin/tool", "v1 raw"), sym("bin", "usr/bin"), f("etc/old", "x")),
		rawLayer(t, f("usr/bin/tool", "v2 raw"), wh("etc/.wh.old"), f("etc/new", "y")),
	)
	gz := func(tag string) v1.Image { return sampleImage(t, tag) }
	raw := func(string) v1.Image { return rawImg }
	cases := []struct {
		name  string
		tag   string
		image func(tag string) v1.Image
		src   func(img v1.Image, tag string) spec.Image
	}{
		{"oci layout", "layout", gz, func(img v1.Image, _ string) spec.Image { return writeLayout(t, img) }},
		{"docker-archive, gzip layers", "archive", gz, func(img v1.Image, _ string) spec.Image { return writeArchive(t, img) }},
		{"docker-archive, uncompressed layers", "raw", raw, func(img v1.Image, _ string) spec.Image { return writeArchive(t, img) }},
		{"oci layout, uncompressed layers", "raw", raw, func(img v1.Image, _ string) spec.Image { return writeLayout(t, img) }},
		{"registry", "registry", gz, func(img v1.Image, tag string) spec.Image { return pushImage(t, host, "test/sample:"+tag, img) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cache := t.TempDir()
			var calls int
			var last, total int64
			opts := ResolveOptions{Progress: func(done, tot int64) {
				calls++
				if done < last {
					t.Errorf("progress went backwards: %d after %d", done, last)
				}
				last, total = done, tot
			}}
			img := tc.image(tc.tag)
			dir := resolveOK(t, tc.src(img, tc.tag), cache, opts)
			checkSample(t, dir, tc.tag)
			// Progress counts layer bytes as stored: the compressed size, or the raw tar size
			// for uncompressed layers (never a recompression of them).
			var stored int64
			ls, _ := img.Layers()
			for _, l := range ls {
				n, _ := l.Size()
				stored += n
			}
			if calls == 0 || total != stored || last != total {
				t.Errorf("progress: %d calls, last %d/%d; want a final done == total == %d", calls, last, total, stored)
			}
			e, err := Inspect(dir)
			if err != nil {
				t.Fatal(err)
			}
			if filepath.Join(cache, "rootfs", e.Key) != dir || !strings.HasPrefix(e.Digest, "sha256:") || e.Files == 0 {
				t.Errorf("metadata %+v does not describe %s", e, dir)
			}
			if tc.tag != "raw" && (e.Config.WorkingDir != "/work" || e.Config.User != "1000" || len(e.Config.Env) != 2) {
				t.Errorf("metadata config = %+v", e.Config)
			}
		})
	}
}

// TestCacheHit: the second resolve (from any source of the same image) unpacks nothing.
func TestCacheHit(t *testing.T) {
	testutil.RequireRoot(t)
	img := sampleImage(t, "hit")
	cache := t.TempDir()
	var n int
	first := resolveOK(t, writeLayout(t, img), cache, counting(&n))
	// Scribble a marker into the entry: a re-unpack would replace the directory and lose it.
	marker := filepath.Join(first, "marker")
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, src := range []spec.Image{writeLayout(t, img), writeArchive(t, img)} {
		if again := resolveOK(t, src, cache, counting(&n)); again != first {
			t.Errorf("second resolve gave %s, first %s", again, first)
		}
	}
	if n != 1 {
		t.Errorf("unpacked %d times, want 1", n)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("entry was replaced: %v", err)
	}
	// A different ownership mapping is a different tree, so a separate entry.
	shifted := resolveOK(t, writeLayout(t, img), cache, ResolveOptions{UIDBase: 100000, onUnpack: func(string) { n++ }})
	if shifted == first || n != 2 {
		t.Errorf("shifted resolve: dir %s (plain %s), unpacks %d; want a new entry", shifted, first, n)
	}
}

// TestConcurrentResolve: many resolvers of one image unpack it once; the lock is flock on
// separately opened files, which is exactly what separate processes get.
func TestConcurrentResolve(t *testing.T) {
	testutil.RequireRoot(t)
	src := writeLayout(t, sampleImage(t, "conc"))
	cache := t.TempDir()
	var n atomic.Int32
	var wg sync.WaitGroup
	dirs := make([]string, 6)
	errs := make([]error, 6)
	for i := range dirs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dirs[i], errs[i] = ResolveWith(context.Background(), src, cache, ResolveOptions{onUnpack: func(string) { n.Add(1) }})
		}()
	}
	wg.Wait()
	for i := range dirs {
		if errs[i] != nil || dirs[i] != dirs[0] {
			t.Errorf("resolver %d: %s, %v", i, dirs[i], errs[i])
		}
	}
	if n.Load() != 1 {
		t.Errorf("unpacked %d times, want 1", n.Load())
	}
	checkSample(t, dirs[0], "conc")
}

// TestTwoProcesses: resolvers in separate processes share one unpack through the lock file.
func TestTwoProcesses(t *testing.T) {
	testutil.RequireRoot(t)
	src := writeLayout(t, sampleImage(t, "procs"))
	cache := t.TempDir()
	const n = 4
	cmds := make([]*exec.Cmd, n)
	outs := make([]*strings.Builder, n)
	for i := range cmds {
		cmds[i] = exec.Command(os.Args[0])
		cmds[i].Env = append(os.Environ(), childEnv+"="+src.OCILayout+"\n"+cache)
		outs[i] = &strings.Builder{}
		cmds[i].Stdout, cmds[i].Stderr = outs[i], outs[i]
		if err := cmds[i].Start(); err != nil {
			t.Fatal(err)
		}
	}
	unpacks := 0
	var dir string
	for i, c := range cmds {
		if err := c.Wait(); err != nil {
			t.Fatalf("child %d: %v\n%s", i, err, outs[i])
		}
		var d string
		var u int
		if _, err := fmt.Sscan(outs[i].String(), &d, &u); err != nil {
			t.Fatalf("child %d printed %q", i, outs[i])
		}
		if dir != "" && d != dir {
			t.Errorf("child %d got %s, another %s", i, d, dir)
		}
		dir = d
		unpacks += u
	}
	if unpacks != 1 {
		t.Errorf("%d processes unpacked, want exactly 1", unpacks)
	}
	checkSample(t, dir, "procs")
}

// TestCancelWhileWaiting: a resolver waiting for another's lock gives up with its context.
func TestCancelWhileWaiting(t *testing.T) {
	testutil.RequireRoot(t)
	img := sampleImage(t, "cancel")
	cfg, _ := img.ConfigName()
	cache := t.TempDir()
	base := filepath.Join(cache, "rootfs")
	os.MkdirAll(base, 0o755)
	unlock, err := lockKey(context.Background(), base, cfg.Hex, true)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = ResolveWith(ctx, writeLayout(t, img), cache, ResolveOptions{})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

// TestAtomicPublish: a failure part-way leaves no entry, no temp dir, and a later good resolve
// of a different image, or a retry, works; leftovers of a crashed unpack are cleaned.
func TestAtomicPublish(t *testing.T) {
	testutil.RequireRoot(t)
	good := gzLayer(t, f("a", "1"), f("b", "2"))
	cases := []struct {
		name string
		img  func() v1.Image
		want string
	}{
		{"second layer is not a tar", func() v1.Image {
			return imageOf(t, good, static.NewLayer([]byte("this is not a tar archive at all, sorry"+strings.Repeat("!", 600)), types.OCIUncompressedLayer))
		}, "not a valid tar"},
		{"second layer escapes", func() v1.Image {
			return imageOf(t, good, gzLayer(t, f("../x", "evil")))
		}, "../x"},
		{"layer content does not match the config's diff_id", func() v1.Image {
			img := imageOf(t, good, gzLayer(t, f("c", "3")))
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			cf = cf.DeepCopy()
			cf.RootFS.DiffIDs[1] = cf.RootFS.DiffIDs[0]
			img, err = mutate.ConfigFile(img, cf)
			if err != nil {
				t.Fatal(err)
			}
			return img
		}, "config says"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cache := t.TempDir()
			_, err := Resolve(context.Background(), writeLayout(t, tc.img()), cache, nil)
			if !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalid mentioning %q", err, tc.want)
			}
			assertNoEntries(t, cache)
		})
	}

	t.Run("crash leftovers are removed by the next resolve", func(t *testing.T) {
		cache := t.TempDir()
		img := sampleImage(t, "crash")
		cfg, err := img.ConfigName()
		if err != nil {
			t.Fatal(err)
		}
		base := filepath.Join(cache, "rootfs")
		stale := filepath.Join(base, ".tmp-"+cfg.Hex+"-12345")
		other := filepath.Join(base, ".tmp-"+cfg.Hex+"-u100000-999") // another variant's: not ours to remove
		for _, p := range []string{stale, other} {
			if err := os.MkdirAll(filepath.Join(p, "half"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if l, _ := List(cache); len(l) != 0 {
			t.Fatalf("a half-unpacked dir is listed: %v", l)
		}
		dir := resolveOK(t, writeLayout(t, img), cache, ResolveOptions{})
		checkSample(t, dir, "crash")
		if _, err := os.Stat(stale); !os.IsNotExist(err) {
			t.Errorf("stale temp dir survived: %v", err)
		}
		if _, err := os.Stat(other); err != nil {
			t.Errorf("another variant's temp dir was removed: %v", err)
		}
	})
}

func TestListAndPrune(t *testing.T) {
	testutil.RequireRoot(t)
	cache := t.TempDir()
	a := resolveOK(t, writeLayout(t, sampleImage(t, "a")), cache, ResolveOptions{})
	aShift := resolveOK(t, writeLayout(t, sampleImage(t, "a")), cache, ResolveOptions{UIDBase: 100000})
	b := resolveOK(t, writeLayout(t, sampleImage(t, "b")), cache, ResolveOptions{})
	c := resolveOK(t, writeLayout(t, sampleImage(t, "c")), cache, ResolveOptions{})
	l, err := List(cache)
	if err != nil || len(l) != 4 {
		t.Fatalf("List = %v, %v; want 4 entries", l, err)
	}
	ea, _ := Inspect(a)
	base := filepath.Join(cache, "rootfs")
	trash := filepath.Join(base, ".trash-x-1")
	os.MkdirAll(filepath.Join(trash, "root"), 0o755)

	// Keep a by digest (both variants) and c by directory.
	if err := Prune(cache, []string{ea.Digest, c}); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]bool{a: true, aShift: true, b: false, c: true, trash: false} {
		if _, err := os.Stat(p); (err == nil) != want {
			t.Errorf("%s exists=%v, want %v", p, err == nil, want)
		}
	}
	if _, err := os.Stat(b + ".json"); !os.IsNotExist(err) {
		t.Errorf("pruned metadata survived: %v", err)
	}
	// Keep by key.
	eShift, _ := Inspect(aShift)
	if err := Prune(cache, []string{eShift.Key}); err != nil {
		t.Fatal(err)
	}
	l, _ = List(cache)
	if len(l) != 1 || l[0].Dir != aShift {
		t.Errorf("after prune by key: %v", l)
	}
	if err := Prune(cache, nil); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(base)
	if len(ents) != 0 {
		t.Errorf("prune everything left %v", ents)
	}
	// A pruned image resolves again.
	checkSample(t, resolveOK(t, writeLayout(t, sampleImage(t, "b")), cache, ResolveOptions{}), "b")
	if l, err := List(filepath.Join(cache, "missing")); err != nil || len(l) != 0 {
		t.Errorf("List of a missing cache = %v, %v", l, err)
	}
}

// TestPruneSkipsBusy: an entry whose lock is held (being unpacked) is left alone.
func TestPruneSkipsBusy(t *testing.T) {
	testutil.RequireRoot(t)
	cache := t.TempDir()
	dir := resolveOK(t, writeLayout(t, sampleImage(t, "busy")), cache, ResolveOptions{})
	e, _ := Inspect(dir)
	unlock, err := lockKey(context.Background(), filepath.Join(cache, "rootfs"), e.Key, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := Prune(cache, nil); err != nil {
		t.Fatal(err)
	}
	if !isDir(dir) {
		t.Error("prune removed an entry whose lock was held")
	}
	unlock()
	if err := Prune(cache, nil); err != nil {
		t.Fatal(err)
	}
	if isDir(dir) {
		t.Error("prune kept an unlocked, unwanted entry")
	}
}

func TestLoadErrors(t *testing.T) {
	host := serveRegistry(t)
	pushImage(t, host, "test/present:1", sampleImage(t, "p"))
	notLayout := t.TempDir()
	garbage := filepath.Join(t.TempDir(), "garbage.tar")
	os.WriteFile(garbage, []byte("not a tar"), 0o644)

	// A port with nothing listening.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := ln.Addr().String()
	ln.Close()

	armImg, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{OS: "linux", Architecture: "not-" + platform().Architecture})
	if err != nil {
		t.Fatal(err)
	}
	twoImages := filepath.Join(t.TempDir(), "two")
	p, err := layout.Write(twoImages, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	p.AppendImage(sampleImage(t, "one"))
	p.AppendImage(sampleImage(t, "two"))

	cases := []struct {
		name string
		src  spec.Image
		want error
		says string
	}{
		{"no source", spec.Image{}, sandbox.ErrInvalid, "exactly one"},
		{"two sources", spec.Image{Ref: "x", OCILayout: "/y"}, sandbox.ErrInvalid, "ociLayout"},
		{"dir is not an OCI source", spec.Image{Dir: "/srv/root"}, sandbox.ErrInvalid, "dir"},
		{"host is not an OCI source", spec.Image{Host: true}, sandbox.ErrInvalid, "host"},
		{"missing layout", spec.Image{OCILayout: "/nonexistent/layout"}, sandbox.ErrNotFound, "/nonexistent/layout"},
		{"dir that is not a layout", spec.Image{OCILayout: notLayout}, sandbox.ErrInvalid, notLayout},
		{"layout with two images", spec.Image{OCILayout: twoImages}, sandbox.ErrInvalid, "holds 2 images"},
		{"missing tarball", spec.Image{Tarball: "/nonexistent/x.tar"}, sandbox.ErrNotFound, "/nonexistent/x.tar"},
		{"garbage tarball", spec.Image{Tarball: garbage}, sandbox.ErrInvalid, garbage},
		{"malformed ref", spec.Image{Ref: "UPPER/Case:!!"}, sandbox.ErrInvalid, "UPPER"},
		{"missing tag", spec.Image{Ref: host + "/test/present:nope"}, sandbox.ErrNotFound, "nope"},
		{"missing repository", spec.Image{Ref: host + "/test/absent:1"}, sandbox.ErrNotFound, "absent"},
		{"registry down", spec.Image{Ref: down + "/test/present:1"}, sandbox.ErrUnreachable, down},
		{"other architecture", writeLayout(t, armImg), sandbox.ErrInvalid, "not-" + platform().Architecture},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(context.Background(), tc.src)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("Load: err = %v, want %v mentioning %q", err, tc.want, tc.says)
			}
			cache := t.TempDir()
			_, err = Resolve(context.Background(), tc.src, cache, nil)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("Resolve: err = %v, want %v mentioning %q", err, tc.want, tc.says)
			}
			assertNoEntries(t, cache)
		})
	}
}

func TestConfig(t *testing.T) {
	img, err := Load(context.Background(), writeLayout(t, sampleImage(t, "cfg")))
	if err != nil {
		t.Fatal(err)
	}
	c, err := Config(img)
	if err != nil {
		t.Fatal(err)
	}
	if c.WorkingDir != "/work" || c.User != "1000" || strings.Join(c.Env, ",") != "PATH=/usr/bin,TAG=cfg" {
		t.Errorf("Config = %+v", c)
	}
}

func TestOptionsValidation(t *testing.T) {
	src := spec.Image{OCILayout: "/unused"}
	cases := []struct {
		name string
		opts ResolveOptions
		dir  string
		says string
	}{
		{"negative base", ResolveOptions{UIDBase: -1}, "c", "UIDBase"},
		{"negative count", ResolveOptions{IDCount: -1}, "c", "IDCount"},
		{"nochown with base", ResolveOptions{NoChown: true, UIDBase: 5}, "c", "NoChown"},
		{"no cache dir", ResolveOptions{}, "", "cache directory"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ResolveWith(context.Background(), src, tc.dir, tc.opts)
			if !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("err = %v, want ErrInvalid mentioning %q", err, tc.says)
			}
		})
	}
}

// TestRegistryFailsMidPull: the manifest and config arrive but a layer blob does not; the error
// is classed and nothing is published.
func TestRegistryFailsMidPull(t *testing.T) {
	testutil.RequireRoot(t)
	cases := []struct {
		name string
		fail func(w http.ResponseWriter)
		want error
	}{
		{"blob unknown", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"errors":[{"code":"BLOB_UNKNOWN","message":"gone"}]}`)
		}, sandbox.ErrNotFound},
		{"connection dropped", func(w http.ResponseWriter) {
			c, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				c.Close()
			}
		}, sandbox.ErrUnreachable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			img := sampleImage(t, "mid")
			cfg, err := img.ConfigName()
			if err != nil {
				t.Fatal(err)
			}
			reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
			var failing atomic.Bool
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if failing.Load() && r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") && !strings.Contains(r.URL.Path, cfg.Hex) {
					tc.fail(w)
					return
				}
				reg.ServeHTTP(w, r)
			}))
			t.Cleanup(func() {
				srv.Close()
				if tr, ok := remote.DefaultTransport.(*http.Transport); ok {
					tr.CloseIdleConnections()
				}
			})
			src := pushImage(t, strings.TrimPrefix(srv.URL, "http://"), "test/mid:1", img)
			failing.Store(true)
			cache := t.TempDir()
			_, err = Resolve(context.Background(), src, cache, nil)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			assertNoEntries(t, cache)
		})
	}
}
