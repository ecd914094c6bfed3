package runcode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

func TestDeclaration(t *testing.T) {
	req, err := Normalize(Request{Language: "py", Code: "x", TimeoutSeconds: 10})
	if err != nil {
		t.Fatal(err)
	}
	d := Declaration(req, Options{})
	if !d.Image.Host || d.Limits.Memory != "512Mi" || d.Limits.CPU != "1" || *d.Limits.MaxProcesses != 256 {
		t.Errorf("defaults: %+v", d)
	}
	if d.Egress.Mode != spec.EgressDeny {
		t.Errorf("network off: egress %q, want deny", d.Egress.Mode)
	}
	if *d.Session.MaxLifetimeSeconds != 10+lifetimeMargin {
		t.Errorf("lifetime %d", *d.Session.MaxLifetimeSeconds)
	}
	if errs := d.Validate(""); len(errs) != 0 {
		t.Errorf("declaration does not validate: %v", errs)
	}
	req.Network = true
	if m := Declaration(req, Options{}).Egress.Mode; m != spec.EgressAllow {
		t.Errorf("network on: egress %q, want allow", m)
	}
	img := spec.Image{Dir: "/srv/rootfs"}
	if got := Declaration(req, Options{Image: img}).Image; got != img {
		t.Errorf("image option ignored: %+v", got)
	}
	if a, b := Declaration(req, Options{}).ID, Declaration(req, Options{}).ID; a == b {
		t.Errorf("two runs got the same sandbox id %q", a)
	}
}

// fakeBackend records what Run asks of a backend; its agent's Exec is scripted.
type fakeBackend struct {
	set  capability.Set
	exec func(ctx context.Context, req sandbox.ExecRequest, stdout, stderr io.Writer) (sandbox.ExecResult, error)

	mu         sync.Mutex
	created    []spec.Sandbox
	terminated []string
	termCtxErr []error
	written    map[string]string
	dirs       []string
	execReq    sandbox.ExecRequest
	// terminate, when set, is what Terminate does after recording the call.
	terminate func(ctx context.Context, id string) error
}

func supportedSet() capability.Set {
	s := capability.Set{Platform: capability.Local, Entries: map[capability.Name]capability.Status{}}
	for _, n := range capability.Names {
		s.Entries[n] = capability.Status{Supported: true}
	}
	return s
}

func (f *fakeBackend) Platform() capability.Platform               { return f.set.Platform }
func (f *fakeBackend) Capabilities(context.Context) capability.Set { return f.set }
func (f *fakeBackend) Get(context.Context, string) (*sandbox.Session, error) {
	return nil, sandbox.ErrNotFound
}
func (f *fakeBackend) List(context.Context) ([]*sandbox.Session, error) { return nil, nil }
func (f *fakeBackend) Create(_ context.Context, decl spec.Sandbox) (*sandbox.Session, error) {
	// What its set says no to is refused, as every backend's Create does.
	if err := plan.CheckSandbox(decl, f.set); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.created = append(f.created, decl)
	return &sandbox.Session{ID: "s-1", SandboxID: decl.ID, Spec: decl}, nil
}
func (f *fakeBackend) Connect(context.Context, string) (sandbox.Agent, error) {
	return &fakeAgent{b: f}, nil
}
func (f *fakeBackend) Terminate(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.terminated = append(f.terminated, id)
	f.termCtxErr = append(f.termCtxErr, ctx.Err())
	hook := f.terminate
	f.mu.Unlock()
	defer f.mu.Lock()
	if hook != nil {
		return hook(ctx, id)
	}
	return nil
}

type fakeAgent struct {
	sandbox.Agent // unimplemented methods panic
	b             *fakeBackend
}

func (a *fakeAgent) WriteFile(_ context.Context, p string, r io.Reader, _ uint32) error {
	data, err := io.ReadAll(r)
	a.b.mu.Lock()
	defer a.b.mu.Unlock()
	if a.b.written == nil {
		a.b.written = map[string]string{}
	}
	a.b.written[p] = string(data)
	return err
}
func (a *fakeAgent) Mkdir(_ context.Context, p string, _ uint32) error {
	a.b.mu.Lock()
	defer a.b.mu.Unlock()
	a.b.dirs = append(a.b.dirs, p)
	return nil
}
func (a *fakeAgent) Exec(ctx context.Context, req sandbox.ExecRequest, stdout, stderr io.Writer) (sandbox.ExecResult, error) {
	a.b.mu.Lock()
	a.b.execReq = req
	a.b.mu.Unlock()
	return a.b.exec(ctx, req, stdout, stderr)
}
func (a *fakeAgent) Close() error { return nil }

func TestRunWiring(t *testing.T) {
	f := &fakeBackend{set: supportedSet(), exec: func(_ context.Context, req sandbox.ExecRequest, stdout, stderr io.Writer) (sandbox.ExecResult, error) {
		in, _ := io.ReadAll(req.Stdin)
		io.WriteString(stdout, "out:"+string(in))
		io.WriteString(stderr, "err")
		return sandbox.ExecResult{ExitCode: 3, Duration: 5 * time.Millisecond}, nil
	}}
	var live strings.Builder
	res, err := Run(t.Context(), f, Request{Language: "JS", Code: "console.log(1)", Stdin: "abc", TimeoutSeconds: 9,
		Files: map[string][]byte{"data/in.txt": []byte("D"), "/tmp/abs": []byte("A")}}, Options{Stdout: &live})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 3 || res.Stdout != "out:abc" || res.Stderr != "err" || res.Language != "node" || res.DurationMs != 5 || res.TimeoutSeconds != 9 {
		t.Errorf("result %+v", res)
	}
	if live.String() != "out:abc" {
		t.Errorf("live stdout %q", live.String())
	}
	if got := strings.Join(f.execReq.Argv, " "); got != "node main.js" || f.execReq.Cwd != "/workspace" || f.execReq.Timeout != 9*time.Second {
		t.Errorf("exec request %+v", f.execReq)
	}
	if f.execReq.MaxStdout != DefaultOutputBytes || f.execReq.MaxStderr != DefaultOutputBytes {
		t.Errorf("output caps not passed to the agent: %+v", f.execReq)
	}
	want := map[string]string{"/workspace/main.js": "console.log(1)", "/workspace/data/in.txt": "D", "/tmp/abs": "A"}
	for p, w := range want {
		if f.written[p] != w {
			t.Errorf("file %s = %q, want %q (written: %v)", p, f.written[p], w, f.written)
		}
	}
	if len(f.created) != 1 || f.created[0].Egress.Mode != spec.EgressDeny || f.created[0].Workdir != "/workspace" {
		t.Errorf("created %+v", f.created)
	}
	if len(f.terminated) != 1 || f.terminated[0] != "s-1" {
		t.Errorf("terminated %v, want [s-1]", f.terminated)
	}
}

func TestRunSignalledExitCode(t *testing.T) {
	f := &fakeBackend{set: supportedSet(), exec: func(context.Context, sandbox.ExecRequest, io.Writer, io.Writer) (sandbox.ExecResult, error) {
		return sandbox.ExecResult{ExitCode: -1, Signal: "SIGKILL", TimedOut: true}, nil
	}}
	res, err := Run(t.Context(), f, Request{Language: "bash", Code: "sleep 9"}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 137 || !res.TimedOut || res.ExitStatus() != 124 {
		t.Errorf("result %+v", res)
	}
}

// TestRunTerminatesOnCancel: a caller that gives up mid-run must not leave the sandbox
// behind, and the cleanup must not inherit the dead context.
func TestRunTerminatesOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	f := &fakeBackend{set: supportedSet(), exec: func(ctx context.Context, _ sandbox.ExecRequest, _, _ io.Writer) (sandbox.ExecResult, error) {
		cancel()
		<-ctx.Done()
		return sandbox.ExecResult{}, ctx.Err()
	}}
	_, err := Run(ctx, f, Request{Language: "py", Code: "while True: pass"}, Options{})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if len(f.terminated) != 1 {
		t.Fatalf("terminated %v: the sandbox was left behind", f.terminated)
	}
	if f.termCtxErr[0] != nil {
		t.Fatalf("Terminate got a dead context (%v)", f.termCtxErr[0])
	}
}

func TestRunRefusesNetworkWithoutPublicEgress(t *testing.T) {
	set := supportedSet()
	set.Entries[capability.PublicOnlyEgress] = capability.Status{Reason: "no nftables here"}
	f := &fakeBackend{set: set, exec: func(context.Context, sandbox.ExecRequest, io.Writer, io.Writer) (sandbox.ExecResult, error) {
		t.Fatal("exec reached on a refused run")
		return sandbox.ExecResult{}, nil
	}}
	_, err := Run(t.Context(), f, Request{Language: "py", Code: "x", Network: true}, Options{})
	if err == nil {
		t.Fatal("network: true ran on a backend without publicOnlyEgress")
	}
	for _, s := range []string{`network: true`, `egress "allow"`, "not available on this host", "no nftables here", "publicOnlyEgress"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("refusal %q does not contain %q", err, s)
		}
	}
	if !errors.Is(err, sandbox.ErrRefused) {
		t.Errorf("%v does not wrap sandbox.ErrRefused", err)
	}
	var r *plan.Refusal
	if !errors.As(err, &r) || r.Capability != capability.PublicOnlyEgress {
		t.Errorf("errors.As found %+v", r)
	}
	if len(f.created) != 0 {
		t.Errorf("a sandbox was created for a refused run")
	}
	// The same backend still runs network-off code: the refusal is about egress only.
	f.exec = func(context.Context, sandbox.ExecRequest, io.Writer, io.Writer) (sandbox.ExecResult, error) {
		return sandbox.ExecResult{}, nil
	}
	if _, err := Run(t.Context(), f, Request{Language: "py", Code: "x"}, Options{}); err != nil {
		t.Fatalf("network off refused too: %v", err)
	}
}

func TestRunRefusesUnenforceableLimits(t *testing.T) {
	set := supportedSet()
	set.Entries[capability.EnforcedLimits] = capability.Status{Reason: "no memory cgroup"}
	f := &fakeBackend{set: set}
	_, err := Run(t.Context(), f, Request{Language: "py", Code: "x"}, Options{})
	if err == nil || !strings.Contains(err.Error(), "no memory cgroup") || !strings.Contains(err.Error(), "enforcedLimits") {
		t.Fatalf("err = %v, want a refusal naming enforcedLimits and its reason", err)
	}
	if len(f.created) != 0 {
		t.Errorf("a sandbox was created for a refused run")
	}
}

// TestCheckIdleTimeoutWaiver: an idle timeout equal to the enforced lifetime needs no
// idleTimeout capability; a shorter one, or an unenforced lifetime, is still refused.
func TestCheckIdleTimeoutWaiver(t *testing.T) {
	noIdle := supportedSet()
	noIdle.Entries[capability.IdleTimeout] = capability.Status{Reason: "idle not enforced"}
	noIdleNoLife := supportedSet()
	noIdleNoLife.Entries[capability.IdleTimeout] = capability.Status{Reason: "idle not enforced"}
	noIdleNoLife.Entries[capability.SessionLifetime] = capability.Status{Reason: "lifetime not enforced"}
	i64 := func(v int64) *int64 { return &v }
	decl := func(life, idle int64) spec.Sandbox {
		return spec.Sandbox{ID: "x", Image: spec.Image{Host: true}, Session: spec.Session{MaxLifetimeSeconds: i64(life), IdleTimeoutSeconds: i64(idle)}}
	}
	tests := []struct {
		name   string
		set    capability.Set
		decl   spec.Sandbox
		errHas []string
	}{
		{name: "idle equals lifetime", set: noIdle, decl: decl(90, 90)},
		{name: "run_code declaration", set: noIdle, decl: Declaration(Request{Language: "python", TimeoutSeconds: 30}, Options{})},
		{name: "idle shorter than lifetime", set: noIdle, decl: decl(90, 30), errHas: []string{"idleTimeout", "idle not enforced"}},
		{name: "default idle", set: noIdle, decl: spec.Sandbox{ID: "x", Image: spec.Image{Host: true}}, errHas: []string{"idleTimeout"}},
		{name: "lifetime not enforced", set: noIdleNoLife, decl: decl(90, 90), errHas: []string{"idleTimeout", "sessionLifetime"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Check(t.Context(), &fakeBackend{set: tt.set}, tt.decl, false)
			if tt.errHas == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted, want a refusal naming %v", tt.errHas)
			}
			for _, s := range tt.errHas {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("%q lacks %q", err, s)
				}
			}
		})
	}
}

// TestRunDetached: the result comes back while the sandbox is still being terminated; Wait
// returns only once Terminate has, with its error; Run joins that error to its own.
func TestRunDetached(t *testing.T) {
	termErr := fmt.Errorf("%w: cgroup still has tasks", sandbox.ErrOutcomeUnknown)
	tests := []struct {
		name    string
		termErr error
	}{
		{"terminated", nil},
		{"terminate fails", termErr},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			release := make(chan struct{})
			f := &fakeBackend{set: supportedSet(),
				exec: func(_ context.Context, _ sandbox.ExecRequest, stdout, _ io.Writer) (sandbox.ExecResult, error) {
					io.WriteString(stdout, "4\n")
					return sandbox.ExecResult{}, nil
				},
				terminate: func(context.Context, string) error {
					<-release
					return tt.termErr
				}}
			res, term, err := RunDetached(t.Context(), f, Request{Language: "python", Code: "print(2+2)"}, Options{})
			if err != nil || res.Stdout != "4\n" {
				t.Fatalf("RunDetached = %+v, %v", res, err)
			}
			select {
			case <-term.Done():
				t.Fatal("Done before Terminate returned")
			default:
			}
			close(release)
			werr := term.Wait()
			if !errors.Is(werr, tt.termErr) || (tt.termErr == nil) != (werr == nil) {
				t.Fatalf("Wait = %v, want %v", werr, tt.termErr)
			}
			<-term.Done()
			if len(f.terminated) != 1 || f.terminated[0] != "s-1" {
				t.Fatalf("terminated %v, want [s-1]", f.terminated)
			}

			// Run: the same, waited for.
			f.terminate = func(context.Context, string) error { return tt.termErr }
			res, err = Run(t.Context(), f, Request{Language: "python", Code: "print(2+2)"}, Options{})
			if res.Stdout != "4\n" || !errors.Is(err, tt.termErr) || (tt.termErr == nil) != (err == nil) {
				t.Fatalf("Run = %+v, %v; want the result and %v", res, err, tt.termErr)
			}
		})
	}
}

// TestRunDetachedNoSandbox: a run refused before anything is created has nothing to wait for.
func TestRunDetachedNoSandbox(t *testing.T) {
	f := &fakeBackend{set: supportedSet()}
	_, term, err := RunDetached(t.Context(), f, Request{Language: "cobol", Code: "x"}, Options{})
	if !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("err = %v, want ErrInvalid", err)
	}
	if term != nil || term.Wait() != nil {
		t.Fatalf("termination %v for a run that made no sandbox", term)
	}
	<-term.Done()
	if len(f.created) != 0 {
		t.Fatalf("created %v", f.created)
	}
}

// A run's limits, lifetime and idle timeout are declared only where the platform enforces them.
func TestUndeclareUnenforced(t *testing.T) {
	d := Declaration(Request{Language: "python", Code: "1", TimeoutSeconds: 10}, Options{})
	set := func(has ...capability.Name) capability.Set {
		s := capability.Set{Entries: map[capability.Name]capability.Status{}}
		for _, n := range has {
			s.Entries[n] = capability.Status{Supported: true}
		}
		return s
	}
	for _, tc := range []struct {
		set                       capability.Set
		life, idle, limits, procs bool
	}{
		{set(capability.SessionLifetime, capability.IdleTimeout, capability.EnforcedLimits, capability.ProcessLimit), true, true, true, true},
		{set(capability.SessionLifetime, capability.ProcessLimit), true, false, false, true},
		{set(capability.EnforcedLimits), false, false, true, false},
		{set(), false, false, false, false},
	} {
		got := undeclareUnenforced(d, tc.set)
		if (got.Session.MaxLifetimeSeconds != nil) != tc.life || (got.Session.IdleTimeoutSeconds != nil) != tc.idle {
			t.Errorf("set %v: lifetime declared %v, idle declared %v; want %v %v", tc.set.Entries, got.Session.MaxLifetimeSeconds != nil, got.Session.IdleTimeoutSeconds != nil, tc.life, tc.idle)
		}
		if tc.life && *got.Session.MaxLifetimeSeconds != *d.Session.MaxLifetimeSeconds {
			t.Errorf("lifetime changed: %d", *got.Session.MaxLifetimeSeconds)
		}
		if gotLimits := got.Limits.CPU != "" && got.Limits.Memory != ""; gotLimits != tc.limits || (got.Limits.CPU == "") != (got.Limits.Memory == "") {
			t.Errorf("set %v: cpu %q memory %q declared; want declared %v", tc.set.Entries, got.Limits.CPU, got.Limits.Memory, tc.limits)
		}
		if (got.Limits.MaxProcesses != nil) != tc.procs {
			t.Errorf("set %v: maxProcesses declared %v, want %v", tc.set.Entries, got.Limits.MaxProcesses != nil, tc.procs)
		}
	}
	if d.Session.MaxLifetimeSeconds == nil || d.Session.IdleTimeoutSeconds == nil || d.Limits.Memory == "" || d.Limits.MaxProcesses == nil {
		t.Error("the declaration itself was changed")
	}
}

// TestRunTakesPlatformSizes: on a platform that sizes a sandbox itself and keeps no labels
// (aws's published set), a run is not refused for the run's own size and labels: they stay
// undeclared, and Create gets the declaration with the platform's values left out.
func TestRunTakesPlatformSizes(t *testing.T) {
	set, err := capability.For(capability.AWS)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeBackend{set: set, exec: func(_ context.Context, _ sandbox.ExecRequest, stdout, _ io.Writer) (sandbox.ExecResult, error) {
		io.WriteString(stdout, "4\n")
		return sandbox.ExecResult{}, nil
	}}
	res, err := Run(t.Context(), f, Request{Language: "python", Code: "print(2+2)"}, Options{Image: spec.Image{Ref: "registry.example/python:3"}})
	if err != nil || res.Stdout != "4\n" {
		t.Fatalf("Run = %+v, %v", res, err)
	}
	if len(f.created) != 1 {
		t.Fatalf("%d sandboxes created", len(f.created))
	}
	d := f.created[0]
	if d.Limits.CPU != "" || d.Limits.Memory != "" || d.Limits.MaxProcesses != nil || d.Limits.Disk != "" || len(d.Labels) != 0 {
		t.Errorf("created %+v: want the platform's size and no labels", d)
	}
	if d.Session.MaxLifetimeSeconds == nil || d.Egress.Mode != spec.EgressDeny {
		t.Errorf("created %+v: want the run's lifetime and egress deny", d)
	}
}

// TestRunTakesPlatformValues: on a platform that cannot hold run_code's limits but publishes
// its own values for them, a run creates its sandbox with those left to the platform (the
// backend's own check in Create accepts it), holds what the platform enforces at airlock's
// value, and reports the platform's memory; without the platform's values it is refused.
func TestRunTakesPlatformValues(t *testing.T) {
	set := supportedSet()
	set.Platform = capability.AWS
	for _, n := range []capability.Name{capability.EnforcedLimits, capability.ProcessLimit, capability.DiskLimit} {
		set.Entries[n] = capability.Status{Reason: "the platform sizes its sandboxes"}
	}
	set.PlatformValues = map[capability.Property]string{
		capability.PropCPU:          "platform-sized (tier cpu)",
		capability.PropMemory:       "platform-sized (tier 2048 MiB)",
		capability.PropDisk:         "platform-sized (tier disk)",
		capability.PropMaxProcesses: "unbounded",
	}
	f := &fakeBackend{set: set, exec: func(context.Context, sandbox.ExecRequest, io.Writer, io.Writer) (sandbox.ExecResult, error) {
		return sandbox.ExecResult{}, nil
	}}
	res, err := Run(t.Context(), f, Request{Language: "py", Code: "x", TimeoutSeconds: 7}, Options{})
	if err != nil {
		t.Fatalf("a run on a platform with its own sizes: %v", err)
	}
	if len(f.created) != 1 {
		t.Fatalf("created %d sandboxes", len(f.created))
	}
	got := f.created[0]
	if got.Limits.CPU != "" || got.Limits.Memory != "" || got.Limits.Disk != "" || got.Limits.MaxProcesses != nil {
		t.Errorf("limits given to Create %+v: want every one left to the platform", got.Limits)
	}
	if got.Workdir != spec.DefaultWorkdir || got.Egress.Mode != spec.EgressDeny || got.Session.MaxLifetimeSeconds == nil || *got.Session.MaxLifetimeSeconds != 7+lifetimeMargin {
		t.Errorf("what the platform holds was not airlock's value: workdir %q egress %q lifetime %v", got.Workdir, got.Egress.Mode, got.Session.MaxLifetimeSeconds)
	}
	if res.Memory != "platform-sized (tier 2048 MiB)" {
		t.Errorf("result memory %q, want the platform's", res.Memory)
	}

	delete(set.PlatformValues, capability.PropMemory)
	f.created = nil
	_, err = Run(t.Context(), f, Request{Language: "py", Code: "x"}, Options{})
	var r *plan.Refusal
	if !errors.As(err, &r) || r.Capability != capability.EnforcedLimits || !strings.Contains(err.Error(), "limits.memory") {
		t.Fatalf("err = %v, want a refusal of limits.memory naming enforcedLimits", err)
	}
	if len(f.created) != 0 {
		t.Error("a sandbox was created for a refused run")
	}
}
