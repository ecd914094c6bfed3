package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/internal/backoff"
	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// The capability walk. Every capability a backend's set says yes to must be exercised by a
// subtest of this suite that ran and passed (exercisedBy); every no must be refused: by Create,
// with ErrRefused naming the capability, for a declaration that needs it (needsDecl); by
// sandbox.Feature for an optional feature no declaration asks for (ErrUnsupported naming it).
// A no on one of the agent's own operations no declaration asks for (backgroundProcesses where
// a degraded kill cannot reach everything, stdin, pty, files) can only be checked for its reason.

// ran records which subtests ran to the end and passed, for the walk.
type ran struct {
	mu     sync.Mutex
	passed map[string]bool
}

func (r *ran) note(name string, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.passed == nil {
		r.passed = map[string]bool{}
	}
	r.passed[name] = ok
}

func (r *ran) ok(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.passed[name]
}

// needsDecl makes a declaration that needs the capability, from the suite's own declaration.
// Capabilities every declaration needs (limits, lifetime, egress deny by default...) return d
// as it is.
var needsDecl = map[capability.Name]func(d *spec.Sandbox, t testing.TB){
	capability.Reconnect: func(d *spec.Sandbox, _ testing.TB) { d.Session.Reconnect = ptr(true) },
	capability.Preview:   func(d *spec.Sandbox, _ testing.TB) { d.PreviewPorts = []int{8080} },
	capability.Snapshot:  func(d *spec.Sandbox, _ testing.TB) { d.Image = spec.Image{Snapshot: "conformance-walk"} },
	capability.DomainEgressRules: func(d *spec.Sandbox, _ testing.TB) {
		d.Egress = spec.Egress{Mode: spec.EgressAllowDomains, Domains: []string{"example.com"}}
	},
	capability.EgressDeny:       func(d *spec.Sandbox, _ testing.TB) { d.Egress = spec.Egress{Mode: spec.EgressDeny} },
	capability.PublicOnlyEgress: func(d *spec.Sandbox, _ testing.TB) { d.Egress = spec.Egress{Mode: spec.EgressAllow} },
	capability.EnforcedLimits:   func(d *spec.Sandbox, _ testing.TB) { d.Limits.Memory = "256Mi" },
	capability.ProcessLimit:     func(d *spec.Sandbox, _ testing.TB) { d.Limits.MaxProcesses = ptr(int64(64)) },
	capability.DiskLimit:        func(d *spec.Sandbox, _ testing.TB) { d.Limits.Disk = "64Mi" },
	capability.SessionLifetime:  func(d *spec.Sandbox, _ testing.TB) { d.Session.MaxLifetimeSeconds = ptr(int64(600)) },
	capability.IdleTimeout: func(d *spec.Sandbox, _ testing.TB) {
		d.Session.MaxLifetimeSeconds, d.Session.IdleTimeoutSeconds = ptr(int64(600)), ptr(int64(60))
	},
	capability.Env:           func(d *spec.Sandbox, _ testing.TB) { d.Env = map[string]string{"A": "b"} },
	capability.GVisor:        func(d *spec.Sandbox, _ testing.TB) { d.Runtime = spec.RuntimeGVisor },
	capability.Labels:        func(d *spec.Sandbox, _ testing.TB) { d.Labels = map[string]string{"conformance": "walk"} },
	capability.Workdir:       func(d *spec.Sandbox, _ testing.TB) { d.Workdir = "/work" },
	capability.ImageHost:     func(d *spec.Sandbox, _ testing.TB) { d.Image = spec.Image{Host: true} },
	capability.ImageOCI:      func(d *spec.Sandbox, t testing.TB) { d.Image = spec.Image{OCILayout: t.TempDir()} },
	capability.ImageRef:      func(d *spec.Sandbox, _ testing.TB) { d.Image = spec.Image{Ref: "registry.invalid/conformance:walk"} },
	capability.ImageDir:      func(d *spec.Sandbox, t testing.TB) { d.Image = spec.Image{Dir: t.TempDir()} },
	capability.DockerRuntime: func(d *spec.Sandbox, _ testing.TB) { d.Runtime = spec.RuntimeDocker },
}

// features are the optional interfaces, by capability: a no must make sandbox.Feature refuse.
var features = map[capability.Name]func(context.Context, sandbox.Backend) error{
	capability.SuspendResume: func(ctx context.Context, b sandbox.Backend) error {
		_, err := sandbox.Feature[sandbox.Pauser](ctx, b)
		return err
	},
	capability.Stats: func(ctx context.Context, b sandbox.Backend) error {
		_, err := sandbox.Feature[sandbox.StatsReader](ctx, b)
		return err
	},
	capability.LiveEgress: func(ctx context.Context, b sandbox.Backend) error {
		_, err := sandbox.Feature[sandbox.EgressSetter](ctx, b)
		return err
	},
	capability.Preview: func(ctx context.Context, b sandbox.Backend) error {
		_, err := sandbox.Feature[sandbox.Previewer](ctx, b)
		return err
	},
	capability.Snapshot: func(ctx context.Context, b sandbox.Backend) error {
		_, err := sandbox.Feature[sandbox.Snapshotter](ctx, b)
		return err
	},
}

func ptr[T any](v T) *T { return &v }

// walk checks b's set against what the suite ran, reporting each problem with t.Errorf.
func walk(t testing.TB, b sandbox.Backend, opts Options, exercisedBy map[capability.Name][]string, r *ran) {
	ctx, cancel := context.WithTimeout(context.Background(), opts.OpTimeout)
	defer cancel()
	set := b.Capabilities(ctx)
	for _, n := range capability.Names {
		st, ok := set.Entries[n]
		if !ok {
			t.Errorf("%s: the %s set does not publish it", n, b.Platform())
			continue
		}
		if st.Supported {
			subs := exercisedBy[n]
			if !slices.ContainsFunc(subs, r.ok) {
				t.Errorf("%s: yes, but no subtest exercising it ran and passed (subtests: %v)", n, subs)
			}
			continue
		}
		if st.Reason == "" {
			t.Errorf("%s: no, without a reason", n)
		}
		if f, ok := features[n]; ok {
			if err := f(ctx, b); !errors.Is(err, sandbox.ErrUnsupported) || !strings.Contains(err.Error(), string(n)) {
				t.Errorf("%s: no, but sandbox.Feature = %v, want ErrUnsupported naming it", n, err)
			}
		}
		mod, ok := needsDecl[n]
		if !ok {
			continue // no declaration asks for it: the reason is the whole check
		}
		d := opts.Decl("conf-walk")
		mod(&d, t)
		d = plan.Defaults(b.Platform(), set, d)
		sess, err := b.Create(ctx, d)
		if err == nil {
			t.Errorf("%s: no, but Create of a declaration needing it succeeded", n)
			if terr := b.Terminate(ctx, sess.ID); terr != nil {
				t.Errorf("Terminate(%s): %v", sess.ID, terr)
			}
			continue
		}
		if !errors.Is(err, sandbox.ErrRefused) {
			t.Errorf("%s: no; Create = %v, want ErrRefused", n, err)
			continue
		}
		var names []capability.Name
		for e := range refusals(err) {
			names = append(names, e.Capability)
		}
		if !slices.Contains(names, n) {
			t.Errorf("%s: no; Create's refusal %q does not name it", n, err)
		}
	}
}

// refusals yields every *plan.Refusal in err (joined or wrapped).
func refusals(err error) func(func(*plan.Refusal) bool) {
	return func(yield func(*plan.Refusal) bool) {
		var visit func(error) bool
		visit = func(e error) bool {
			if r, ok := e.(*plan.Refusal); ok {
				return yield(r)
			}
			switch u := e.(type) {
			case interface{ Unwrap() []error }:
				for _, x := range u.Unwrap() {
					if !visit(x) {
						return false
					}
				}
			case interface{ Unwrap() error }:
				if x := u.Unwrap(); x != nil {
					return visit(x)
				}
			}
			return true
		}
		visit(err)
	}
}

// waitGone polls Get until the session is gone, failing after the suite's op timeout.
func (s *suite) waitGone(id string, what string) {
	s.t.Helper()
	ctx := s.ctx()
	for wait := backoff.New(50*time.Millisecond, time.Second); ; {
		_, err := s.b.Get(ctx, id)
		if errors.Is(err, sandbox.ErrNotFound) {
			return
		}
		if err != nil && ctx.Err() == nil {
			s.t.Fatalf("Get(%s) while waiting for %s: %v", id, what, err)
		}
		if !wait.Wait(ctx) {
			s.t.Fatalf("session %s still there after %v: %s did not end it", id, s.opts.OpTimeout, what)
		}
	}
}

// lifetime: a sandbox declared to live 10 s is gone soon after, with nothing talking to it.
// Not shorter: the clock runs from the create, and a create on a slow machine (the cgroup v2
// VM, under emulation) took over 2 s, so a shorter life ended before the agent first answered.
func (s *suite) lifetime() {
	d := s.decl("conf-life")
	sess := s.create(d)
	if life := sess.ExpiresAt.Sub(sess.CreatedAt); life <= 0 || life > 11*time.Second {
		s.t.Errorf("session expires at %v, created %v: want 10s later", sess.ExpiresAt, sess.CreatedAt)
	}
	s.waitGone(sess.ID, "the 10s lifetime")
}

// idle: a sandbox with a 5 s idle timeout (and an hour to live) ends once nothing is active.
// 5 s for the same reason as lifetime's 10: the idle clock may start before the create returns.
func (s *suite) idle() {
	d := s.decl("conf-idle")
	sess := s.create(d)
	s.waitGone(sess.ID, "the 5s idle timeout")
}

// stdin: the command reads what the caller streams.
func (s *suite) stdin() {
	sess := s.create(s.decl("conf-stdin"))
	a := s.connect(sess.ID)
	got := s.exec(a, sandbox.ExecRequest{Argv: []string{"cat"}, Stdin: strings.NewReader("fed through stdin\n")})
	if got.stdout != "fed through stdin\n" || got.res.ExitCode != 0 {
		s.t.Errorf("cat of stdin = %q %+v", got.stdout, got.res)
	}
}

// pty: with tty the command's stdin and stdout are a terminal.
func (s *suite) pty() {
	sess := s.create(s.decl("conf-pty"))
	a := s.connect(sess.ID)
	got := s.exec(a, sandbox.ExecRequest{Shell: "test -t 0 && test -t 1 && echo terminal", TTY: true})
	if strings.TrimSpace(got.stdout) != "terminal" {
		s.t.Errorf("with tty: %q %+v", got.stdout, got.res)
	}
	plain := s.exec(a, sandbox.ExecRequest{Shell: "test -t 1 && echo terminal || echo pipe"})
	if plain.stdout != "pipe\n" {
		s.t.Errorf("without tty: %q", plain.stdout)
	}
}

// processStarter is the agent's background-process API (agent/client.Client).
type processStarter interface {
	StartProcess(ctx context.Context, req client.ProcessRequest, opts ...client.ExecOption) (client.Process, error)
	Wait(ctx context.Context, id string) (sandbox.ExecResult, error)
	RemoveProcess(ctx context.Context, id string) error
}

// background: a process outlives the request that started it, and removing it kills it and
// everything it started, setsid children included.
func (s *suite) background() {
	sess := s.create(s.decl("conf-bg"))
	a := s.connect(sess.ID)
	ps, ok := a.(processStarter)
	if !ok {
		s.t.Fatalf("the agent client %T has no background processes", a)
	}
	ctx := s.ctx()
	const code = `import os, time
if os.fork() == 0:
    os.setsid()
    open("/tmp/escapee", "w").write(str(os.getpid()) + "\n")
    time.sleep(600)
open("/tmp/main", "w").write(str(os.getpid()) + "\n")
time.sleep(600)
`
	p, err := ps.StartProcess(ctx, client.ProcessRequest{ExecRequest: sandbox.ExecRequest{
		Argv: []string{"python3", "-c", code}, Timeout: 10 * time.Minute}})
	if err != nil {
		s.t.Fatalf("StartProcess: %v", err)
	}
	// Both are up, and the start request has long returned.
	var pids []string
	for i := 0; ; i++ {
		got := s.sh(a, "cat /tmp/escapee /tmp/main 2>/dev/null")
		if pids = strings.Fields(got.stdout); len(pids) == 2 {
			break
		}
		if i > 200 {
			s.t.Fatalf("the background process did not start its children: %q", got.stdout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := ps.RemoveProcess(ctx, p.ID); err != nil {
		s.t.Fatalf("RemoveProcess: %v", err)
	}
	for _, pid := range pids {
		if _, err := strconv.Atoi(pid); err != nil {
			s.t.Fatalf("pid %q", pid)
		}
		// Gone, or a zombie its reaper has not waited for yet.
		st := "s=$(cut -d' ' -f3 /proc/" + pid + "/stat 2>/dev/null); if [ -z \"$s\" ] || [ \"$s\" = Z ]; then echo gone; else echo alive; fi"
		if got := s.sh(a, st); got.stdout != "gone\n" {
			s.t.Errorf("process %s of the removed background process is %s", pid, strings.TrimSpace(got.stdout))
		}
	}
}

// labels: the declaration's labels come back with the session.
func (s *suite) labels() {
	d := s.decl("conf-labels")
	sess := s.create(d)
	got, err := s.b.Get(s.ctx(), sess.ID)
	if err != nil {
		s.t.Fatal(err)
	}
	for k, v := range d.Labels {
		if got.Labels[k] != v || sess.Labels[k] != v {
			s.t.Errorf("label %s: Create %q, Get %q, want %q", k, sess.Labels[k], got.Labels[k], v)
		}
	}
}

// egressDeny: a deny sandbox has no network interface but loopback, so no route anywhere.
func (s *suite) egressDeny() {
	sess := s.create(s.decl("conf-deny"))
	a := s.connect(sess.ID)
	got := s.sh(a, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
	if got.stdout != "lo\n" {
		s.t.Errorf("interfaces of a deny sandbox: %q, want only lo", got.stdout)
	}
}

// memoryCeiling: a process that touches more than the ceiling is killed; one below it is not.
func (s *suite) memoryCeiling() {
	d := s.decl("conf-mem")
	sess := s.create(d)
	a := s.connect(sess.ID)
	under := s.sh(a, "python3 -c 'b = bytearray(16 << 20); print(len(b))'")
	if under.res.ExitCode != 0 || under.stdout != "16777216\n" {
		s.t.Fatalf("16 MiB under a 128Mi ceiling: %+v %q %q", under.res, under.stdout, under.stderr)
	}
	over := s.sh(a, "python3 -c 'b = bytearray(512 << 20); print(len(b))'")
	if over.res.ExitCode == 0 || over.stdout != "" {
		s.t.Errorf("512 MiB under a 128Mi ceiling: %+v %q, want killed", over.res, over.stdout)
	}
}

// processLimit: no more processes than declared run at once.
func (s *suite) processLimit() {
	d := s.decl("conf-pids")
	sess := s.create(d)
	a := s.connect(sess.ID)
	// Each child blocks; forks past the limit fail (EAGAIN), which the script counts.
	got := s.sh(a, `python3 -c '
import os, time
ok = 0
for i in range(100):
    try:
        if os.fork() == 0:
            time.sleep(30); os._exit(0)
        ok += 1
    except OSError:
        break
print(ok, flush=True)
os.killpg(0, 9)
'`)
	n, err := strconv.Atoi(strings.TrimSpace(got.stdout))
	if err != nil {
		s.t.Fatalf("fork count: %q %q %+v", got.stdout, got.stderr, got.res)
	}
	if n >= 32 || n < 1 {
		s.t.Errorf("%d children forked under maxProcesses 32, want fewer than 32 and at least one", n)
	}
}

// diskLimit: the writable layer holds no more than declared.
func (s *suite) diskLimit() {
	d := s.decl("conf-disk")
	sess := s.create(d)
	a := s.connect(sess.ID)
	got := s.sh(a, "head -c 67108864 /dev/zero > big; echo status $?; wc -c < big")
	lines := strings.Fields(got.stdout)
	if len(lines) != 3 || lines[1] == "0" {
		s.t.Fatalf("writing 64 MiB under a 16Mi disk limit: %q, want a failed write", got.stdout)
	}
	if n, err := strconv.ParseInt(lines[2], 10, 64); err != nil || n > 16<<20 {
		s.t.Errorf("wrote %s bytes under a 16Mi disk limit", lines[2])
	}
	// The write fails at the limit (ENOSPC), not by the sandbox being killed afterwards: the
	// same session runs code again, and the space comes back when the file goes.
	if !strings.Contains(got.stderr, "No space left on device") {
		s.t.Errorf("the write past the disk limit failed with %q, want ENOSPC", got.stderr)
	}
	if after := s.sh(a, "rm big && head -c 1048576 /dev/zero > small && wc -c < small"); after.stdout != "1048576\n" {
		s.t.Errorf("after the full disk: %+v %q %q, want the sandbox to run on", after.res, after.stdout, after.stderr)
	}
}

// pauser: a paused sandbox runs nothing and reports paused; resumed, it runs again.
func (s *suite) pauser() {
	p, err := sandbox.Feature[sandbox.Pauser](s.ctx(), s.b)
	if err != nil {
		s.t.Fatalf("Feature[Pauser]: %v", err)
	}
	sess := s.create(s.decl("conf-pause"))
	a := s.connect(sess.ID)
	if err := p.Pause(s.ctx(), sess.ID); err != nil {
		s.t.Fatalf("Pause: %v", err)
	}
	if got, err := s.b.Get(s.ctx(), sess.ID); err != nil || got.State != sandbox.StatePaused {
		s.t.Errorf("Get while paused: %+v %v, want state paused", got, err)
	}
	short, cancel := context.WithTimeout(s.ctx(), time.Second)
	defer cancel()
	var out bytes.Buffer
	if _, err := a.Exec(short, sandbox.ExecRequest{Shell: "echo ran", Timeout: 10 * time.Second}, &out, &out); err == nil && out.String() == "ran\n" {
		s.t.Errorf("an exec ran in a paused sandbox")
	}
	if err := p.Resume(s.ctx(), sess.ID); err != nil {
		s.t.Fatalf("Resume: %v", err)
	}
	if got := s.sh(s.connect(sess.ID), "echo after"); got.stdout != "after\n" {
		s.t.Errorf("exec after Resume: %q", got.stdout)
	}
}

// stats: usage grows with what the code does.
func (s *suite) stats() {
	r, err := sandbox.Feature[sandbox.StatsReader](s.ctx(), s.b)
	if err != nil {
		s.t.Fatalf("Feature[StatsReader]: %v", err)
	}
	sess := s.create(s.decl("conf-stats"))
	a := s.connect(sess.ID)
	before, err := r.Stats(s.ctx(), sess.ID)
	if err != nil {
		s.t.Fatalf("Stats: %v", err)
	}
	if before.MemoryBytes <= 0 || before.Processes < 1 {
		s.t.Errorf("Stats of a running sandbox = %+v, want memory and at least one process", before)
	}
	// Half a second of CPU at least, whatever the machine's load: counted, not timed.
	s.sh(a, "python3 -c 'import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass'")
	after, err := r.Stats(s.ctx(), sess.ID)
	if err != nil {
		s.t.Fatalf("Stats: %v", err)
	}
	if after.CPUSeconds-before.CPUSeconds < 0.5 {
		s.t.Errorf("cpu seconds %v then %v after 0.5 s of cpu", before.CPUSeconds, after.CPUSeconds)
	}
	if after.MemoryPeakBytes != 0 && after.MemoryPeakBytes < after.MemoryBytes {
		s.t.Errorf("memory peak %d below memory now %d", after.MemoryPeakBytes, after.MemoryBytes)
	}
	if _, err := r.Stats(s.ctx(), sess.ID+"0"); !errors.Is(err, sandbox.ErrNotFound) && !errors.Is(err, sandbox.ErrInvalid) {
		s.t.Errorf("Stats of an unknown session: %v, want ErrNotFound or ErrInvalid", err)
	}
}

// liveEgress: a deny sandbox given a hostname allowlist gets a network link; back to deny, it
// has only loopback again.
func (s *suite) liveEgress() {
	e, err := sandbox.Feature[sandbox.EgressSetter](s.ctx(), s.b)
	if err != nil {
		s.t.Fatalf("Feature[EgressSetter]: %v", err)
	}
	sess := s.create(s.decl("conf-live-egress"))
	a := s.connect(sess.ID)
	ifaces := func() string {
		return s.sh(a, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort | tr '\\n' ' '").stdout
	}
	if got := ifaces(); got != "lo " {
		s.t.Fatalf("deny sandbox interfaces %q", got)
	}
	if err := e.SetEgress(s.ctx(), sess.ID, spec.Egress{Mode: spec.EgressAllowDomains, Domains: []string{"example.com"}}); err != nil {
		s.t.Fatalf("SetEgress(allowDomains): %v", err)
	}
	if got := ifaces(); got == "lo " {
		s.t.Errorf("after SetEgress(allowDomains) only loopback: %q", got)
	}
	if err := e.SetEgress(s.ctx(), sess.ID, spec.Egress{Mode: spec.EgressDeny}); err != nil {
		s.t.Fatalf("SetEgress(deny): %v", err)
	}
	if got := ifaces(); got != "lo " {
		s.t.Errorf("after SetEgress(deny): %q, want only lo", got)
	}
	if err := e.SetEgress(s.ctx(), sess.ID, spec.Egress{Mode: "sideways"}); err == nil {
		s.t.Errorf("SetEgress of an unknown mode succeeded")
	}
}

// previewer: a declared port is reachable through the preview address with its token, and
// not without it.
func (s *suite) previewer() {
	pv, err := sandbox.Feature[sandbox.Previewer](s.ctx(), s.b)
	if err != nil {
		s.t.Fatalf("Feature[Previewer]: %v", err)
	}
	d := s.decl("conf-preview")
	sess := s.create(d)
	if _, err := pv.Preview(s.ctx(), sess.ID, 8081, 0); err == nil {
		s.t.Errorf("Preview of an undeclared port succeeded")
	}
	info, err := pv.Preview(s.ctx(), sess.ID, 8080, time.Minute)
	if err != nil {
		s.t.Fatalf("Preview: %v", err)
	}
	if info.URL == "" || info.Token == "" || info.Port != 8080 || !strings.Contains(info.URL, info.Token) {
		s.t.Errorf("Preview = %+v, want a URL carrying its token", info)
	}
	if !info.ExpiresAt.After(time.Now()) {
		s.t.Errorf("preview expires at %v, already past", info.ExpiresAt)
	}
}

// snapshotter: a snapshot keeps the sandbox's files; a sandbox made from it and a fork see them.
func (s *suite) snapshotter() {
	sn, err := sandbox.Feature[sandbox.Snapshotter](s.ctx(), s.b)
	if err != nil {
		s.t.Fatalf("Feature[Snapshotter]: %v", err)
	}
	d := s.decl("conf-snap")
	sess := s.create(d)
	a := s.connect(sess.ID)
	s.sh(a, "echo kept > "+path.Join(d.Workdir, "kept.txt"))
	name := fmt.Sprintf("conf-%d", time.Now().UnixNano())
	if _, err := sn.Snapshot(s.ctx(), sess.ID, name); err != nil {
		s.t.Fatalf("Snapshot: %v", err)
	}
	s.t.Cleanup(func() { _ = sn.DeleteSnapshot(context.Background(), name) })
	list, err := sn.ListSnapshots(s.ctx())
	if err != nil || !slices.ContainsFunc(list, func(x sandbox.SnapshotInfo) bool { return x.Name == name }) {
		s.t.Errorf("ListSnapshots = %v, %v; want %s", list, err, name)
	}
	from := s.decl("conf-from-snap")
	from.Image = spec.Image{Snapshot: name}
	restored := s.create(from)
	if got := s.sh(s.connect(restored.ID), "cat "+path.Join(d.Workdir, "kept.txt")); got.stdout != "kept\n" {
		s.t.Errorf("file in a sandbox made from the snapshot: %q", got.stdout)
	}
	forks, err := sn.Fork(s.ctx(), sess.ID, 1)
	if err != nil {
		s.t.Fatalf("Fork: %v", err)
	}
	for _, f := range forks {
		s.t.Cleanup(func() { _ = s.b.Terminate(context.Background(), f.ID) })
		if got := s.sh(s.connect(f.ID), "cat "+path.Join(d.Workdir, "kept.txt")); got.stdout != "kept\n" {
			s.t.Errorf("file in a fork: %q", got.stdout)
		}
	}
	if err := sn.DeleteSnapshot(s.ctx(), name); err != nil {
		s.t.Errorf("DeleteSnapshot: %v", err)
	}
}
