//go:build cluster

package kubernetes_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	kb "github.com/airlock-sandbox/airlock/backend/kubernetes"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

func i64p(v int64) *int64 { return &v }

// execOut runs shell in session id and returns its stdout.
func execOut(t *testing.T, a sandbox.Agent, req sandbox.ExecRequest) (string, string, sandbox.ExecResult) {
	t.Helper()
	var out, errb strings.Builder
	res, err := a.Exec(ctxT(t), req, &out, &errb)
	if err != nil {
		t.Fatalf("exec %v %q: %v", req.Argv, req.Shell, err)
	}
	return out.String(), errb.String(), res
}

// forkCount forks children (each sleeps) until fork fails, then prints how many it made and the
// errno, and reaps them.
const forkCount = `
import errno, os, time
pids, err = [], None
for _ in range(400):
    try:
        pid = os.fork()
    except OSError as e:
        err = e.errno
        break
    if pid == 0:
        time.sleep(120)
        os._exit(0)
    pids.append(pid)
print(len(pids), errno.errorcode.get(err, "none"))
for p in pids:
    os.kill(p, 9)
    os.waitpid(p, 0)
`

// TestForkBombIsHeld: limits.maxProcesses N holds the sandbox's code to N tasks (the agent's
// RLIMIT_NPROC, see docs/kubernetes.md): fork fails with EAGAIN, a real fork bomb spins against
// the limit until its deadline, and the pod survives and still runs commands afterwards.
func TestForkBombIsHeld(t *testing.T) {
	const n = 12
	e := newEnv(t)
	d := baseDecl("bomb")
	d.Limits.MaxProcesses = i64p(n)
	e.sandboxCR(d, 1, 1)
	b := e.backend("app")
	s, err := b.Create(ctxT(t), withDefaults(d))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Terminate(ctxT(t), s.ID) })
	a, err := b.Connect(ctxT(t), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()

	out, stderr, res := execOut(t, a, sandbox.ExecRequest{Argv: []string{"python3", "-c", forkCount}, Timeout: time.Minute})
	if res.ExitCode != 0 {
		t.Fatalf("fork counter: %+v %s", res, stderr)
	}
	var forked int
	var errname string
	fmt.Sscan(out, &forked, &errname)
	// The agent sets RLIMIT_NPROC to N-1: a fork may not take the uid past N-1 tasks, so the
	// interpreter (one task) forks N-2 children; only the agent's own start of a command may
	// make the Nth task.
	if errname != "EAGAIN" || forked != n-2 {
		t.Fatalf("fork counter under maxProcesses %d: forked %d, then %s; want %d, then EAGAIN", n, forked, errname, n-2)
	}
	t.Logf("maxProcesses %d: python forked %d children, then %s", n, forked, errname)

	// A classic shell fork bomb, started by a python that then only sleeps (a shell that cannot
	// fork exits), stopped by the deadline (the agent kills the process group).
	bomb := `import subprocess, time; subprocess.Popen(["sh", "-c", "b(){ b | b & }; b"]); time.sleep(100)`
	res, err = a.Exec(ctxT(t), sandbox.ExecRequest{Argv: []string{"python3", "-c", bomb}, Timeout: 4 * time.Second}, &strings.Builder{}, &strings.Builder{})
	if err != nil || !res.TimedOut {
		t.Fatalf("fork bomb: %v %+v, want it held until its deadline", err, res)
	}
	// The pod survives and answers; nothing of the bomb is left counting against the limit.
	for i := range 40 {
		out, _, res = execOut(t, a, sandbox.ExecRequest{Argv: []string{"python3", "-c", forkCount}, Timeout: time.Minute})
		fmt.Sscan(out, &forked, &errname)
		if res.ExitCode == 0 && forked == n-2 || i == 39 {
			break
		}
		time.Sleep(500 * time.Millisecond) // the killed bomb's processes are still being reaped
	}
	if res.ExitCode != 0 || forked != n-2 {
		t.Fatalf("after the bomb: %+v forked %d, want the whole %d back", res, forked, n-2)
	}
	out, _, _ = execOut(t, a, sandbox.ExecRequest{Shell: "echo alive", Timeout: 10 * time.Second})
	if out != "alive\n" {
		t.Fatalf("after the fork bomb the sandbox answers %q", out)
	}
	if _, err := a.Health(ctxT(t)); err != nil {
		t.Fatalf("health after the fork bomb: %v", err)
	}
}

// TestCodeUIDsAreDistinct: every pod runs code as its own uid (the process limit is counted per
// uid per node), recorded on the pod, and that is the uid code sees.
func TestCodeUIDsAreDistinct(t *testing.T) {
	e := newEnv(t)
	d := baseDecl("uids")
	e.sandboxCR(d, 2, 2)
	b := e.backend("app")
	seen := map[string]string{}
	for range 2 {
		s, err := b.Create(ctxT(t), withDefaults(d))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Terminate(ctxT(t), s.ID) })
		label := kubectl(t, "", "-n", e.ns, "get", "pods", "-l", "airlock.dev/session="+s.ID, "-o", `jsonpath={.items[0].metadata.labels.airlock\.dev/code-uid}`)
		if uid, err := strconv.Atoi(label); err != nil || uid <= 0 {
			t.Fatalf("session %s pod code-uid label %q", s.ID, label)
		}
		a, err := b.Connect(ctxT(t), s.ID)
		if err != nil {
			t.Fatal(err)
		}
		out, _, _ := execOut(t, a, sandbox.ExecRequest{Argv: []string{"python3", "-c", "import os; print(os.getuid(), os.getgid())"}, Timeout: 30 * time.Second})
		a.Close()
		if out != label+" "+label+"\n" {
			t.Errorf("code in session %s runs as %q, want uid and gid %s (the pod's label)", s.ID, out, label)
		}
		if other, dup := seen[label]; dup {
			t.Fatalf("sessions %s and %s share code uid %s", other, s.ID, label)
		}
		seen[label] = s.ID
	}
}

// TestIdleSessionEnds: a pool pod waits unclaimed longer than the idle timeout and is still
// there (the clock starts at the claim); a claimed session left idle past its timeout ends: the
// pod goes, reconnect says not found, the agent no longer answers.
func TestIdleSessionEnds(t *testing.T) {
	const idle = 4
	e := newEnv(t)
	d := baseDecl("idle")
	d.Session = spec.Session{MaxLifetimeSeconds: i64p(600), IdleTimeoutSeconds: i64p(idle)}
	e.sandboxCR(d, 1, 1)
	podName := kubectl(t, "", "-n", e.ns, "get", "pods", "-l", "airlock.dev/sandbox=idle", "-o", "name")
	time.Sleep(3 * idle * time.Second) // unclaimed, three idle timeouts
	if now := kubectl(t, "", "-n", e.ns, "get", "pods", "-l", "airlock.dev/sandbox=idle,airlock.dev/state=idle",
		"--field-selector=status.phase=Running", "-o", "name"); now != podName {
		t.Fatalf("the pool pod did not wait: before %q, after %q (an unclaimed agent must not idle out)", podName, now)
	}
	b := e.backend("app")
	s, err := b.Create(ctxT(t), withDefaults(d))
	if err != nil {
		t.Fatal(err)
	}
	a, err := b.Connect(ctxT(t), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if out, _, _ := execOut(t, a, sandbox.ExecRequest{Shell: "echo claimed", Timeout: 10 * time.Second}); out != "claimed\n" {
		t.Fatalf("exec after the claim: %q", out)
	}
	// Left idle: within a bounded wait the session must be gone.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		_, err := b.Get(ctxT(t), s.ID)
		if errors.Is(err, sandbox.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("session idle for 2 min (timeout %ds) still reconnects: %v\n%s", idle, err,
				kubectl(t, "", "-n", e.ns, "get", "pods", "-o", "wide"))
		}
		time.Sleep(500 * time.Millisecond)
	}
	if _, err := b.Connect(ctxT(t), s.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("connect to an idled-out session: %v, want not found", err)
	}
	if _, err := a.Health(ctxT(t)); err == nil {
		t.Error("the idled-out session's agent still answers")
	}
	for time.Now().Before(deadline) && podsOfSession(t, e.ns, s.ID) != "" {
		time.Sleep(500 * time.Millisecond)
	}
	if left := podsOfSession(t, e.ns, s.ID); left != "" {
		t.Errorf("the idled-out session's pod is not deleted: %s", left)
	}
	list, err := b.List(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, got := range list {
		if got.ID == s.ID {
			t.Errorf("the idled-out session is still listed")
		}
	}
}

// TestBrokerServesOnlyTLS: callers' ServiceAccount tokens never cross the pod network in clear,
// and a broker certificate from another CA is not trusted.
func TestBrokerServesOnlyTLS(t *testing.T) {
	e := newEnv(t)
	tok := e.token("app", "airlock-broker")
	token := func(context.Context) (string, error) { return tok, nil }
	plain, err := kb.New(kb.Config{BrokerURL: strings.Replace(e.broker, "https://", "http://", 1), Namespace: e.ns, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := plain.List(ctxT(t)); err == nil {
		t.Error("the broker answered a plain HTTP request")
	}
	untrusted, err := kb.New(kb.Config{BrokerURL: e.broker, Namespace: e.ns, ServerName: brokerName, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	defer untrusted.Close()
	if _, err := untrusted.List(ctxT(t)); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("broker verified without its CA: %v, want a certificate error", err)
	}
	if _, err := e.backend("app").List(ctxT(t)); err != nil {
		t.Errorf("List with the broker's CA: %v", err)
	}
}
