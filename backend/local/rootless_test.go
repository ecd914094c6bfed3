package local

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

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
// /etc/subuid and /etc/subgid, cgroups delegated in every v1 hierarchy), then runs
// TestRootlessChild as nobody; afterwards nothing of it is left. Without the subordinate ids
// New refuses, naming them.
func TestRootless(t *testing.T) {
	testutil.RequireRoot(t)
	for _, helper := range []string{"newuidmap", "newgidmap"} {
		if _, err := exec.LookPath(helper); err != nil {
			t.Fatalf("%s: %v (the uidmap package; .ci/run installs it)", helper, err)
		}
	}
	if cg, err := newCgroupDriver("airlock-test"); err == nil && cg.version() == 2 {
		// Not built for v2 (docs/rootless.md): refused up front, naming why.
		if _, err := probeRootless("airlock-test", 2); err == nil || !strings.Contains(err.Error(), "cgroup v2") {
			t.Fatalf("rootless on a cgroup v2 host: %v, want a refusal naming cgroup v2", err)
		}
		return
	}
	rnd := make([]byte, 4)
	_, _ = rand.Read(rnd)
	top := RootlessCgroupParent(rootlessUID) + "-test-" + hex.EncodeToString(rnd)
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
	child := func() (string, error) {
		cmd := exec.Command(self, "-test.run=^TestRootlessChild$", "-test.v", "-test.count=1")
		cmd.Dir = work
		cmd.Env = []string{
			rootlessEnv + "=1", "PATH=" + os.Getenv("PATH"), "HOME=" + work, "XDG_CACHE_HOME=" + cache,
			"AIRLOCK_ROOTLESS_STATE=" + state, "AIRLOCK_ROOTLESS_AGENT=" + agent,
			"AIRLOCK_ROOTLESS_CGROUP=" + top + "/sandboxes",
			"AIRLOCK_ROOTLESS_SUB=" + strconv.Itoa(rootlessSub),
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: rootlessUID, Gid: rootlessGID}}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	// Without subordinate ids: refused, naming them.
	t.Setenv("AIRLOCK_ROOTLESS_EXPECT", "no-subids")
	if out, err := child(); err == nil || !strings.Contains(out, "subordinate ids") {
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
	out, err := child()
	if err != nil || !strings.Contains(out, "--- PASS: TestRootlessChild") {
		t.Fatalf("rootless child: %v\n%s", err, out)
	}
	t.Log(out)
	// The child terminated its sandboxes: no cgroup below the delegated ones, no session.
	for _, ctrl := range v1Controllers {
		ents, err := os.ReadDir(filepath.Join(cgroupRoot, ctrl, top, "sandboxes"))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
		for _, e := range ents {
			if e.IsDir() {
				t.Errorf("cgroup %s left in %s", e.Name(), ctrl)
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
	if os.Getenv("AIRLOCK_ROOTLESS_EXPECT") == "no-subids" {
		if err == nil || !errors.Is(err, sandbox.ErrUnsupported) {
			t.Fatalf("New without subordinate ids: %v", err)
		}
		t.Fatalf("refused as expected: %v", err) // the parent looks for the reason
	}
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	d := hostDecl("rootless")
	d.Limits.MaxProcesses = ptrInt(12)
	sess, err := b.Create(ctx, d)
	if err != nil {
		t.Fatal(err)
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
		tasks, _ := os.ReadFile(filepath.Join(cgroupRoot, "pids", opts.CgroupParent, sess.ID, "code", "tasks"))
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
	// Egress beyond deny needs root: refused at create, naming the capability.
	d2 := hostDecl("rootless-net")
	d2.Egress = spec.Egress{Mode: spec.EgressAllow}
	if s2, err := b.Create(ctx, d2); err == nil {
		_ = b.Terminate(ctx, s2.ID)
		t.Error("egress allow was not refused")
	} else if !strings.Contains(err.Error(), "publicOnlyEgress") {
		t.Errorf("egress allow refused without naming the capability: %v", err)
	}
}

func ptrInt(n int64) *int64 { return &n }
