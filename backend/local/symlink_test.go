package local

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// victimDir is a host directory standing in for what an image's symlinks could aim at (a
// state dir, another sandbox's files): owned by the sandbox root's host uid, so a write that
// follows a symlink on the host side would succeed. Never a real system path.
func victimDir(t *testing.T, uid int) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "al-victim-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "passwd"), []byte("HOST-SECRET:x:0:0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, filepath.Join(dir, "passwd")} {
		if err := os.Lchown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// treeState is every name, mode, owner and content below dir (dir itself included).
func treeState(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		b.WriteString(rel + " " + fi.Mode().String())
		if fi.Mode().IsRegular() {
			c, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			b.Write(bytes.TrimSpace(c))
		}
		b.WriteString("\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestImageSymlinksStayInTheRoot: an image whose /etc, /root, workdir or runtime-owned
// directories are symlinks aimed at host paths (absolute, or relative with enough "..") never
// makes init create, chmod, write or read on the host: the host victim is untouched, and the
// create either fails naming the path or runs with the symlink resolved inside the image.
func TestImageSymlinksStayInTheRoot(t *testing.T) {
	b := newTestBackend(t)
	cases := []struct {
		name    string
		links   map[string]string // image path -> target ("$V" is the victim dir)
		workdir string
	}{
		{"etc absolute", map[string]string{"etc": "$V"}, ""},
		{"etc relative", map[string]string{"etc": "../../../../../../../..$V"}, ""},
		{"etc passwd", map[string]string{"etc/passwd": "$V/passwd", "etc/group": "$V/passwd"}, ""},
		{"etc resolv.conf", map[string]string{"etc/resolv.conf": "$V/resolv.conf"}, ""},
		{"root", map[string]string{"root": "$V"}, ""},
		{"workdir", map[string]string{"work": "$V"}, "/work/sub"},
		{"workdir relative", map[string]string{"work": "../../../../../../..$V"}, "/work/sub"},
		{"workdir itself", map[string]string{"work": "$V"}, "/work"},
		{"workdir to tmp", map[string]string{"work": "../tmp"}, "/work"},
		{"workdir to the agent socket", map[string]string{"work": "/.airlock/run"}, "/work"},
		{"tmp", map[string]string{"tmp": "$V"}, ""},
		{"dev", map[string]string{"dev": "$V"}, ""},
		{"proc", map[string]string{"proc": "$V"}, ""},
		{"sys", map[string]string{"sys": "$V"}, ""},
		{"run and var", map[string]string{"run": "$V", "var": "$V"}, ""},
		{"airlock dir", map[string]string{".airlock": "$V"}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			victim := victimDir(t, b.opts.UIDBase)
			before := treeState(t, victim)
			img := minimalRootfs(t)
			for p, target := range c.links {
				link := filepath.Join(img, p)
				if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(strings.ReplaceAll(target, "$V", victim), link); err != nil {
					t.Fatal(err)
				}
			}
			d := spec.Sandbox{ID: "symlink", Image: spec.Image{Dir: img}, Workdir: c.workdir}
			d.ApplyDefaults()
			ctx := context.Background()
			sess, err := b.Create(ctx, d)
			if err == nil {
				defer func() {
					if err := b.Terminate(ctx, sess.ID); err != nil {
						t.Errorf("terminate: %v", err)
					}
				}()
				checkConfined(t, b, sess.ID)
			} else {
				// A refusal names what it refused.
				named := false
				for p := range c.links {
					named = named || strings.Contains(err.Error(), "/"+p)
				}
				if !named && (c.workdir == "" || !strings.Contains(err.Error(), c.workdir)) {
					t.Errorf("create refused without naming the path: %v", err)
				}
				t.Logf("refused: %v", err)
			}
			if after := treeState(t, victim); after != before {
				t.Errorf("the host victim changed:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
}

// checkConfined runs code in a sandbox that started despite its image's symlinks: no host
// file's content reached its /etc. A failing exec is reported, and the caller still checks
// the host victim.
func checkConfined(t *testing.T, b *Backend, id string) {
	t.Helper()
	ctx := context.Background()
	a, err := b.Connect(ctx, id)
	if err != nil {
		t.Errorf("connect: %v", err)
		return
	}
	defer a.Close()
	var out, errb bytes.Buffer
	res, err := a.Exec(ctx, sandbox.ExecRequest{Shell: "cat /etc/passwd /etc/group; echo x > f && echo wrote", Timeout: 30 * time.Second}, &out, &errb)
	if err != nil {
		t.Errorf("exec: %v", err)
		return
	}
	if strings.Contains(out.String(), "HOST-SECRET") {
		t.Errorf("a host file's content is in the sandbox's /etc: %q", out.String())
	}
	t.Logf("confined: exit %d, %q %q", res.ExitCode, out.String(), errb.String())
}
