package agent

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// TestIdleGate: with IdleFromFirstCall the idle clock does not run before the first
// authenticated call (a pool pod may wait unclaimed far longer than the timeout), and runs from
// that call on; without it, it runs from the start.
func TestIdleGate(t *testing.T) {
	for _, gated := range []bool{true, false} {
		t.Run(fmt.Sprint("gated=", gated), func(t *testing.T) {
			clock := time.Unix(1000, 0)
			a := newActivity(8 * time.Second) // looks every second
			a.now = func() time.Time { return clock }
			a.last, a.seen = clock, clock
			g := newIdleGate(a, gated)
			step := func(n int) { // advance in watcher-sized steps, so no gap reads as frozen time
				for range n {
					clock = clock.Add(time.Second)
					a.remaining()
				}
			}
			step(20) // waiting in the pool for longer than the timeout
			if got := a.remaining(); gated && got != 8*time.Second {
				t.Fatalf("gated, before the first call: remaining %v, want the whole 8s", got)
			} else if !gated && got > 0 {
				t.Fatalf("ungated: remaining %v after 20s, want <= 0", got)
			}
			end := a.begin() // the first authenticated call (authed: begin, then open)
			g.open()
			step(2)
			end()
			g.open() // a second call opens nothing more
			step(3)
			if got := a.remaining(); got != 5*time.Second {
				t.Fatalf("3s after the first call ended: remaining %v, want 5s", got)
			}
			step(5)
			if got := a.remaining(); got > 0 {
				t.Fatalf("8s after the first call: remaining %v, want <= 0", got)
			}
		})
	}
}

func TestApplyProcessLimitRefuses(t *testing.T) {
	if err := applyProcessLimit(-1); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("maxProcesses -1: %v, want EINVAL", err)
	}
	if err := applyProcessLimit(0); err != nil {
		t.Fatalf("maxProcesses 0 (none): %v", err)
	}
}

// TestProcessLimitHoldsCode: an agent process (uid 0) that set maxProcesses 3 still forks freely
// itself, while commands it starts as a code uid get at most 3 processes: the 4th start fails
// with EAGAIN. Run in a child process so the limit does not reach the other tests.
func TestProcessLimitHoldsCode(t *testing.T) {
	testutil.RequireRoot(t)
	if os.Getenv("AIRLOCK_TEST_NPROC_CHILD") == "1" {
		nprocChild()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestProcessLimitHoldsCode$", "-test.v")
	cmd.Env = append(os.Environ(), "AIRLOCK_TEST_NPROC_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	t.Logf("child:\n%s", out)
}

func nprocChild() {
	fail := func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, format+"\n", a...)
		os.Exit(1)
	}
	const limit = 3
	if err := applyProcessLimit(limit); err != nil {
		fail("applyProcessLimit: %v", err)
	}
	// A uid nothing else on this host uses: the kernel counts per uid, host-wide.
	uid := uint32(3_000_000 + os.Getpid()%100_000)
	var started []*exec.Cmd
	defer func() {
		for _, c := range started {
			c.Process.Kill()
			c.Wait()
		}
	}()
	for i := range limit + 1 {
		c := exec.Command("/bin/sleep", "60")
		c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		err := c.Start()
		if i < limit {
			if err != nil {
				fail("code process %d of %d: %v", i+1, limit, err)
			}
			started = append(started, c)
			continue
		}
		if err == nil {
			started = append(started, c)
			fail("code process %d started past maxProcesses %d", i+1, limit)
		}
		if !errors.Is(err, syscall.EAGAIN) {
			fail("code process %d: %v, want EAGAIN", i+1, err)
		}
	}
	for _, c := range started {
		c.Process.Kill()
		c.Wait()
	}
	started = nil
	// Code forking by itself: a shell as the code uid backgrounding more sleeps than allowed
	// fails to fork (dash exits on it), and the uid never holds more than the limit.
	sh := exec.Command("/bin/sh", "-c", "for i in 1 2 3 4 5 6 7 8; do /bin/sleep 60 >/dev/null 2>&1 & done; exit 0")
	sh.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}, Setpgid: true}
	out, err := sh.CombinedOutput()
	n := tasksOf(uid)
	syscall.Kill(-sh.Process.Pid, syscall.SIGKILL)
	if err == nil {
		fail("a shell forking 8 sleeps under maxProcesses %d exited 0: %s", limit, out)
	}
	if n > limit || n == 0 {
		fail("after the shell: uid %d holds %d tasks, want 1..%d (%v: %s)", uid, n, limit, err, out)
	}
	// The agent's own uid (0) is exempt: it still starts processes.
	for i := range limit + 2 {
		if out, err := exec.Command("/bin/true").CombinedOutput(); err != nil {
			fail("root process %d under the limit: %v %s", i, err, out)
		}
	}
	fmt.Println("held at " + strconv.Itoa(limit))
}

// tasksOf counts the tasks (threads included, as the kernel does) whose real uid is uid.
func tasksOf(uid uint32) int {
	n := 0
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		if _, err := strconv.Atoi(d.Name()); err != nil {
			continue
		}
		tasks, _ := os.ReadDir("/proc/" + d.Name() + "/task")
		var st syscall.Stat_t
		if syscall.Stat("/proc/"+d.Name(), &st) == nil && st.Uid == uid {
			n += len(tasks)
		}
	}
	return n
}
