package local

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/backend/local/nsinit"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// The rootless test's user and the subordinate ids the test gives it.
const (
	rootlessUID, rootlessGID = 65534, 65534 // nobody, nogroup: on every Debian
	rootlessSub              = 3000000000   // far above any sandbox range of root's
	rootlessEnv              = "AIRLOCK_ROOTLESS_CHILD"
)

// TestRootless: as root, it gives nobody what a rootless runtime needs (subordinate ids in
// /etc/subuid and /etc/subgid; cgroups delegated in every v1 hierarchy, or on v2 a delegated
// subtree the child runs in, as systemd's Delegate=yes gives user@<uid>.service), then runs
// TestRootlessChild as nobody; afterwards nothing of it is left. New refuses, naming what is
// missing: the subordinate ids, and on v2 the delegation, a process in the delegation's root,
// a controller not delegated, a cgroup parent outside the delegation.
func TestRootless(t *testing.T) {
	testutil.RequireRoot(t)
	for _, helper := range []string{"newuidmap", "newgidmap"} {
		if _, err := exec.LookPath(helper); err != nil {
			t.Fatalf("%s: %v (the uidmap package; .ci/run installs it)", helper, err)
		}
	}
	cg, err := newCgroupDriver("airlock-test")
	if err != nil {
		t.Fatal(err)
	}
	v2 := cg.version() == 2
	rnd := make([]byte, 4)
	_, _ = rand.Read(rnd)
	top := RootlessCgroupParent(rootlessUID) + "-test-" + hex.EncodeToString(rnd)
	// v1: top in every hierarchy, the child's sandboxes in top/sandboxes. v2: top is root's
	// (as user-<uid>.slice is), deleg in it the user's subtree (user@<uid>.service), the
	// child born in its leaf deleg/session; its sandboxes go to the default parent.
	var deleg, leaf string
	if v2 {
		x := filepath.Join(cgroupRoot, top)
		deleg, leaf = filepath.Join(x, "deleg"), filepath.Join(x, "deleg", "session")
		v2Cgroups(t, x, "+cpu +memory +pids", false)
		v2Cgroups(t, deleg, "", true)
		v2Cgroups(t, leaf, "", true)
		t.Cleanup(func() { removeCgroupTree(t, x) })
	} else {
		for _, ctrl := range v1Controllers {
			d := filepath.Join(cgroupRoot, ctrl, top)
			if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, fs.ErrExist) { // cpu and cpuacct may be one
				t.Fatal(err)
			}
			if err := os.Chown(d, rootlessUID, rootlessGID); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() {
			for _, ctrl := range v1Controllers {
				removeCgroupTree(t, filepath.Join(cgroupRoot, ctrl, top))
			}
		})
	}
	// What nobody may read and run: this test binary and the agent, in a dir of their own.
	work := openTempDir(t, "al-rootless-")
	self := filepath.Join(work, "local.test")
	copyFile(t, os.Args[0], self, 0o755)
	agent := filepath.Join(work, "airlock-agent")
	copyFile(t, agentBin, agent, 0o755)
	// Its own 0700 dirs, as XDG_RUNTIME_DIR is: the state dir inside needs no one else's search.
	run := filepath.Join(work, "run")
	state := filepath.Join(run, "airlock")
	cache := filepath.Join(work, "cache")
	for _, d := range []string{run, cache} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, rootlessUID, rootlessGID); err != nil {
			t.Fatal(err)
		}
	}
	// child runs TestRootlessChild as nobody; on v2 born in the cgroup bornIn (clone3), as a
	// process of the user's is born in its delegated unit.
	child := func(expect, parent, bornIn string) (string, error) {
		cmd := exec.Command(self, "-test.run=^TestRootlessChild$", "-test.v", "-test.count=1")
		cmd.Dir = work
		cmd.Env = []string{
			rootlessEnv + "=1", "PATH=" + os.Getenv("PATH"), "HOME=" + work, "XDG_CACHE_HOME=" + cache,
			"AIRLOCK_ROOTLESS_STATE=" + state, "AIRLOCK_ROOTLESS_AGENT=" + agent,
			"AIRLOCK_ROOTLESS_CGROUP=" + parent, "AIRLOCK_ROOTLESS_EXPECT=" + expect,
			"AIRLOCK_ROOTLESS_DELEGATION=" + deleg,
			"AIRLOCK_ROOTLESS_SUB=" + strconv.Itoa(rootlessSub),
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: rootlessUID, Gid: rootlessGID}}
		if v2 {
			fd, err := unix.Open(bornIn, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fd)
			cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
		}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	parent := "" // the default: below the delegation (v2)
	if !v2 {
		parent = top + "/sandboxes"
	}

	// Without subordinate ids: refused, naming them.
	if out, err := child("refused", parent, leaf); err == nil || !strings.Contains(out, "subordinate ids") {
		t.Fatalf("without subordinate ids: %v\n%s", err, out)
	}

	for _, f := range []string{"/etc/subuid", "/etc/subgid"} {
		orig, err := os.ReadFile(f)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
		add := append(bytes.Clone(orig), []byte("nobody:"+strconv.Itoa(rootlessSub)+":65536\n")...)
		if err := os.WriteFile(f, add, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := os.WriteFile(f, orig, 0o644); err != nil {
				t.Errorf("restore %s: %v", f, err)
			}
		})
	}
	if v2 {
		testRootlessV2Refusals(t, filepath.Join(cgroupRoot, top), leaf, child)
	}
	out, err := child("", parent, leaf)
	if err != nil || !strings.Contains(out, "--- PASS: TestRootlessChild") {
		t.Fatalf("rootless child: %v\n%s", err, out)
	}
	t.Log(out)
	// The child terminated its sandboxes: no cgroup below the parents, no session.
	var parents []string
	if v2 {
		parents, _ = filepath.Glob(filepath.Join(deleg, "airlock-*"))
		if len(parents) == 0 {
			t.Errorf("no default cgroup parent airlock-<hash> in %s", deleg)
		}
	} else {
		for _, ctrl := range v1Controllers {
			parents = append(parents, filepath.Join(cgroupRoot, ctrl, top, "sandboxes"))
		}
	}
	for _, p := range parents {
		ents, err := os.ReadDir(p)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
		for _, e := range ents {
			if e.IsDir() {
				t.Errorf("cgroup %s left in %s", e.Name(), p)
			}
		}
	}
	ents, _ := os.ReadDir(state)
	for _, e := range ents {
		if checkSessionID(e.Name()) == nil {
			t.Errorf("session %s left in the state dir", e.Name())
		}
	}
}

// testRootlessV2Refusals: each cgroup layout that does not give nobody a usable delegation
// is refused by New, naming what is missing. x is root's, with cpu, memory and pids enabled
// for its children; good is a leaf of a proper delegation in it.
func testRootlessV2Refusals(t *testing.T, x, good string, child func(expect, parent, bornIn string) (string, error)) {
	for _, tc := range []struct {
		name   string
		layout func() string // makes the cgroups, returns where the child is born
		parent string
		want   []string
	}{
		{"no delegation", func() string {
			v2Cgroups(t, filepath.Join(x, "plain"), "", false)
			v2Cgroups(t, filepath.Join(x, "plain", "session"), "", false)
			return filepath.Join(x, "plain", "session")
		}, "", []string{"needs a cgroup subtree delegated to uid 65534", "cgroup.procs", "Delegate=yes", "chown"}},
		{"in the delegation's root", func() string {
			v2Cgroups(t, filepath.Join(x, "inroot"), "", true)
			return filepath.Join(x, "inroot")
		}, "", []string{"the root of the cgroup subtree delegated to uid 65534", "move it to a leaf"}},
		{"a controller not delegated", func() string {
			v2Cgroups(t, filepath.Join(x, "nocpu"), "+memory +pids", false)
			v2Cgroups(t, filepath.Join(x, "nocpu", "deleg"), "", true)
			v2Cgroups(t, filepath.Join(x, "nocpu", "deleg", "session"), "", true)
			return filepath.Join(x, "nocpu", "deleg", "session")
		}, "", []string{"not delegated: cpu.", "Delegate=cpu cpuset io memory pids", "echo '+cpu' > $f"}},
		{"a parent outside the delegation", func() string { return good },
			strings.TrimPrefix(x, cgroupRoot+"/") + "/elsewhere", []string{"is not inside", "leave cgroupParent empty"}},
		{"the parent is the process's own cgroup", func() string { return good },
			strings.TrimPrefix(good, cgroupRoot+"/"), []string{"is this process's own cgroup", "name a cgroup beside it"}},
		{"a common ancestor not the user's", func() string {
			// Delegated at the top, but the cgroup between it and the process is root's.
			v2Cgroups(t, filepath.Join(x, "gap"), "", true)
			v2Cgroups(t, filepath.Join(x, "gap", "mid"), "", false)
			v2Cgroups(t, filepath.Join(x, "gap", "mid", "session"), "", true)
			return filepath.Join(x, "gap", "mid", "session")
		}, strings.TrimPrefix(x, cgroupRoot+"/") + "/gap/mid/sandboxes", []string{"of the common ancestor", "gap/mid/cgroup.procs"}},
		{"another process in the delegation's root", func() string {
			d := filepath.Join(x, "busy")
			v2Cgroups(t, d, "", true)
			v2Cgroups(t, filepath.Join(d, "session"), "", true)
			fd, err := unix.Open(d, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fd)
			sleeper := exec.Command("sleep", "600")
			sleeper.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
			if err := sleeper.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() })
			return filepath.Join(d, "session")
		}, "", []string{"it holds processes", "move them to a leaf"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := child("refused", tc.parent, tc.layout())
			if err == nil || !strings.Contains(out, "refused as expected") {
				t.Fatalf("not refused: %v\n%s", err, out)
			}
			if i := strings.Index(out, "refused as expected"); i >= 0 {
				t.Log(strings.SplitN(out[i:], "\n", 2)[0])
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("refusal does not say %q:\n%s", w, out)
				}
			}
		})
	}
	if _, err := os.Stat(filepath.Join(x, "elsewhere")); err == nil {
		t.Error("the refused parent outside the delegation was made")
	}
}

// v2Cgroups makes a cgroup v2 directory as root, enables ctrls (if any) for its children and,
// with chown, gives it to nobody the way a delegation does: the directory, and cgroup.procs,
// cgroup.subtree_control and cgroup.threads.
func v2Cgroups(t *testing.T, dir, ctrls string, chown bool) {
	t.Helper()
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if ctrls != "" {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(ctrls), 0); err != nil {
			t.Fatal(err)
		}
	}
	if chown {
		for _, f := range []string{"", "cgroup.procs", "cgroup.subtree_control", "cgroup.threads"} {
			if err := os.Chown(filepath.Join(dir, f), rootlessUID, rootlessGID); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// removeCgroupTree removes a cgroup directory and the ones below it, deepest first.
func removeCgroupTree(t *testing.T, dir string) {
	var dirs []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := os.Remove(dirs[i]); err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("cgroup %s: %v", dirs[i], err)
		}
	}
}

// TestRootlessChild is TestRootless's other half, run as nobody: a sandbox with limits runs
// code as a subordinate id (not the user), holds a fork bomb to its process limit, ends
// without a trace; egress other than deny is refused, naming the capability.
func TestRootlessChild(t *testing.T) {
	if os.Getenv(rootlessEnv) == "" {
		t.Skip("run by TestRootless, as an unprivileged user")
	}
	ctx := context.Background()
	opts := Options{
		StateDir: os.Getenv("AIRLOCK_ROOTLESS_STATE"), AgentPath: os.Getenv("AIRLOCK_ROOTLESS_AGENT"),
		CgroupParent: os.Getenv("AIRLOCK_ROOTLESS_CGROUP"),
	}
	b, err := New(ctx, opts)
	if os.Getenv("AIRLOCK_ROOTLESS_EXPECT") == "refused" {
		if err == nil || !errors.Is(err, sandbox.ErrUnsupported) {
			t.Fatalf("New was not refused: %v", err)
		}
		t.Fatalf("refused as expected: %v", err) // the parent looks for the reason
	}
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	v2 := b.cg.version() == 2
	parent := b.opts.CgroupParent
	if deleg := os.Getenv("AIRLOCK_ROOTLESS_DELEGATION"); v2 && !strings.HasPrefix(filepath.Join(cgroupRoot, parent), deleg+"/airlock-") {
		t.Fatalf("default cgroup parent %s, want a child airlock-<hash> of the delegation %s", parent, deleg)
	}
	// The published set: what the delegation enforces is true, what needs root false.
	caps := b.Capabilities(ctx)
	for n, want := range map[capability.Name]bool{
		capability.EnforcedLimits: true, capability.ProcessLimit: true, capability.SuspendResume: true,
		capability.EgressDeny: true, capability.PublicOnlyEgress: false, capability.DomainEgressRules: false,
		capability.GVisor: false, capability.Stats: true, capability.LiveEgress: false,
	} {
		if st := caps.Entries[n]; st.Supported != want {
			t.Errorf("capability %s: %+v, want supported %v", n, st, want)
		}
	}
	for _, n := range capability.Names {
		if st := caps.Entries[n]; !st.Supported {
			t.Logf("not supported: %s: %s", n, st.Reason)
		}
	}
	d := hostDecl("rootless")
	d.Limits.MaxProcesses = ptrInt(12)
	d.Limits.Memory = "96Mi"
	sess, err := b.Create(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	// The memory limit, read back from the sandbox's cgroup.
	memFile := filepath.Join(cgroupRoot, "memory", parent, sess.ID, "memory.limit_in_bytes")
	if v2 {
		memFile = filepath.Join(cgroupRoot, parent, sess.ID, "memory.max")
	}
	if got, err := os.ReadFile(memFile); err != nil || strings.TrimSpace(string(got)) != strconv.Itoa(96<<20) {
		t.Errorf("%s: %q %v, want %d", memFile, got, err, 96<<20)
	}
	defer func() {
		if err := b.Terminate(ctx, sess.ID); err != nil {
			t.Error(err)
		}
	}()
	a, err := b.Connect(ctx, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	sub := os.Getenv("AIRLOCK_ROOTLESS_SUB")
	out, _, res := run(t, a, `id -u; cat /proc/self/uid_map; echo x > /tmp/x && echo wrote`)
	fields := strings.Fields(out)
	if res.ExitCode != 0 || len(fields) < 8 || fields[0] != "1000" ||
		fields[1] != "0" || fields[2] != strconv.Itoa(os.Geteuid()) || fields[3] != "1" ||
		fields[4] != "1" || fields[5] != sub || fields[6] != "65535" || !strings.HasSuffix(out, "wrote\n") {
		t.Fatalf("inside: %q %+v", out, res)
	}
	// Seen from the host, code runs as the subordinate id for 1000, not as the user.
	want, _ := strconv.Atoi(sub)
	want += 999
	done := make(chan error, 1)
	go func() {
		_, err := a.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sleep", "3"}, Timeout: time.Minute}, io.Discard, io.Discard)
		done <- err
	}()
	hostUID := ""
	for deadline := time.Now().Add(20 * time.Second); hostUID == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var tasks []byte
		if v2 {
			// Each command in its exec cgroup below code.
			execs, _ := filepath.Glob(filepath.Join(cgroupRoot, parent, sess.ID, "code", "*", "cgroup.procs"))
			for _, f := range execs {
				p, _ := os.ReadFile(f)
				tasks = append(append(tasks, p...), '\n')
			}
		} else {
			tasks, _ = os.ReadFile(filepath.Join(cgroupRoot, "pids", parent, sess.ID, "code", "tasks"))
		}
		for _, p := range strings.Fields(string(tasks)) {
			st, err := os.ReadFile("/proc/" + p + "/status")
			if err != nil || !strings.HasPrefix(string(st), "Name:\tsleep\n") {
				continue
			}
			for _, l := range strings.Split(string(st), "\n") {
				if f := strings.Fields(l); len(f) > 1 && f[0] == "Uid:" {
					hostUID = f[1]
				}
			}
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if hostUID != strconv.Itoa(want) {
		t.Errorf("the code's sleep runs as host uid %q, want %d (the user is %d)", hostUID, want, os.Geteuid())
	}
	// A fork bomb stops at the process limit; the sandbox still answers.
	bomb := `python3 -c '
import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(5); os._exit(0)
        n += 1
except OSError:
    print("held at", n)
'`
	var o bytes.Buffer
	bctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	res, err = a.Exec(bctx, sandbox.ExecRequest{Shell: bomb, Timeout: 30 * time.Second}, &o, io.Discard)
	if err != nil || !strings.HasPrefix(o.String(), "held at ") {
		t.Fatalf("fork bomb: %q %+v %v", o.String(), res, err)
	}
	if n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(o.String(), "held at "))); n >= 12 {
		t.Errorf("fork bomb made %d processes with maxProcesses 12", n)
	}
	if v2 {
		// The agent's cgroup fd, cloned by init (rootless.go, startRootless), leads nowhere
		// by "..": not to the host's files (as in TestAgentFDsConfined), nor out of code to
		// the sandbox's own cgroup, whose limit files are the user's here. As the sandbox's
		// root, which the user may become (it owns the namespace).
		script := fmt.Sprintf(`for f in /proc/1/fd/*; do
  [ -d "$f" ] || continue
  ls "$f/" >/dev/null 2>&1 && echo "listed $f"
  [ -e "$f/%s%s" ] && echo "ESCAPED $f"
  [ -d "$f/../%s" ] && echo "CLIMBED $f"
done; true`, strings.Repeat("../", 16), strings.TrimPrefix(opts.StateDir, "/"), v2InitLeaf)
		out, err := exec.Command("nsenter", "-t", strconv.Itoa(b.sessionInitPID(sess.ID)), "-U", "-m", "--", "/bin/sh", "-c", script).CombinedOutput()
		if err != nil || strings.Contains(string(out), "ESCAPED") || strings.Contains(string(out), "CLIMBED") ||
			!strings.Contains(string(out), fmt.Sprintf("listed /proc/1/fd/%d", nsinit.FDCgroup)) {
			t.Errorf("the agent's directory fds as the sandbox's root: %v\n%s", err, out)
		}
		t.Logf("the agent's directory fds as the sandbox's root:\n%s", out)
	}
	// A cgroup the user's runtime made and left (its process died before writing a session):
	// the next New reaps it, as root's does (reconcile), and adopts the live sandbox.
	orphan, _ := newSessionID()
	ocg, err := b.cg.create(orphan, limits{CPUMillis: 100, MemoryBytes: 64 << 20, MaxProcesses: 8})
	if err != nil {
		t.Fatal(err)
	}
	b2, err := New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(b2.Reaped(), orphan) {
		t.Errorf("orphan cgroup %s not reaped: %v", orphan, b2.Reaped())
	}
	for _, dir := range ocg.dirs() {
		if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("orphan cgroup %s left: %v", dir, err)
		}
	}
	if err := b2.Close(); err != nil {
		t.Error(err)
	}
	// Egress beyond deny needs root: refused at create, naming the capability.
	d2 := hostDecl("rootless-net")
	d2.Egress = spec.Egress{Mode: spec.EgressAllow}
	if s2, err := b.Create(ctx, d2); err == nil {
		_ = b.Terminate(ctx, s2.ID)
		t.Error("egress allow was not refused")
	} else if !strings.Contains(err.Error(), "publicOnlyEgress") || !errors.Is(err, sandbox.ErrRefused) {
		t.Errorf("egress allow refused without ErrRefused naming the capability: %v", err)
	}
}

func ptrInt(n int64) *int64 { return &n }
