package deploy_test

import (
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if operatorPath != "" {
		os.RemoveAll(filepath.Dir(operatorPath))
	}
	os.Exit(code)
}

// update rewrites the generated files (CRD, kustomize base) and the helm template goldens.
var update = flag.Bool("update", false, "rewrite generated files and goldens")

// repoRoot is the module root (this package is deploy/).
func repoRoot(t *testing.T) string {
	t.Helper()
	abs, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// tool returns the path of a binary of the hack/tools module (controller-gen, helm), built once
// per version of that module into a cache outside the clone ($AIRLOCK_TOOLS_CACHE, else the
// user cache dir): the module pins the version, its go.sum hash names the cache entry.
func tool(t *testing.T, name, pkg string) string {
	t.Helper()
	root := repoRoot(t)
	sum, err := os.ReadFile(filepath.Join(root, "hack/tools/go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(sum)
	base := os.Getenv("AIRLOCK_TOOLS_CACHE")
	if base == "" {
		c, err := os.UserCacheDir()
		if err != nil {
			t.Fatal(err)
		}
		base = filepath.Join(c, "airlock-tools")
	}
	dir := filepath.Join(base, hex.EncodeToString(h[:6]))
	bin := filepath.Join(dir, name)
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp, err := os.CreateTemp(dir, "."+name+"-*")
	if err != nil {
		t.Fatal(err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	t.Logf("building %s from hack/tools into %s (once per tools version)", name, dir)
	cmd := exec.Command("go", "build", "-trimpath", "-o", tmp.Name(), pkg)
	cmd.Dir = filepath.Join(root, "hack/tools")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", pkg, err, out)
	}
	// A rename is atomic: a concurrent test sees the old state or the whole binary.
	if err := os.Rename(tmp.Name(), bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

func run(t *testing.T, dir, bin string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("%s %v: %v\n%s%s", filepath.Base(bin), args, err, out, stderr)
	}
	return out
}
