package runcode

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// hostPython is the host's python3 for the loader tests (no sandbox needed), or a skip.
func hostPython(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 on the host")
	}
	return p
}

// TestPyReprToGo: python's repr of a string, read back by Go, is the same string.
func TestPyReprToGo(t *testing.T) {
	py := hostPython(t)
	for _, s := range []string{"", "/opt/lib", "/a:/b", `it's`, `say "hi"`, `both ' and "`, "tab\tnew\nline", `back\slash`, "ünï ✓ 日本", "\x01\x7f"} {
		cmd := exec.Command(py, "-I", "-S", "-c", "import sys; sys.stdout.write(repr(sys.argv[1]))", s)
		out, err := cmd.Output()
		if err != nil {
			t.Fatal(err)
		}
		got, err := strconv.Unquote(pyReprToGo(string(out)))
		if err != nil || got != s {
			t.Errorf("repr %s read back as %q (%v), want %q", out, got, err, s)
		}
	}
}

// TestPythonLoaderHost runs the loader in the host's python, outside any sandbox: for each
// PYTHONPATH the environment may have (unset, empty, one or two directories), a program run
// through the loader sees what `python3 main.py` sees: argv, sys.path, PYTHONPATH, modules,
// stdin, files; and the loader's directory is gone.
func TestPythonLoaderHost(t *testing.T) {
	py := hostPython(t)
	probe := `import os, sys
print(sys.argv, sys.orig_argv, __file__)
print(sys.path)
print(repr(os.environ.get('PYTHONPATH')), 'PYTHONPATH' in os.environ)
print(sorted(sys.modules))
print(sorted(os.listdir('.')), oct(os.stat('main.py').st_mode & 0o777))
print(repr(sys.stdin.read()), sys.stdin.seekable())
`
	bases := []*string{nil, ptr(""), ptr("/opt/one"), ptr("/opt/one:/opt/two")}
	for _, base := range bases {
		for _, stdin := range []*string{nil, ptr("some input\n")} {
			name := fmt.Sprintf("base=%v stdin=%v", deref(base), stdin != nil)
			t.Run(name, func(t *testing.T) {
				env := os.Environ()
				env = slicesDeleteEnv(env, "PYTHONPATH")
				if base != nil {
					env = append(env, "PYTHONPATH="+*base)
				}
				work := t.TempDir()
				if err := os.WriteFile(filepath.Join(work, "main.py"), []byte(probe), 0o644); err != nil {
					t.Fatal(err)
				}
				cold := exec.Command(py, "main.py")
				cold.Dir, cold.Env = work, env
				if stdin != nil {
					cold.Stdin = strings.NewReader(*stdin)
				} // else /dev/null, as a cold run has
				want, err := cold.CombinedOutput()
				if err != nil {
					t.Fatalf("cold: %v\n%s", err, want)
				}
				if err := os.Remove(filepath.Join(work, "main.py")); err != nil {
					t.Fatal(err)
				}

				warm := runPythonThroughLoader(t, py, work, env, base, probe, stdin)
				if warm.status != "exit 0" {
					t.Fatalf("warm: %s\n%s", warm.status, warm.stderr)
				}
				if got := warm.stdout + warm.stderr; got != string(want) {
					t.Errorf("through the loader:\n%s\ncold:\n%s", got, want)
				}
			})
		}
	}
}

func ptr(s string) *string { return &s }

func deref(s *string) string {
	if s == nil {
		return "unset"
	}
	return strconv.Quote(*s)
}

func slicesDeleteEnv(env []string, name string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}
