package azure

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/backend/azure/azurefake"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

func ubuntu(id string) spec.Sandbox {
	d := spec.Sandbox{ID: id, Image: spec.Image{Ref: "ubuntu"}}
	return d
}

func mustCreate(t *testing.T, b *Backend, d spec.Sandbox) *sandbox.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := b.Create(ctx, planDefaults(b, d))
	if err != nil {
		t.Fatalf("Create(%s): %v", d.ID, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := b.Terminate(ctx, s.ID); err != nil {
			t.Errorf("Terminate(%s): %v", s.ID, err)
		}
	})
	return s
}

func sh(t *testing.T, a sandbox.Agent, script string) (string, sandbox.ExecResult) {
	t.Helper()
	var out, errb bytes.Buffer
	res, err := a.Exec(context.Background(), sandbox.ExecRequest{Shell: script, Timeout: time.Minute}, &out, &errb)
	if err != nil {
		t.Fatalf("exec %q: %v", script, err)
	}
	return out.String(), res
}

// TestTerminateNeverLies: while the confirming GET fails (a 500 whose body reads like a 404),
// terminate is an error; once a GET answers 404 it succeeds, and by then the sandbox (the
// local one behind the fake) is really gone.
func TestTerminateNeverLies(t *testing.T) {
	lb := newLocal(t)
	f := newFake(t, azurefake.Config{Local: lb, DeletingPolls: 3})
	b := newBackend(t, fakeOptions(f))
	s := mustCreate(t, b, ubuntu("never-lies"))
	local := f.LocalSession(s.ID)
	if local == "" {
		t.Fatal("no local sandbox behind the fake's")
	}
	f.Inject(azurefake.Fault{Method: http.MethodGet, Path: "/sandboxes/" + s.ID, Status: 500, Times: 1000,
		Body: `{"error":{"code":"NotFound","message":"404: sandbox not found"}}`})
	ctx := context.Background()
	err := b.Terminate(ctx, s.ID)
	if !errors.Is(err, sandbox.ErrOutcomeUnknown) || errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("Terminate while GET answers 500: %v, want ErrOutcomeUnknown", err)
	}
	f.ClearFaults()
	if err := b.Terminate(ctx, s.ID); err != nil {
		t.Fatalf("Terminate: %v", err)
	}
	if _, err := lb.Get(ctx, local); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("the local sandbox after Terminate: %v, want ErrNotFound", err)
	}
	if _, err := b.Get(ctx, s.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("Get after Terminate: %v", err)
	}
}

// TestExecRunsOnce: a command whose answer is lost after it ran is outcome unknown and is not
// sent again; one refused with 429 before it ran is retried and runs once.
func TestExecRunsOnce(t *testing.T) {
	f := newFake(t, azurefake.Config{Local: newLocal(t)})
	b := newBackend(t, fakeOptions(f))
	s := mustCreate(t, b, ubuntu("runs-once"))
	a, err := b.Connect(context.Background(), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	f.Inject(azurefake.Fault{Path: "/executeShellCommand", Status: 502, After: true, Times: 1})
	_, err = a.Exec(context.Background(), sandbox.ExecRequest{Shell: "echo x >> /tmp/count", Timeout: time.Minute}, nil, nil)
	if !errors.Is(err, sandbox.ErrOutcomeUnknown) {
		t.Fatalf("exec whose answer was a 502: %v, want ErrOutcomeUnknown", err)
	}
	f.Inject(azurefake.Fault{Path: "/executeShellCommand", Status: 429, RetryAfter: "0", Times: 1})
	if out, _ := sh(t, a, "echo y >> /tmp/count; cat /tmp/count"); out != "x\ny\n" {
		t.Errorf("count file %q, want x then y, each once", out)
	}
}

// TestWireReadings: where the notes disagree (state or status, exitCode present or not, a list
// as {value,nextLink} or a bare array, pages), the backend works with each reading.
func TestWireReadings(t *testing.T) {
	lb := newLocal(t)
	for _, tc := range []struct {
		name string
		cfg  azurefake.Config
		n    int
	}{
		{"status field", azurefake.Config{StateField: "status"}, 1},
		{"both fields", azurefake.Config{StateField: "both"}, 1},
		{"no exitCode", azurefake.Config{OmitExitCode: true}, 1},
		{"bare list", azurefake.Config{BareList: true}, 1},
		{"pages", azurefake.Config{PageSize: 1}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Local = lb
			f := newFake(t, tc.cfg)
			b := newBackend(t, fakeOptions(f))
			var ids []string
			for i := range tc.n {
				s := mustCreate(t, b, ubuntu("wire-"+string(rune('a'+i))))
				ids = append(ids, s.ID)
			}
			a, err := b.Connect(context.Background(), ids[0])
			if err != nil {
				t.Fatal(err)
			}
			if out, res := sh(t, a, "echo hi; exit 3"); out != "hi\n" || res.ExitCode != 3 {
				t.Errorf("exit 3: %q %+v", out, res)
			}
			list, err := b.List(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range ids {
				if !slices.ContainsFunc(list, func(s *sandbox.Session) bool { return s.ID == id }) {
					t.Errorf("List misses %s", id)
				}
			}
		})
	}
}

// TestExecQuoting: argv words and env values reach the command as they are, whatever shell
// characters they hold.
func TestExecQuoting(t *testing.T) {
	f := newFake(t, azurefake.Config{Local: newLocal(t)})
	b := newBackend(t, fakeOptions(f))
	s := mustCreate(t, b, ubuntu("quoting"))
	a, err := b.Connect(context.Background(), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	words := []string{"a'b", "$HOME", "`id`", "x\ny", "", "*", `\'"`}
	var out bytes.Buffer
	_, err = a.Exec(context.Background(), sandbox.ExecRequest{Argv: append([]string{"printf", "[%s]"}, words...), Timeout: time.Minute}, &out, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := ""
	for _, w := range words {
		want += "[" + w + "]"
	}
	if out.String() != want {
		t.Errorf("argv: %q, want %q", out.String(), want)
	}
	out.Reset()
	_, err = a.Exec(context.Background(), sandbox.ExecRequest{Shell: `printf '%s' "$V"`, Env: map[string]string{"V": "it's $x `y`"}, Timeout: time.Minute}, &out, nil)
	if err != nil || out.String() != "it's $x `y`" {
		t.Errorf("env value: %q %v", out.String(), err)
	}
	if _, err := a.Exec(context.Background(), sandbox.ExecRequest{Shell: "cat", Stdin: bytes.NewReader(nil), Timeout: time.Minute}, nil, nil); !errors.Is(err, sandbox.ErrUnsupported) {
		t.Errorf("stdin: %v, want ErrUnsupported", err)
	}
}

// TestCreateRefusesUnknownDiskImage: the service's 404 for a disk image is the caller's error,
// and nothing is left behind.
func TestCreateRefusesUnknownDiskImage(t *testing.T) {
	f := newFake(t, azurefake.Config{Local: newLocal(t)})
	b := newBackend(t, fakeOptions(f))
	_, err := b.Create(context.Background(), planDefaults(b, spec.Sandbox{ID: "nope", Image: spec.Image{Ref: "no-such-image"}}))
	if !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("Create from an unknown disk image: %v, want ErrNotFound", err)
	}
	if n := f.Count(); n != 0 {
		t.Errorf("%d sandboxes left", n)
	}
}

// TestFiles: ranges, defaults and errors as agent/client gives them.
func TestFiles(t *testing.T) {
	f := newFake(t, azurefake.Config{Local: newLocal(t)})
	b := newBackend(t, fakeOptions(f))
	s := mustCreate(t, b, ubuntu("files"))
	a, err := b.Connect(context.Background(), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const p = "/workspace/digits"
	if err := a.WriteFile(ctx, p, bytes.NewReader([]byte("0123456789")), 0); err != nil {
		t.Fatal(err)
	}
	if fi, err := a.Stat(ctx, p); err != nil || fi.Mode != 0o644 || fi.Size != 10 || fi.Type != "file" {
		t.Errorf("Stat after a write with mode 0: %+v %v, want a 10-byte 0644 file", fi, err)
	}
	for _, tc := range []struct {
		off, n int64
		want   string
	}{{2, 3, "234"}, {0, 0, "0123456789"}, {0, -1, "0123456789"}, {8, 5, "89"}, {10, 0, ""}} {
		rc, err := a.ReadFile(ctx, p, tc.off, tc.n)
		if err != nil {
			t.Errorf("ReadFile(%d, %d): %v", tc.off, tc.n, err)
			continue
		}
		var got bytes.Buffer
		_, _ = got.ReadFrom(rc)
		rc.Close()
		if got.String() != tc.want {
			t.Errorf("ReadFile(%d, %d) = %q, want %q", tc.off, tc.n, got.String(), tc.want)
		}
	}
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"read past the end", func() error { _, err := a.ReadFile(ctx, p, 11, 0); return err }(), sandbox.ErrInvalid},
		{"read a missing file", func() error { _, err := a.ReadFile(ctx, "/workspace/none", 0, 0); return err }(), sandbox.ErrNotFound},
		{"write into a missing directory", a.WriteFile(ctx, "/workspace/no/such", bytes.NewReader(nil), 0), sandbox.ErrNotFound},
		{"mkdir over a file", a.Mkdir(ctx, p, 0o755), sandbox.ErrConflict},
		{"remove a missing path", a.Remove(ctx, "/workspace/none", false), sandbox.ErrNotFound},
		{"rename a missing path", a.Rename(ctx, "/workspace/none", "/workspace/x"), sandbox.ErrNotFound},
		{"a relative path", a.Mkdir(ctx, "rel", 0o755), sandbox.ErrInvalid},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, tc.err, tc.want)
		}
	}
}
