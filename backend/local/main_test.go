package local

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"go.uber.org/goleak"

	"github.com/airlock-sandbox/airlock/backend/local/idrange"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// agentBin is the agent binary TestMain builds, so that the tests run what ships.
var agentBin string

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(runHelper())
	}
	code := func() int {
		if os.Geteuid() == 0 {
			bin, cleanup, err := testutil.Agent()
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			defer cleanup()
			agentBin = bin
		}
		return goleakMain(m)
	}()
	os.Exit(code)
}

func goleakMain(m *testing.M) int {
	code := m.Run()
	if code != 0 {
		return code
	}
	if err := goleak.Find(); err != nil {
		fmt.Fprintln(os.Stderr, "goleak:", err)
		return 1
	}
	return 0
}

// testStateDir is a short state dir (unix socket paths are limited to 107 bytes).
func testStateDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "al")
	if err == nil {
		err = os.Chmod(dir, 0o711) // the sandbox's mapped root traverses it
	}
	if err != nil {
		t.Fatal(err)
	}
	// A state dir New makes itself, as a first start does: on its own tmpfs (ownTmpfs).
	t.Cleanup(func() {
		if err := RemoveStateDir(dir); err != nil {
			t.Errorf("remove the state dir: %v", err)
		}
	})
	return filepath.Join(dir, "s")
}

// newTestBackend returns a backend over a fresh state dir, with its own cgroup parent; the
// cleanup terminates whatever the test left and checks nothing remains.
func newTestBackend(t testing.TB) *Backend {
	t.Helper()
	testutil.RequireRoot(t)
	return newTestBackendAt(t, testStateDir(t))
}

func newTestBackendAt(t testing.TB, stateDir string) *Backend {
	t.Helper()
	b, err := New(context.Background(), Options{StateDir: stateDir, AgentPath: agentBin, ImageCacheDir: filepath.Join(stateDir, "images")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		list, _ := b.List(ctx)
		for _, s := range list {
			if err := b.Terminate(ctx, s.ID); err != nil {
				t.Errorf("cleanup: terminate %s: %v", s.ID, err)
			}
		}
		b.Close()
		// Every hierarchy, not only the runtime's: runsc makes the parent in all of them.
		others, _ := filepath.Glob(filepath.Join(cgroupRoot, "*", b.opts.CgroupParent))
		for _, d := range append(cgroupParentDirs(b), others...) {
			_ = os.Remove(d)
		}
	})
	return b
}

func hostDecl(id string) spec.Sandbox {
	d := spec.Sandbox{ID: id, Image: spec.Image{Host: true}}
	d.ApplyDefaults()
	return d
}

// run executes a shell command in the session and returns stdout, stderr and the result.
func run(t testing.TB, a sandbox.Agent, shell string) (string, string, sandbox.ExecResult) {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := a.Exec(ctx, sandbox.ExecRequest{Shell: shell, Timeout: 30 * time.Second}, &out, &errb)
	if err != nil {
		t.Fatalf("exec %q: %v", shell, err)
	}
	return out.String(), errb.String(), res
}

func TestSmoke(t *testing.T) {
	b := newTestBackend(t)
	ctx := context.Background()
	s, err := b.Create(ctx, hostDecl("smoke"))
	if err != nil {
		t.Fatal(err)
	}
	a, err := b.Connect(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	out, errs, res := run(t, a, "echo hello; id; python3 -c 'import json,ssl,sqlite3; print(2+2)'; node -e 'console.log(1+1)'; bash -c 'echo bash'; pwd; ls -la /")
	t.Logf("out:\n%s\nerr:\n%s\nres: %+v", out, errs, res)
	if !strings.Contains(out, "hello") {
		t.Fatal("no hello")
	}
	if err := b.Terminate(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
}

// helperEnv makes the test binary act as a separate process that creates sandboxes (see
// TestRestartAdopts).
const helperEnv = "AIRLOCK_LOCAL_TEST_HELPER"

// runHelper creates $AIRLOCK_HELPER_COUNT sandboxes in $AIRLOCK_HELPER_STATE, prints one JSON
// line per sandbox and "ready", then waits to be killed.
func runHelper() int {
	ctx := context.Background()
	b, err := New(ctx, Options{StateDir: os.Getenv("AIRLOCK_HELPER_STATE"), AgentPath: os.Getenv("AIRLOCK_HELPER_AGENT")})
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	n, _ := strconv.Atoi(os.Getenv("AIRLOCK_HELPER_COUNT"))
	for i := range n {
		s, err := b.Create(ctx, hostDecl(fmt.Sprintf("helper-%d", i)))
		if err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			return 1
		}
		fmt.Printf("{\"id\":%q,\"pid\":%d}\n", s.ID, b.sessionInitPID(s.ID))
	}
	fmt.Println("ready")
	time.Sleep(time.Hour)
	return 0
}

// sessionInitPID is the host pid of a session's init, 0 if this backend does not know it.
func (b *Backend) sessionInitPID(id string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s := b.sessions[id]; s != nil {
		initStarts.Store(id, s.rec.InitStart)
		return s.rec.InitPID
	}
	return 0
}

// initStarts holds, by session id, the start time of the init sessionInitPID returned: pids
// wrap (pid_max is 32768 here) and a test that checks many sandboxes at its end would take a
// later process with the same pid for the sandbox's init.
var initStarts sync.Map

// leftovers lists what remains of a session on the host: its state dir, cgroup directories,
// its init process, host mounts naming it.
func leftovers(b *Backend, id string, initPID int) []string {
	var left []string
	if _, err := os.Lstat(filepath.Join(b.opts.StateDir, id)); err == nil {
		left = append(left, "state dir")
	}
	// Every hierarchy, not only the ones this runtime uses: runsc makes cgroups in all.
	hier, _ := filepath.Glob(filepath.Join(cgroupRoot, "*"))
	for _, h := range hier {
		d := filepath.Join(h, b.opts.CgroupParent, id)
		if _, err := os.Stat(d); err == nil {
			left = append(left, "cgroup "+d)
		}
	}
	start, known := initStarts.Load(id)
	if initPID > 0 && (!known || alive(initPID, start.(uint64))) {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", initPID)); err == nil {
			if st, err := readStat(initPID); err == nil && st.State != 'Z' {
				left = append(left, fmt.Sprintf("init process %d (state %c)", initPID, st.State))
			}
		}
	}
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(mi), id) {
		left = append(left, "host mount")
	}
	return left
}

// stateLeftovers lists what a state dir holds besides what outlives every sandbox: the master
// secret, the lock, the host-image /etc copies (one per host, etc.go), the cached host probe
// (capabilities.go) and the directory every sandbox mounts its root on.
func stateLeftovers(dir string) []string {
	entries, _ := os.ReadDir(dir)
	var left []string
	for _, e := range entries {
		if n := e.Name(); n == idrange.Dir {
			// The claims dir stays; a claim left in it is a leftover (idrange).
			claims, _ := os.ReadDir(filepath.Join(dir, n))
			for _, c := range claims {
				left = append(left, filepath.Join(n, c.Name()))
			}
		} else if n != masterFile && n != lockFile && n != etcCacheDir && n != hostProbeFile && n != rootMountDir {
			left = append(left, n)
		}
	}
	return left
}

// assertGone waits (bounded) for a session to have left nothing behind.
func assertGone(t testing.TB, b *Backend, id string, initPID int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		left := leftovers(b, id, initPID)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("session %s left %v", id, left)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func landlockKernelABI() int {
	v, err := ll.LandlockGetABIVersion()
	if err != nil {
		return 0
	}
	return v
}

func (b *Backend) sessionRecord(id string) record {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s := b.sessions[id]; s != nil {
		return s.rec
	}
	return record{}
}

// cgroupParentDirs are b's parent cgroup's directories: one per hierarchy this runtime uses on
// v1, the one on v2.
func cgroupParentDirs(b *Backend) []string {
	if b.cg.version() == 2 {
		return []string{filepath.Join(cgroupRoot, b.opts.CgroupParent)}
	}
	var out []string
	for _, c := range v1Controllers {
		out = append(out, filepath.Join(cgroupRoot, c, b.opts.CgroupParent))
	}
	return out
}

// sessionCgroupDir is the session's cgroup directory holding ctrl's files (v1: that
// controller's hierarchy; v2: the one directory, whatever ctrl).
func sessionCgroupDir(b *Backend, id, ctrl string) string {
	if b.cg.version() == 2 {
		return filepath.Join(cgroupRoot, b.opts.CgroupParent, id)
	}
	return filepath.Join(cgroupRoot, ctrl, b.opts.CgroupParent, id)
}

// cgroupCPUNanos is the CPU time the session's cgroup has used.
func cgroupCPUNanos(t testing.TB, b *Backend, id string) int64 {
	t.Helper()
	if b.cg.version() == 2 {
		return cgroupKey(t, filepath.Join(sessionCgroupDir(b, id, ""), "cpu.stat"), "usage_usec") * 1000
	}
	return readInt64(t, filepath.Join(sessionCgroupDir(b, id, "cpuacct"), "cpuacct.usage"))
}

// cgroupMemoryBytes is the memory charged to the session's cgroup.
func cgroupMemoryBytes(t testing.TB, b *Backend, id string) int64 {
	t.Helper()
	if b.cg.version() == 2 {
		return readInt64(t, filepath.Join(sessionCgroupDir(b, id, ""), "memory.current"))
	}
	return readInt64(t, filepath.Join(sessionCgroupDir(b, id, "memory"), "memory.usage_in_bytes"))
}

// cgroupFrozen reports whether the kernel shows the session's cgroup frozen (v1 freezer.state
// FROZEN; v2 cgroup.events frozen 1).
func cgroupFrozen(t testing.TB, b *Backend, id string) bool {
	t.Helper()
	if b.cg.version() == 2 {
		return cgroupKey(t, filepath.Join(sessionCgroupDir(b, id, ""), "cgroup.events"), "frozen") == 1
	}
	raw, err := os.ReadFile(filepath.Join(sessionCgroupDir(b, id, "freezer"), "freezer.state"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(raw)) == "FROZEN"
}

// cgroupProcs lists the processes in the session's cgroup and every child, sorted.
func cgroupProcs(t testing.TB, b *Backend, id string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(sessionCgroupDir(b, id, "freezer"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		raw, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		out = append(out, strings.Fields(string(raw))...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

func readInt64(t testing.TB, p string) int64 {
	t.Helper()
	raw, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	return n
}

// cgroupKey reads "key value" from a flat-keyed cgroup file (cpu.stat, memory.events, ...).
func cgroupKey(t testing.TB, p, key string) int64 {
	t.Helper()
	raw, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if k, v, ok := strings.Cut(l, " "); ok && k == key {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("%s: %s %q: %v", p, key, v, err)
			}
			return n
		}
	}
	t.Fatalf("%s has no %s:\n%s", p, key, raw)
	return 0
}
