package azure

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/backend/azure/azurefake"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// shells are the shells the wrapper must work under (the service's is not documented).
func shells(t *testing.T) []string {
	var out []string
	for _, s := range []string{"/bin/sh", "/bin/dash", "/bin/bash"} {
		if _, err := os.Stat(s); err == nil {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		t.Fatal("no shell")
	}
	return out
}

// runWrapped runs the wrapper as executeShellCommand would: a shell given the script, output
// read whole.
func runWrapped(t *testing.T, shell, cmd string, timeout time.Duration, env ...string) (stdout, stderr string, status int, timedOut bool) {
	t.Helper()
	nonce, err := newNonce()
	if err != nil {
		t.Fatal(err)
	}
	c := exec.Command(shell, "-c", wrap(nonce, cmd, timeout))
	c.Env = append(os.Environ(), env...)
	var o, e strings.Builder
	c.Stdout, c.Stderr = &o, &e
	if err := c.Run(); err != nil {
		t.Fatalf("%s: wrapper exited %v; stderr %q", shell, err, e.String())
	}
	rest, st, to, ok := trailer(e.String(), nonce)
	if !ok {
		t.Fatalf("%s: no trailer in stderr %q", shell, e.String())
	}
	return o.String(), rest, st, to
}

// TestWrapHoldsDeadline: under each shell, the wrapper reports exit codes, keeps the streams
// apart, kills at the deadline (and says so), and leaves nothing of the command's group behind.
func TestWrapHoldsDeadline(t *testing.T) {
	for _, sh := range shells(t) {
		t.Run(strings.TrimPrefix(sh, "/bin/"), func(t *testing.T) {
			out, errs, st, to := runWrapped(t, sh, "echo out; echo err >&2; exit 42", time.Minute)
			if out != "out\n" || errs != "err\n" || st != 42 || to {
				t.Errorf("exit 42: %q %q %d %v", out, errs, st, to)
			}
			// The deadline leaves a loaded machine time to start the shell and echo.
			out, _, st, to = runWrapped(t, sh, "echo started; sleep 600", 3*time.Second)
			if out != "started\n" || !to || st != 137 {
				t.Errorf("sleep past the deadline: %q status %d timedOut %v", out, st, to)
			}
			_, _, st, to = runWrapped(t, sh, "kill -9 $$", time.Minute)
			if st != 137 || to {
				t.Errorf("kill -9 $$: status %d timedOut %v", st, to)
			}
			// Input is closed.
			out, _, _, _ = runWrapped(t, sh, "cat; echo done", time.Minute)
			if out != "done\n" {
				t.Errorf("cat with stdin closed: %q", out)
			}
			// A child left in the command's group dies with the exec.
			out, _, _, _ = runWrapped(t, sh, "sleep 600 & echo $!", time.Minute)
			pid, err := strconv.Atoi(strings.TrimSpace(out))
			if err != nil {
				t.Fatalf("pid %q", out)
			}
			gone := false
			for wait := time.Now().Add(30 * time.Second); time.Now().Before(wait); {
				if syscall.Kill(pid, 0) != nil {
					gone = true
					break
				}
				// A zombie (reaped by init later) still answers kill 0: look at its state.
				if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil && strings.Contains(string(b), ") Z ") {
					gone = true
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if !gone {
				syscall.Kill(pid, syscall.SIGKILL)
				t.Errorf("the command's background child %d outlived the exec", pid)
			}
			// Without setsid the wrapper refuses to run the command rather than run it unbounded.
			dir := t.TempDir()
			_, _, st, _ = runWrapped(t, sh, "echo ran", time.Minute, "PATH="+dir)
			if st != statusNoSetsid {
				t.Errorf("without setsid: status %d, want %d", st, statusNoSetsid)
			}
		})
	}
}

// TestTrailer: only the trailer with this call's nonce counts; a forged one in the command's
// own output does not.
func TestTrailer(t *testing.T) {
	for _, tc := range []struct {
		stderr, rest string
		status       int
		timedOut, ok bool
	}{
		{"\nN 0 0\n", "", 0, false, true},
		{"oops\n\nN 3 1\n", "oops\n", 3, true, true},
		{"no newline at end\nN 1 0\n", "no newline at end", 1, false, true},
		{"\nX 0 0\n", "", 0, false, false},
		{"", "", 0, false, false},
		{"\nN 0\n", "", 0, false, false},
		{"\nN zero 0\n", "", 0, false, false},
	} {
		rest, st, to, ok := trailer(tc.stderr, "N")
		if ok != tc.ok || ok && (rest != tc.rest || st != tc.status || to != tc.timedOut) {
			t.Errorf("trailer(%q) = %q %d %v %v", tc.stderr, rest, st, to, ok)
		}
	}
}

// TestResolve: what reaches the wire for a declaration, and what is refused naming the field.
func TestResolve(t *testing.T) {
	base := func() spec.Sandbox {
		d := spec.Sandbox{ID: "r", Image: spec.Image{Ref: "ubuntu"}}
		d.ApplyDefaults()
		return d
	}
	for _, tc := range []struct {
		name  string
		mod   func(*spec.Sandbox)
		check func(*testing.T, *resolved)
		err   error
		field string
	}{
		{"defaults", func(*spec.Sandbox) {}, func(t *testing.T, r *resolved) {
			if r.body.SourcesRef.DiskImage.Name != "ubuntu" || !r.body.SourcesRef.DiskImage.IsPublic {
				t.Errorf("sourcesRef %+v", r.body.SourcesRef.DiskImage)
			}
			if r.body.EgressPolicy.DefaultAction != "Deny" || len(r.body.EgressPolicy.HostRules) != 0 {
				t.Errorf("egress %+v", r.body.EgressPolicy)
			}
			if r.body.Labels[labelManaged] != "true" || r.body.Labels[labelSandbox] != "r" || r.workdir != spec.DefaultWorkdir {
				t.Errorf("labels %v workdir %q", r.body.Labels, r.workdir)
			}
		}, nil, ""},
		{"sizes are the declared ones", func(d *spec.Sandbox) { d.Limits.CPU, d.Limits.Memory = "1500m", "768Mi" }, func(t *testing.T, r *resolved) {
			if r.body.Resources != (resources{CPU: "1500m", Memory: "768Mi"}) {
				t.Errorf("resources %+v", r.body.Resources)
			}
		}, nil, ""},
		{"allowDomains", func(d *spec.Sandbox) {
			d.Egress = spec.Egress{Mode: spec.EgressAllowDomains, Domains: []string{"example.com", "*.github.com"}}
		}, func(t *testing.T, r *resolved) {
			p := r.body.EgressPolicy
			if p.DefaultAction != "Deny" || len(p.HostRules) != 2 || p.HostRules[1] != (hostRule{Pattern: "*.github.com", Action: "Allow"}) {
				t.Errorf("policy %+v", p)
			}
		}, nil, ""},
		{"open", func(d *spec.Sandbox) { d.Egress = spec.Egress{Mode: spec.EgressOpen} }, func(t *testing.T, r *resolved) {
			if r.body.EgressPolicy.DefaultAction != "Allow" {
				t.Errorf("policy %+v", r.body.EgressPolicy)
			}
		}, nil, ""},
		{"env at create", func(d *spec.Sandbox) { d.Env = map[string]string{"A": "b"} }, func(t *testing.T, r *resolved) {
			if r.body.Environment["A"] != "b" {
				t.Errorf("environment %v", r.body.Environment)
			}
		}, nil, ""},
		{"an OCI reference", func(d *spec.Sandbox) { d.Image = spec.Image{Ref: "docker.io/library/python:3.12"} }, nil, sandbox.ErrInvalid, "image"},
		{"cpu above L", func(d *spec.Sandbox) { d.Limits.CPU = "3" }, nil, sandbox.ErrInvalid, "limits.cpu"},
		{"memory above L", func(d *spec.Sandbox) { d.Limits.Memory = "5Gi" }, nil, sandbox.ErrInvalid, "limits.memory"},
		{"public-only egress", func(d *spec.Sandbox) { d.Egress = spec.Egress{Mode: spec.EgressAllow} }, nil, sandbox.ErrUnsupported, "publicOnlyEgress"},
		{"our label prefix", func(d *spec.Sandbox) { d.Labels = map[string]string{"airlock-sandbox": "x"} }, nil, sandbox.ErrInvalid, "labels"},
		{"workdir /", func(d *spec.Sandbox) { d.Workdir = "/" }, nil, sandbox.ErrInvalid, "workdir"},
		{"preview ports", func(d *spec.Sandbox) { d.PreviewPorts = []int{8080} }, nil, sandbox.ErrUnsupported, "preview"},
		{"host image", func(d *spec.Sandbox) { d.Image = spec.Image{Host: true} }, nil, sandbox.ErrUnsupported, "imageRef"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := base()
			tc.mod(&d)
			r, err := resolve(d)
			if tc.err != nil {
				if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.field) {
					t.Fatalf("resolve = %v, want %v naming %s", err, tc.err, tc.field)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, r)
		})
	}
}

// TestStatusIsStructural: against the fake's data plane (no sandbox needed), a 404 is gone,
// and anything else is not, whatever its body says; terminate of an absent sandbox is done
// only once a GET answers 404.
func TestStatusIsStructural(t *testing.T) {
	ctx := context.Background()
	const id = "0b0e4c8e-0000-4000-8000-000000000001"
	notFoundBody := `{"error":{"code":"SandboxNotFound","message":"sandbox ` + id + ` not found (404)"}}`
	for _, tc := range []struct {
		name   string
		faults []azurefake.Fault
		// wantErr nil: Terminate succeeds; else its class.
		wantErr error
	}{
		{"absent", nil, nil},
		{"a 500 with a 404 body on the confirming GET", []azurefake.Fault{{Method: http.MethodGet, Path: "/sandboxes/", Status: 500, Body: notFoundBody, Times: 10}}, sandbox.ErrOutcomeUnknown},
		{"a 500 with a 404 body on DELETE", []azurefake.Fault{{Method: http.MethodDelete, Path: "/sandboxes/", Status: 500, Body: notFoundBody, Times: 10}}, sandbox.ErrOutcomeUnknown},
		{"throttled past the retries", []azurefake.Fault{{Method: http.MethodGet, Path: "/sandboxes/", Status: 429, RetryAfter: "0", Body: notFoundBody, Times: 10}}, sandbox.ErrOutcomeUnknown},
		{"throttled once, then gone", []azurefake.Fault{{Method: http.MethodGet, Path: "/sandboxes/", Status: 429, RetryAfter: "1", Times: 1}}, nil},
		{"a 503 once, then gone", []azurefake.Fault{{Method: http.MethodDelete, Path: "/sandboxes/", Status: 503, Times: 1}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, azurefake.Config{})
			for _, x := range tc.faults {
				f.Inject(x)
			}
			b := newBackend(t, fakeOptions(f))
			err := b.Terminate(ctx, id)
			switch {
			case tc.wantErr == nil && err != nil:
				t.Fatalf("Terminate = %v, want nil", err)
			case tc.wantErr != nil && (!errors.Is(err, tc.wantErr) || errors.Is(err, sandbox.ErrNotFound)):
				t.Fatalf("Terminate = %v, want %v and not ErrNotFound", err, tc.wantErr)
			}
			if tc.wantErr == nil {
				// Done means a GET answered 404 last.
				reqs := f.Requests()
				if last := reqs[len(reqs)-1]; !strings.HasPrefix(last, "GET ") {
					t.Errorf("last request %q, want the confirming GET", last)
				}
			}
			_, err = b.Get(ctx, id)
			if len(tc.faults) == 0 && !errors.Is(err, sandbox.ErrNotFound) {
				t.Errorf("Get of an absent sandbox: %v, want ErrNotFound", err)
			}
		})
	}
	t.Run("get with a 404 body on a 500 is not gone", func(t *testing.T) {
		f := newFake(t, azurefake.Config{})
		f.Inject(azurefake.Fault{Method: http.MethodGet, Status: 500, Body: notFoundBody, Times: 10})
		_, err := newBackend(t, fakeOptions(f)).Get(ctx, id)
		if err == nil || errors.Is(err, sandbox.ErrNotFound) || statusOf(err) != 500 {
			t.Errorf("Get = %v, want a 500, not ErrNotFound", err)
		}
	})
}

// TestExecIsNotReplayed: a command whose answer is lost (a 5xx, possibly after it ran) is
// outcome unknown and sent once; a 429 (refused before running) is retried.
func TestExecIsNotReplayed(t *testing.T) {
	ctx := context.Background()
	const id = "0b0e4c8e-0000-4000-8000-000000000002"
	count := func(f *azurefake.Fake) int {
		n := 0
		for _, r := range f.Requests() {
			if strings.HasSuffix(r, "/executeShellCommand") {
				n++
			}
		}
		return n
	}
	req := sandbox.ExecRequest{Shell: "true", Timeout: time.Minute}
	f := newFake(t, azurefake.Config{})
	b := newBackend(t, fakeOptions(f))
	f.Inject(azurefake.Fault{Path: "/executeShellCommand", Status: 503, Times: 5})
	if _, err := b.agent(id, "x", "/workspace").Exec(ctx, req, nil, nil); !errors.Is(err, sandbox.ErrOutcomeUnknown) {
		t.Errorf("exec answered 503: %v, want ErrOutcomeUnknown", err)
	}
	if n := count(f); n != 1 {
		t.Errorf("exec answered 503 was sent %d times, want 1", n)
	}
	f.ClearFaults()
	f.Inject(azurefake.Fault{Path: "/executeShellCommand", Status: 429, RetryAfter: "0", Times: 1})
	// The retry reaches the real handler: the sandbox does not exist.
	if _, err := b.agent(id, "x", "/workspace").Exec(ctx, req, nil, nil); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("exec after a 429: %v, want the retry's ErrNotFound", err)
	}
	if n := count(f); n != 3 {
		t.Errorf("exec requests %d, want 1 + 2 (a 429 and its retry)", n)
	}
}

// TestAudience: the data plane's token audience is disputed; the backend asks for the one
// configured, and a data plane that wants the other refuses it as unauthenticated.
func TestAudience(t *testing.T) {
	ctx := context.Background()
	const id = "0b0e4c8e-0000-4000-8000-000000000003"
	f := newFake(t, azurefake.Config{Audiences: []string{azurefake.AudienceDevCompute}})
	if _, err := newBackend(t, fakeOptions(f)).Get(ctx, id); !errors.Is(err, sandbox.ErrUnauthenticated) {
		t.Errorf("default scope against a devcompute data plane: %v, want ErrUnauthenticated", err)
	}
	o := fakeOptions(f)
	o.DataPlaneScope = azurefake.AudienceDevCompute + "/.default"
	if _, err := newBackend(t, o).Get(ctx, id); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("devcompute scope: %v, want ErrNotFound", err)
	}
	if got := f.Audiences(); got[azurefake.AudienceDevCompute] != 1 || len(got) != 1 {
		t.Errorf("audiences seen %v", got)
	}
}

// TestSandboxGroup: a missing group is an error naming it, unless the backend may make it;
// then it is made in the region and waited for.
func TestSandboxGroup(t *testing.T) {
	ctx := context.Background()
	f := newFake(t, azurefake.Config{Groups: []string{"other"}})
	b := newBackend(t, fakeOptions(f))
	if err := b.ensureGroup(ctx); !errors.Is(err, sandbox.ErrNotFound) || !strings.Contains(err.Error(), "sandbox group sg") {
		t.Errorf("missing group: %v", err)
	}
	o := fakeOptions(f)
	o.CreateGroup = true
	if err := newBackend(t, o).ensureGroup(ctx); err != nil {
		t.Fatalf("CreateGroup: %v", err)
	}
	if err := b.ensureGroup(ctx); err != nil {
		t.Errorf("the made group: %v", err)
	}
}

// TestOptions: what New refuses, naming the key.
func TestOptions(t *testing.T) {
	ok := Options{SubscriptionID: "s", ResourceGroup: "rg", SandboxGroup: "sg", Region: "westus2", Credential: azurefake.Credential{}}
	for _, tc := range []struct {
		mod  func(*Options)
		want string
	}{
		{func(o *Options) { o.SubscriptionID = "" }, "subscription"},
		{func(o *Options) { o.SandboxGroup = "a/b" }, "sandboxGroup"},
		{func(o *Options) { o.Region = "" }, "region"},
		{func(o *Options) { o.Region = "West US" }, "region"},
		{func(o *Options) { o.DataPlaneEndpoint = "http://127.0.0.1:1" }, "dataPlaneEndpoint"},
		{func(o *Options) { o.ARMEndpoint = "https://x/y" }, "armEndpoint"},
	} {
		o := ok
		tc.mod(&o)
		if _, err := New(context.Background(), o); !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want ErrInvalid naming %s", o, err, tc.want)
		}
	}
	b, err := New(context.Background(), ok)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(b.data.base, "https://management.westus2.azuredevcompute.io/subscriptions/s/resourceGroups/rg/sandboxGroups/sg") {
		t.Errorf("data plane base %s", b.data.base)
	}
	if !slices.Contains([]string{DefaultAPIVersion}, b.data.apiVersion) {
		t.Errorf("api-version %s", b.data.apiVersion)
	}
}
