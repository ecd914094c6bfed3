// Package conformance is the one behaviour suite every sandbox.Backend runs.
package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// Options adapt the suite to a backend. There is no way to skip a test by hand: a test that
// needs a capability is skipped only when the backend's own Capabilities() says it lacks it.
type Options struct {
	// Decl returns the declaration to create for a test, before defaults: at least an image
	// the backend can start with sh, echo, sleep, pwd, cat, test, head, tail, cut, tr, sort,
	// wc and python3. plan.Defaults is applied to the result. Its image kind and runtime are
	// what the walk counts as exercised for those capabilities.
	Decl func(id string) spec.Sandbox
	// OpTimeout bounds each backend call (default 2 minutes).
	OpTimeout time.Duration
	// Images are more images the backend starts (each needs only echo): subtest ImageKinds
	// creates a sandbox from each, exercising their kinds' capabilities for the walk.
	Images []spec.Image
	// Basic runs the floor only (create, exec, files, terminate...), for a second run of the
	// suite with a declaration whose image holds just sh and a few tools (a directory image)
	// or a runtime variant: the capability subtests and the walk are the main run's.
	Basic bool
	// Subtests, when set, runs only the subtests named (and neither Extra nor the walk): for a
	// backend whose test environment cannot yet exercise every capability its set claims. The
	// caller says why next to the list; the walk's verdict is then the full run's to give.
	Subtests []string
	// PlatformDefaults: the backend's platform cannot hold airlock's defaults (limits,
	// lifetime, idle timeout: gcp), so the suite creates its declarations as Decl returns them,
	// undeclared fields taking the platform's values, instead of after spec ApplyDefaults.
	PlatformDefaults bool
	// Extra are the backend's own subtests for capabilities this suite cannot exercise the
	// same way everywhere (public-only egress needs hosts the test makes in its own network
	// namespaces): each runs inside the suite and counts for the walk like the suite's own.
	Extra []Subtest
}

// Subtest is a backend's own subtest and the capabilities it exercises.
type Subtest struct {
	Name      string
	Exercises []capability.Name
	Run       func(t *testing.T)
	// Replaces names a suite subtest that checks the same capability by another platform's
	// mechanism (EgressDenyOnlyLoopback: a sandbox with only lo), which this one proves
	// its own way instead (a pod always has eth0; its policy refuses the traffic): the
	// suite's is not run, nor its sandboxes declared, and this one must exercise what it did.
	Replaces string
}

// replaced reports whether an Extra subtest stands in for the suite subtest name.
func (o Options) replaced(name string) bool {
	return !o.Basic && slices.ContainsFunc(o.Extra, func(x Subtest) bool { return x.Replaces == name })
}

// Run runs the suite. newBackend is called once per subtest; the backend it returns is the
// caller's to close (use t.Cleanup). Every sandbox the suite creates it also terminates.
func Run(t *testing.T, newBackend func(t *testing.T) sandbox.Backend, opts Options) {
	t.Helper()
	if opts.Decl == nil {
		t.Fatal("conformance: Options.Decl is required")
	}
	if opts.OpTimeout == 0 {
		opts.OpTimeout = 2 * time.Minute
	}
	tests := suiteTests()
	if opts.Basic {
		tests = slices.DeleteFunc(tests, func(tc suiteTest) bool { return !slices.Contains(basic, tc.name) })
	}
	if opts.Subtests != nil {
		for _, n := range opts.Subtests {
			if !slices.ContainsFunc(tests, func(tc suiteTest) bool { return tc.name == n }) {
				t.Fatalf("conformance: Options.Subtests names %q, which is not a subtest", n)
			}
		}
		tests = slices.DeleteFunc(tests, func(tc suiteTest) bool { return !slices.Contains(opts.Subtests, tc.name) })
	}
	if !opts.Basic {
		for _, x := range opts.Extra {
			if x.Replaces == "" {
				continue
			}
			i := slices.IndexFunc(tests, func(tc suiteTest) bool { return tc.name == x.Replaces })
			if i < 0 {
				t.Fatalf("conformance: Extra %s replaces %q, which is not a subtest of this run", x.Name, x.Replaces)
			}
			for _, n := range tests[i].needs {
				if !slices.Contains(x.Exercises, n) {
					t.Fatalf("conformance: Extra %s replaces %s but does not exercise %s, which it did", x.Name, x.Replaces, n)
				}
			}
			tests = slices.Delete(tests, i, i+1)
		}
	}
	// exercisedBy is the walk's table: capability → the subtests that exercise it. The image
	// kind the suite's own declaration uses is exercised by every subtest.
	exercisedBy := map[capability.Name][]string{}
	for _, tc := range tests {
		for _, n := range tc.needs {
			exercisedBy[n] = append(exercisedBy[n], tc.name)
		}
	}
	d := opts.Decl("conf-kind")
	if n, ok := imageCapability[d.Image.Kind()]; ok {
		exercisedBy[n] = append(exercisedBy[n], "CreateReturnsRunningSession")
	}
	if n, ok := runtimeCapability[d.Runtime]; ok {
		exercisedBy[n] = append(exercisedBy[n], "CreateReturnsRunningSession")
	}
	for _, img := range opts.Images {
		if n, ok := imageCapability[img.Kind()]; ok {
			exercisedBy[n] = append(exercisedBy[n], "ImageKinds")
		}
	}
	var r ran
	if !opts.Basic {
		for _, x := range opts.Extra {
			for _, n := range x.Exercises {
				exercisedBy[n] = append(exercisedBy[n], x.Name)
			}
		}
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newBackend(t)
			ctx, cancel := context.WithTimeout(context.Background(), opts.OpTimeout)
			defer cancel()
			caps := b.Capabilities(ctx)
			for _, n := range tc.needs {
				if !caps.Has(n) {
					t.Skipf("backend %s lacks capability %s: %s", b.Platform(), n, caps.Entries[n].Reason)
				}
			}
			defer func() { r.note(tc.name, !t.Failed() && !t.Skipped()) }()
			tc.fn(&suite{t: t, b: b, opts: opts, name: tc.name})
		})
	}
	if opts.Basic || opts.Subtests != nil {
		return
	}
	for _, x := range opts.Extra {
		t.Run(x.Name, func(t *testing.T) {
			defer func() { r.note(x.Name, !t.Failed() && !t.Skipped()) }()
			x.Run(t)
		})
	}
	// Last: every yes was exercised above, every no is refused.
	t.Run("CapabilityWalk", func(t *testing.T) { walk(t, newBackend(t), opts, exercisedBy, &r) })
}

// SubtestNames are the suite's subtests, in run order (for Options.Subtests).
func SubtestNames() []string {
	var out []string
	for _, tc := range suiteTests() {
		out = append(out, tc.name)
	}
	return out
}

// suiteTests is the suite's table, in run order.
func suiteTests() []suiteTest {
	return []suiteTest{
		{"CreateReturnsRunningSession", nil, (*suite).createRunning},
		{"ExecStreamsStdoutAndStderr", nil, (*suite).execStreams},
		{"ExitCodes", nil, (*suite).exitCodes},
		{"EnvHonoured", []capability.Name{capability.Env}, (*suite).env},
		{"CwdIsWorkdir", []capability.Name{capability.Workdir}, (*suite).cwd},
		{"TimeoutKills", nil, (*suite).timeout},
		{"FilesRoundTrip", []capability.Name{capability.Files}, (*suite).files},
		{"GetAndListIncludeSession", nil, (*suite).getList},
		{"ConnectTwice", []capability.Name{capability.Reconnect}, (*suite).connectTwice},
		{"TerminateIsIdempotent", nil, (*suite).terminate},
		{"ConcurrentCreatesAreIndependent", nil, (*suite).concurrent},
		{"StdinStreamed", []capability.Name{capability.Stdin}, (*suite).stdin},
		{"TTY", []capability.Name{capability.PTY}, (*suite).pty},
		{"BackgroundProcessKilledWhole", []capability.Name{capability.BackgroundProcesses}, (*suite).background},
		{"LabelsKept", []capability.Name{capability.Labels}, (*suite).labels},
		{"EgressDenyOnlyLoopback", []capability.Name{capability.EgressDeny}, (*suite).egressDeny},
		{"MemoryCeilingHolds", []capability.Name{capability.EnforcedLimits}, (*suite).memoryCeiling},
		{"ProcessLimitHolds", []capability.Name{capability.ProcessLimit}, (*suite).processLimit},
		{"DiskLimitHolds", []capability.Name{capability.DiskLimit}, (*suite).diskLimit},
		{"LifetimeEndsSandbox", []capability.Name{capability.SessionLifetime}, (*suite).lifetime},
		{"IdleTimeoutEndsSandbox", []capability.Name{capability.IdleTimeout}, (*suite).idle},
		// Optional features, found with sandbox.Feature.
		{"PauseResume", []capability.Name{capability.SuspendResume}, (*suite).pauser},
		{"Stats", []capability.Name{capability.Stats}, (*suite).stats},
		{"LiveEgress", []capability.Name{capability.LiveEgress, capability.DomainEgressRules}, (*suite).liveEgress},
		{"Preview", []capability.Name{capability.Preview}, (*suite).previewer},
		{"SnapshotAndFork", []capability.Name{capability.Snapshot}, (*suite).snapshotter},
		{"ImageKinds", nil, (*suite).imageKinds},
	}
}

// suiteTest is one of the suite's subtests: skipped unless the set has what it needs, and
// each capability it needs is one it exercises.
type suiteTest struct {
	name  string
	needs []capability.Name
	fn    func(*suite)
}

// basic are the floor's subtests, what a Basic run runs.
var basic = []string{"CreateReturnsRunningSession", "ExecStreamsStdoutAndStderr", "ExitCodes", "EnvHonoured",
	"CwdIsWorkdir", "TimeoutKills", "FilesRoundTrip", "GetAndListIncludeSession", "ConnectTwice",
	"TerminateIsIdempotent", "ConcurrentCreatesAreIndependent"}

// imageKinds starts a sandbox from each of Options.Images.
func (s *suite) imageKinds() {
	for i, img := range s.opts.Images {
		d := s.decl(fmt.Sprintf("conf-image-%d", i))
		d.Image = img
		sess := s.create(d)
		if got := s.exec(s.connect(sess.ID), sandbox.ExecRequest{Argv: []string{"echo", "from", string(img.Kind())}}); got.stdout != "from "+string(img.Kind())+"\n" {
			s.t.Errorf("image %s: echo = %q %+v", img.String(), got.stdout, got.res)
		}
	}
}

// imageCapability and runtimeCapability are what the suite's own declaration needs.
var (
	imageCapability = map[spec.ImageKind]capability.Name{
		spec.ImageHost: capability.ImageHost, spec.ImageRef: capability.ImageRef, spec.ImageOCILayout: capability.ImageOCI,
		spec.ImageTarball: capability.ImageOCI, spec.ImageDir: capability.ImageDir,
	}
	runtimeCapability = map[spec.Runtime]capability.Name{spec.RuntimeGVisor: capability.GVisor, spec.RuntimeDocker: capability.DockerRuntime}
)

type suite struct {
	t    *testing.T
	b    sandbox.Backend
	opts Options
	name string // the subtest's, in the table above
}

func (s *suite) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.OpTimeout)
	s.t.Cleanup(cancel)
	return ctx
}

// decl is the declaration the subtest creates as id: Options.Decl, defaults, then the subtest's
// own tweak. Every id a subtest creates is in declIDs, so Declarations lists it.
func (s *suite) decl(id string) spec.Sandbox {
	s.t.Helper()
	if !slices.Contains(declIDs[s.name], id) && !(s.name == "ImageKinds" && strings.HasPrefix(id, "conf-image-")) {
		s.t.Fatalf("conformance: subtest %s creates %s, which declIDs does not list for it: add it (Declarations must name every sandbox the suite creates)", s.name, id)
	}
	return declFor(s.opts, s.b.Capabilities(s.ctx()), id)
}

// declFor defaults a declaration as a caller gives it to Create: airlock's defaults where the
// platform (set) holds them, its own values where it publishes them (plan.Defaults, as the
// daemon and run_code do); with PlatformDefaults, none.
func declFor(opts Options, set capability.Set, id string) spec.Sandbox {
	d := opts.Decl(id)
	if !opts.PlatformDefaults {
		d = plan.Defaults(set.Platform, set, d)
	}
	if tw, ok := tweaks[id]; ok {
		tw(&d)
	}
	return d
}

// tweaks are the subtests' own changes to a declaration, made after defaults, by sandbox id.
var tweaks = map[string]func(*spec.Sandbox){
	"conf-env": func(d *spec.Sandbox) { d.Env = map[string]string{"AIRLOCK_DECL": "from-decl", "AIRLOCK_BOTH": "decl"} },
	// 10 s, not shorter: the clock runs from the create, and a create on a slow machine (the
	// cgroup v2 VM, under emulation) took over 2 s.
	"conf-life": func(d *spec.Sandbox) {
		d.Session.MaxLifetimeSeconds, d.Session.IdleTimeoutSeconds = ptr(int64(10)), ptr(int64(10))
	},
	"conf-idle": func(d *spec.Sandbox) {
		d.Session.MaxLifetimeSeconds, d.Session.IdleTimeoutSeconds = ptr(int64(3600)), ptr(int64(5))
	},
	"conf-labels":  func(d *spec.Sandbox) { d.Labels = map[string]string{"team": "conformance", "run": "walk"} },
	"conf-mem":     func(d *spec.Sandbox) { d.Limits.Memory = "128Mi" },
	"conf-pids":    func(d *spec.Sandbox) { d.Limits.MaxProcesses = ptr(int64(32)) },
	"conf-disk":    func(d *spec.Sandbox) { d.Limits.Disk = "16Mi" },
	"conf-preview": func(d *spec.Sandbox) { d.PreviewPorts = []int{8080} },
}

// declIDs are the sandbox ids each subtest creates (ImageKinds: conf-image-N, one per
// Options.Images entry).
var declIDs = map[string][]string{
	"CreateReturnsRunningSession":     {"conf-create"},
	"ExecStreamsStdoutAndStderr":      {"conf-streams"},
	"ExitCodes":                       {"conf-exit"},
	"EnvHonoured":                     {"conf-env"},
	"CwdIsWorkdir":                    {"conf-cwd"},
	"TimeoutKills":                    {"conf-timeout"},
	"FilesRoundTrip":                  {"conf-files"},
	"GetAndListIncludeSession":        {"conf-get"},
	"ConnectTwice":                    {"conf-connect"},
	"TerminateIsIdempotent":           {"conf-term"},
	"ConcurrentCreatesAreIndependent": {"conf-conc-0", "conf-conc-1", "conf-conc-2"},
	"StdinStreamed":                   {"conf-stdin"},
	"TTY":                             {"conf-pty"},
	"BackgroundProcessKilledWhole":    {"conf-bg"},
	"LabelsKept":                      {"conf-labels"},
	"EgressDenyOnlyLoopback":          {"conf-deny"},
	"MemoryCeilingHolds":              {"conf-mem"},
	"ProcessLimitHolds":               {"conf-pids"},
	"DiskLimitHolds":                  {"conf-disk"},
	"LifetimeEndsSandbox":             {"conf-life"},
	"IdleTimeoutEndsSandbox":          {"conf-idle"},
	"PauseResume":                     {"conf-pause"},
	"Stats":                           {"conf-stats"},
	"LiveEgress":                      {"conf-live-egress"},
	"Preview":                         {"conf-preview"},
	// conf-from-snap's image is the snapshot the subtest takes: it cannot be declared ahead.
	"SnapshotAndFork": {"conf-snap", "conf-from-snap"},
}

// Declarations are the sandboxes Run creates on a backend whose set is caps (subtests it would
// skip create none), each as created: for a platform that serves only sandboxes declared ahead
// (a Kubernetes Sandbox per id, claimed from its warm pool). Basic limits them to the floor's.
// The walk's refusals are not here: they are refused before anything is claimed.
func Declarations(opts Options, caps capability.Set) []spec.Sandbox {
	var out []spec.Sandbox
	for _, tc := range suiteTests() {
		if opts.Basic && !slices.Contains(basic, tc.name) || opts.Subtests != nil && !slices.Contains(opts.Subtests, tc.name) || opts.replaced(tc.name) {
			continue
		}
		if slices.ContainsFunc(tc.needs, func(n capability.Name) bool { return !caps.Has(n) }) {
			continue
		}
		for _, id := range declIDs[tc.name] {
			if id != "conf-from-snap" {
				out = append(out, declFor(opts, caps, id))
			}
		}
		if tc.name == "ImageKinds" {
			for i, img := range opts.Images {
				d := declFor(opts, caps, fmt.Sprintf("conf-image-%d", i))
				d.Image = img
				out = append(out, d)
			}
		}
	}
	return out
}

// create starts a sandbox and registers its termination.
func (s *suite) create(d spec.Sandbox) *sandbox.Session {
	s.t.Helper()
	sess, err := s.b.Create(s.ctx(), d)
	if err != nil {
		s.t.Fatalf("Create(%s): %v", d.ID, err)
	}
	s.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.opts.OpTimeout)
		defer cancel()
		if err := s.b.Terminate(ctx, sess.ID); err != nil {
			s.t.Errorf("Terminate(%s) in cleanup: %v", sess.ID, err)
		}
	})
	return sess
}

func (s *suite) connect(id string) sandbox.Agent {
	s.t.Helper()
	a, err := s.b.Connect(s.ctx(), id)
	if err != nil {
		s.t.Fatalf("Connect(%s): %v", id, err)
	}
	s.t.Cleanup(func() { a.Close() })
	return a
}

type execOut struct {
	stdout, stderr string
	res            sandbox.ExecResult
}

func (s *suite) exec(a sandbox.Agent, req sandbox.ExecRequest) execOut {
	s.t.Helper()
	if req.Timeout == 0 {
		req.Timeout = 60 * time.Second
	}
	var out, errb bytes.Buffer
	res, err := a.Exec(s.ctx(), req, &out, &errb)
	if err != nil {
		s.t.Fatalf("Exec(%+v): %v", req, err)
	}
	return execOut{out.String(), errb.String(), res}
}

func (s *suite) sh(a sandbox.Agent, script string) execOut {
	s.t.Helper()
	return s.exec(a, sandbox.ExecRequest{Shell: script})
}

func (s *suite) createRunning() {
	d := s.decl("conf-create")
	sess := s.create(d)
	if sess.ID == "" {
		s.t.Fatal("session id is empty")
	}
	if sess.State != sandbox.StateRunning {
		s.t.Errorf("state = %q, want %q", sess.State, sandbox.StateRunning)
	}
	if sess.SandboxID != d.ID {
		s.t.Errorf("sandbox id = %q, want %q", sess.SandboxID, d.ID)
	}
	if sess.Platform != string(s.b.Platform()) {
		s.t.Errorf("platform = %q, want %q", sess.Platform, s.b.Platform())
	}
	// Create returns only once the agent answers.
	a := s.connect(sess.ID)
	if _, err := a.Health(s.ctx()); err != nil {
		s.t.Fatalf("Health right after Create: %v", err)
	}
}

func (s *suite) execStreams() {
	sess := s.create(s.decl("conf-streams"))
	a := s.connect(sess.ID)
	got := s.sh(a, "echo to-out; echo to-err >&2; echo more-out")
	if got.stdout != "to-out\nmore-out\n" {
		s.t.Errorf("stdout = %q", got.stdout)
	}
	if got.stderr != "to-err\n" {
		s.t.Errorf("stderr = %q", got.stderr)
	}
	if got.res.ExitCode != 0 || got.res.TimedOut || got.res.Signal != "" {
		s.t.Errorf("result = %+v, want a clean exit 0", got.res)
	}
	argv := s.exec(a, sandbox.ExecRequest{Argv: []string{"echo", "a b", "c"}})
	if argv.stdout != "a b c\n" {
		s.t.Errorf("argv echo stdout = %q, want %q", argv.stdout, "a b c\n")
	}
}

func (s *suite) exitCodes() {
	sess := s.create(s.decl("conf-exit"))
	a := s.connect(sess.ID)
	for _, code := range []int{0, 1, 2, 42, 255} {
		got := s.sh(a, fmt.Sprintf("exit %d", code))
		if got.res.ExitCode != code {
			s.t.Errorf("exit %d: result %+v", code, got.res)
		}
	}
	got := s.sh(a, "kill -9 $$")
	if got.res.Signal == "" && got.res.ExitCode != 137 {
		s.t.Errorf("killed by SIGKILL: result %+v, want a signal or 137", got.res)
	}
}

func (s *suite) env() {
	d := s.decl("conf-env")
	sess := s.create(d)
	a := s.connect(sess.ID)
	got := s.exec(a, sandbox.ExecRequest{
		Shell: `printf '%s|%s|%s' "$AIRLOCK_DECL" "$AIRLOCK_REQ" "$AIRLOCK_BOTH"`,
		Env:   map[string]string{"AIRLOCK_REQ": "from-req", "AIRLOCK_BOTH": "req"},
	})
	if want := "from-decl|from-req|req"; got.stdout != want {
		s.t.Errorf("env = %q, want %q (request env overrides the declaration's)", got.stdout, want)
	}
}

func (s *suite) cwd() {
	d := s.decl("conf-cwd")
	sess := s.create(d)
	a := s.connect(sess.ID)
	if got := s.sh(a, "pwd"); strings.TrimSpace(got.stdout) != d.Workdir {
		s.t.Errorf("pwd = %q, want the workdir %q", got.stdout, d.Workdir)
	}
	if got := s.exec(a, sandbox.ExecRequest{Shell: "pwd", Cwd: "/tmp"}); strings.TrimSpace(got.stdout) != "/tmp" {
		s.t.Errorf("pwd with cwd /tmp = %q", got.stdout)
	}
	// The workdir is writable by the code.
	if got := s.sh(a, "echo x > probe && cat probe"); got.stdout != "x\n" || got.res.ExitCode != 0 {
		s.t.Errorf("write in workdir: %+v %q", got.res, got.stderr)
	}
}

func (s *suite) timeout() {
	sess := s.create(s.decl("conf-timeout"))
	a := s.connect(sess.ID)
	got := s.exec(a, sandbox.ExecRequest{Shell: "echo started; sleep 600", Timeout: time.Second})
	if !got.res.TimedOut {
		s.t.Fatalf("sleep 600 with a 1s timeout: result %+v, want timedOut", got.res)
	}
	if got.stdout != "started\n" {
		s.t.Errorf("output before the timeout = %q, want it kept", got.stdout)
	}
	// The sandbox is still usable.
	if again := s.sh(a, "echo alive"); again.stdout != "alive\n" {
		s.t.Errorf("exec after a timeout: %q", again.stdout)
	}
}

func (s *suite) files() {
	d := s.decl("conf-files")
	sess := s.create(d)
	a := s.connect(sess.ID)
	ctx := s.ctx()
	dir := path.Join(d.Workdir, "sub")
	if err := a.Mkdir(ctx, dir, 0o755); err != nil {
		s.t.Fatalf("Mkdir: %v", err)
	}
	p := path.Join(dir, "a.txt")
	content := "hello files\n"
	if err := a.WriteFile(ctx, p, strings.NewReader(content), 0o640); err != nil {
		s.t.Fatalf("WriteFile: %v", err)
	}
	rc, err := a.ReadFile(ctx, p, 0, -1)
	if err != nil {
		s.t.Fatalf("ReadFile: %v", err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || string(b) != content {
		s.t.Fatalf("ReadFile = %q, %v; want %q", b, err, content)
	}
	// Code sees what the files API wrote.
	if got := s.sh(a, "cat "+p); got.stdout != content {
		s.t.Errorf("cat of a written file = %q", got.stdout)
	}
	fi, err := a.Stat(ctx, p)
	if err != nil {
		s.t.Fatalf("Stat: %v", err)
	}
	if fi.Size != int64(len(content)) || fi.Type != "file" || fi.Mode&0o777 != 0o640 {
		s.t.Errorf("Stat = %+v, want a %d-byte file with mode 0640", fi, len(content))
	}
	list, err := a.List(ctx, dir)
	if err != nil {
		s.t.Fatalf("List: %v", err)
	}
	if !slices.ContainsFunc(list, func(f sandbox.FileInfo) bool { return f.Name == "a.txt" }) {
		s.t.Errorf("List(%s) = %+v, want a.txt", dir, list)
	}
	q := path.Join(dir, "b.txt")
	if err := a.Rename(ctx, p, q); err != nil {
		s.t.Fatalf("Rename: %v", err)
	}
	if _, err := a.Stat(ctx, p); !errors.Is(err, sandbox.ErrNotFound) {
		s.t.Errorf("Stat of the renamed-away path: %v, want ErrNotFound", err)
	}
	if _, err := a.Stat(ctx, q); err != nil {
		s.t.Errorf("Stat of the rename target: %v", err)
	}
	if err := a.Remove(ctx, q, false); err != nil {
		s.t.Fatalf("Remove: %v", err)
	}
	if _, err := a.Stat(ctx, q); !errors.Is(err, sandbox.ErrNotFound) {
		s.t.Errorf("Stat after Remove: %v, want ErrNotFound", err)
	}
	if err := a.Remove(ctx, dir, true); err != nil {
		s.t.Fatalf("Remove recursive: %v", err)
	}
}

func (s *suite) getList() {
	d := s.decl("conf-get")
	sess := s.create(d)
	got, err := s.b.Get(s.ctx(), sess.ID)
	if err != nil {
		s.t.Fatalf("Get: %v", err)
	}
	if got.ID != sess.ID || got.SandboxID != d.ID || got.State != sandbox.StateRunning {
		s.t.Errorf("Get = %+v", got)
	}
	list, err := s.b.List(s.ctx())
	if err != nil {
		s.t.Fatalf("List: %v", err)
	}
	if !slices.ContainsFunc(list, func(x *sandbox.Session) bool { return x.ID == sess.ID }) {
		s.t.Errorf("List does not include %s", sess.ID)
	}
	if _, err := s.b.Get(s.ctx(), sess.ID+"0"); !errors.Is(err, sandbox.ErrNotFound) && !errors.Is(err, sandbox.ErrInvalid) {
		s.t.Errorf("Get of an unknown id: %v, want ErrNotFound or ErrInvalid", err)
	}
}

func (s *suite) connectTwice() {
	sess := s.create(s.decl("conf-connect"))
	a1 := s.connect(sess.ID)
	a2 := s.connect(sess.ID)
	if got := s.sh(a1, "echo one"); got.stdout != "one\n" {
		s.t.Errorf("first client: %q", got.stdout)
	}
	if got := s.sh(a2, "echo two"); got.stdout != "two\n" {
		s.t.Errorf("second client: %q", got.stdout)
	}
	a1.Close()
	if got := s.sh(a2, "echo still"); got.stdout != "still\n" {
		s.t.Errorf("second client after the first closed: %q", got.stdout)
	}
}

func (s *suite) terminate() {
	sess, err := s.b.Create(s.ctx(), s.decl("conf-term"))
	if err != nil {
		s.t.Fatalf("Create: %v", err)
	}
	a := s.connect(sess.ID)
	if got := s.sh(a, "echo up"); got.stdout != "up\n" {
		s.t.Fatalf("exec before terminate: %q", got.stdout)
	}
	if err := s.b.Terminate(s.ctx(), sess.ID); err != nil {
		s.t.Fatalf("Terminate: %v", err)
	}
	if err := s.b.Terminate(s.ctx(), sess.ID); err != nil {
		s.t.Errorf("second Terminate: %v, want nil (idempotent)", err)
	}
	if _, err := s.b.Get(s.ctx(), sess.ID); !errors.Is(err, sandbox.ErrNotFound) {
		s.t.Errorf("Get after Terminate: %v, want ErrNotFound", err)
	}
	list, err := s.b.List(s.ctx())
	if err != nil {
		s.t.Fatalf("List: %v", err)
	}
	if slices.ContainsFunc(list, func(x *sandbox.Session) bool { return x.ID == sess.ID }) {
		s.t.Errorf("List after Terminate still includes %s", sess.ID)
	}
	var out bytes.Buffer
	if _, err := a.Exec(s.ctx(), sandbox.ExecRequest{Shell: "echo ghost", Timeout: 10 * time.Second}, &out, &out); err == nil {
		s.t.Errorf("Exec after Terminate succeeded (output %q)", out.String())
	}
	if _, err := s.b.Connect(s.ctx(), sess.ID); !errors.Is(err, sandbox.ErrNotFound) {
		s.t.Errorf("Connect after Terminate: %v, want ErrNotFound", err)
	}
}

func (s *suite) concurrent() {
	const n = 3
	sessions := make([]*sandbox.Session, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sessions[i], errs[i] = s.b.Create(s.ctx(), s.decl(fmt.Sprintf("conf-conc-%d", i)))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			s.t.Fatalf("concurrent Create %d: %v", i, err)
		}
		id := sessions[i].ID
		s.t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), s.opts.OpTimeout)
			defer cancel()
			if err := s.b.Terminate(ctx, id); err != nil {
				s.t.Errorf("Terminate(%s): %v", id, err)
			}
		})
	}
	ids := map[string]bool{}
	for _, sess := range sessions {
		if ids[sess.ID] {
			s.t.Fatalf("two creates returned the same session id %s", sess.ID)
		}
		ids[sess.ID] = true
	}
	agents := make([]sandbox.Agent, n)
	for i, sess := range sessions {
		agents[i] = s.connect(sess.ID)
	}
	if got := s.sh(agents[0], "echo secret > /tmp/only-in-0 && echo ok"); got.stdout != "ok\n" {
		s.t.Fatalf("write in sandbox 0: %+v %q", got.res, got.stderr)
	}
	for i := 1; i < n; i++ {
		got := s.sh(agents[i], "test -e /tmp/only-in-0 && echo visible || echo absent")
		if got.stdout != "absent\n" {
			s.t.Errorf("sandbox %d sees sandbox 0's file: %q", i, got.stdout)
		}
	}
}
