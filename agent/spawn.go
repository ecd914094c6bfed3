//go:build linux

package agent

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/kernfile"
)

// codeOOMScoreAdj is every command's oom_score_adj: the most killable (spawn).
const codeOOMScoreAdj = "1000"

// spawnRequest is one fork/exec, executed on the spawner's locked thread.
type spawnRequest struct {
	argv0 string
	argv  []string
	env   []string
	dir   string
	files []*os.File // the child's fds 0, 1, 2
	tty   bool       // files[0] is a pty slave that becomes the controlling terminal
	group *execGroup
	// reaper: this is a reaper for a later command (files[3] its control socket), started as
	// the agent's user.
	reaper bool
	reply  chan spawnReply
}

type spawnReply struct {
	pid    int
	pidfd  int // -1 when the kernel gave none
	exited <-chan syscall.WaitStatus
	err    error
}

// spawner forks every command from one OS thread and owns every wait of the process.
//
// One thread, because the runtime's per-thread filters (seccomp, landlock, no_new_privs) are
// installed there by Hooks.PrepareSpawnThread and inherited by each child, while the agent's
// other threads stay unfiltered; and because a v1 cgroup is entered per thread, so writing the
// spawner's TID into an exec cgroup before fork makes the child start inside it (no window in
// which it could fork outside).
//
// All waits, because os/exec's Wait and a PID-1 zombie reaper would otherwise race for the same
// statuses: the reaper below is the only caller of wait4, and mu spans fork+register so a child
// that exits at once is still dispatched to its waiter.
type spawner struct {
	cred   *syscall.Credential
	homeV1 string // tasks file of the v1 freezer cgroup the spawner thread lives in, or ""
	homeFD int    // homeV1 kept open by the spawner thread (-1: not open), to go back with one write
	// oomFD is /proc/self/oom_score_adj kept open by the spawner thread (-1: none), and
	// oomBase the agent's own score, which it returns to after each fork (spawn).
	oomFD   int
	oomBase []byte
	reapAll bool // PID 1: reap every child, dispatch the tracked ones

	// The next exec's reaper, started ahead (subreaper scope: reapscope.go).
	nextMu   sync.Mutex
	next     *nextReaper
	filling  bool
	filled   *sync.Cond // on nextMu: a fill has ended
	dropping bool
	fills    sync.WaitGroup

	reqs     chan *spawnRequest
	stop     chan struct{}
	done     sync.WaitGroup
	readyc   chan error // the thread's start, until ready has read it
	readyErr error      // what ready read

	mu      sync.Mutex
	waiters map[int]chan syscall.WaitStatus
	broken  error // the spawner thread could not leave an exec cgroup; no further spawns
	sigs    chan os.Signal
}

func newSpawner(cfg *Config) *spawner {
	s := &spawner{
		homeFD:  -1,
		oomFD:   -1,
		reqs:    make(chan *spawnRequest),
		stop:    make(chan struct{}),
		waiters: map[int]chan syscall.WaitStatus{},
		sigs:    make(chan os.Signal, 1),
		reapAll: os.Getpid() == 1,
	}
	s.filled = sync.NewCond(&s.nextMu)
	// "Do not change" when that is what is asked: root code under AllowRootCode, or (tests
	// run unprivileged) the agent's own ids, which a non-root agent could not set again anyway.
	same := cfg.CodeUID == uint32(os.Geteuid()) && cfg.CodeGID == uint32(os.Getegid())
	rootCode := cfg.CodeUID == 0 && cfg.CodeGID == 0
	if !(cfg.AllowRootCode && (rootCode || same)) {
		s.cred = &syscall.Credential{Uid: cfg.CodeUID, Gid: cfg.CodeGID, Groups: []uint32{}}
	}
	if cfg.CgroupV1Freezer != "" {
		s.homeV1 = cfg.CgroupV1Freezer + "/tasks"
	}
	return s
}

// begin starts the spawner thread and the reaper without waiting for the thread to be ready.
// Follow it with ready, or abandon.
func (s *spawner) begin(prepare func() error) {
	signal.Notify(s.sigs, syscall.SIGCHLD)
	s.readyc = make(chan error, 1)
	s.done.Add(2)
	goSpawner(func() { s.loop(prepare, s.readyc, nil) })
	go s.reap()
}

// ready waits for the thread begun by begin; on its error everything begin started is stopped.
// Later calls return the same answer.
func (s *spawner) ready() error {
	if s.readyc == nil {
		return s.readyErr
	}
	err := <-s.readyc
	s.readyc = nil
	if err != nil {
		close(s.stop)
		s.done.Wait()
		signal.Stop(s.sigs)
		s.readyErr = err
	}
	return err
}

// abandon stops a spawner begun but not to be used (the agent failed to start).
func (s *spawner) abandon() {
	if s.ready() == nil {
		s.close()
	}
}

// close stops the spawner thread and the reaper. Call it only after every tracked child has
// been waited for.
func (s *spawner) close() {
	close(s.stop)
	s.done.Wait()
	signal.Stop(s.sigs)
}

// goSpawner starts the spawner loop; a test replaces it to start the loop on the main thread.
var goSpawner = func(loop func()) { go loop() }

// loop is the spawner thread.
//
// The filters PrepareSpawnThread installs stay on this one thread because the Go runtime never
// clones a thread from a locked one: newm (runtime/proc.go, Go 1.26) checks
// `gp.m.lockedExt != 0` and, "We're on a locked M ... We don't want to clone that into another
// thread. Instead, ask a known-good thread to create the thread for us", hands the creation to
// the template thread, which LockOSThread starts (startTemplateThread) before the first lock
// takes effect, i.e. before any filter exists. A thread cloned from this one would inherit its
// seccomp filter, landlock domain and no_new_privs.
func (s *spawner) loop(prepare func() error, ready chan<- error, locked chan<- struct{}) {
	// Never unlocked once the thread is changed: when this goroutine returns the thread exits
	// with it, taking its filters along instead of handing a filtered thread back.
	runtime.LockOSThread()
	if locked != nil {
		close(locked)
	}
	if unix.Gettid() == unix.Getpid() {
		// The main thread (tid == pid) is what /proc/<pid>/status describes, and the runtime
		// never lets it exit (it wedges it instead), so it must stay unfiltered. While this
		// goroutine holds it locked no other goroutine can run on it: the one started here
		// lands on another thread (created by the template thread, see above). Once that one
		// holds its own thread, the main thread is released unchanged.
		next := make(chan struct{})
		go s.loop(prepare, ready, next)
		<-next
		runtime.UnlockOSThread()
		return
	}
	defer s.done.Done()
	// The local runtime starts the agent inside that cgroup already; a move is a cgroup
	// migration (0.1-0.3 ms), a look at the short tasks list much less.
	if s.homeV1 != "" && !threadIn(s.homeV1) {
		if err := writeTID(s.homeV1); err != nil {
			ready <- fmt.Errorf("agent: move spawner thread into %s: %w", s.homeV1, err)
			return
		}
	}
	if s.homeV1 != "" {
		// Open before prepare: its landlock domain may not allow the cgroup file system.
		fd, err := kernfile.Open(s.homeV1, unix.O_WRONLY)
		if err != nil {
			ready <- fmt.Errorf("agent: open %s: %w", s.homeV1, err)
			return
		}
		s.homeFD = fd
		defer func() {
			unix.Close(s.homeFD)
			s.homeFD = -1
		}()
	}
	// Open before prepare, as homeV1: its landlock domain may not allow /proc.
	s.openOOMScore()
	defer func() {
		if s.oomFD >= 0 {
			unix.Close(s.oomFD)
			s.oomFD = -1
		}
	}()
	if prepare != nil {
		if err := prepare(); err != nil {
			ready <- fmt.Errorf("agent: prepare spawn thread: %w", err)
			return
		}
	}
	ready <- nil
	for {
		select {
		case req := <-s.reqs:
			rep := s.spawn(req)
			req.reply <- rep
			// Back home only once the requester has its pid: the move overlaps the
			// command's start and the response instead of delaying both. The group's kill
			// waits for it (leave), and the next spawn comes after it on this thread.
			if g := req.group; g != nil && g.kind == scopeV1 && g.left != nil {
				s.leave(g)
			}
		case <-s.stop:
			return
		}
	}
}

// leave moves the spawner thread out of g's cgroup into its home and tells g it is out. Were it
// to stay, freezing g would freeze the spawner and g could never be removed: a failure refuses
// every further spawn rather than run half-confined.
func (s *spawner) leave(g *execGroup) {
	defer close(g.left)
	if err := enterCgroup(s.homeFD, s.homeV1); err != nil {
		s.broken = fmt.Errorf("agent: spawner thread could not leave exec cgroup %s: %w", g.dir, err)
	}
}

// spawn forks one command; it runs on the locked thread.
func (s *spawner) spawn(req *spawnRequest) spawnReply {
	if s.broken != nil {
		return spawnReply{err: s.broken}
	}
	fds := make([]uintptr, len(req.files))
	for i, f := range req.files {
		fds[i] = f.Fd()
	}
	pidfd := -1
	sys := &syscall.SysProcAttr{
		Setsid:     true,
		Setctty:    req.tty,
		Ctty:       0,
		Credential: s.cred,
		// A belt only: the kill that counts is the cgroup's.
		Pdeathsig: syscall.SIGKILL,
		PidFD:     &pidfd,
	}
	g := req.group
	if req.reaper {
		// A reaper (startReaper): in a session of its own, as the agent's user; it starts the
		// command as this would have, and outlives the agent only to kill what it started.
		sys.Credential, sys.Pdeathsig = nil, 0
	}
	if g != nil && g.kind == scopeV2 {
		sys.UseCgroupFD = true
		sys.CgroupFD = g.fd
		// Born in its exec cgroup, with a cgroup namespace rooted there: the command sees its
		// own cgroup as "/" (others' only relative to it), not the host's path to it.
		sys.Cloneflags |= syscall.CLONE_NEWCGROUP
	}
	if g != nil && g.kind == scopeV1 {
		if err := enterCgroup(g.tasks, g.dir+"/tasks"); err != nil {
			// A failed write leaves the thread where it was (home): nothing to leave.
			return spawnReply{err: fmt.Errorf("enter exec cgroup %s: %w", g.dir, err)}
		}
		g.left = make(chan struct{})
	}
	s.mu.Lock()
	// The command is born the most killable (codeOOMScoreAdj), for the fork's span the agent
	// with it: a score is the process's, not the thread's, and the kernel has no other way
	// to give a child a score before it runs. Not for a reaper: it raises its own score
	// before it forks (reaperMain), and refills run beside other execs, so the agent would
	// otherwise spend every refill at the code's score.
	raise := s.oomFD >= 0 && !req.reaper
	if raise {
		if _, err := unix.Pwrite(s.oomFD, []byte(codeOOMScoreAdj), 0); err != nil {
			s.closeOOMScore()
		}
	}
	pid, err := syscall.ForkExec(req.argv0, req.argv, &syscall.ProcAttr{Dir: req.dir, Env: req.env, Files: fds, Sys: sys})
	if raise && s.oomFD >= 0 {
		if _, err := unix.Pwrite(s.oomFD, s.oomBase, 0); err != nil {
			s.closeOOMScore()
		}
	}
	var ch chan syscall.WaitStatus
	if err == nil {
		ch = make(chan syscall.WaitStatus, 1)
		s.waiters[pid] = ch
	}
	s.mu.Unlock()
	runtime.KeepAlive(req.files)
	if err != nil {
		return spawnReply{err: err}
	}
	return spawnReply{pid: pid, pidfd: pidfd, exited: ch}
}

// openOOMScore opens the agent's oom_score_adj for spawn, if it can go up to the code's score
// and back down to the agent's own without privilege (lowering below what was set by a
// privileged writer needs CAP_SYS_RESOURCE); else commands keep the agent's score.
func (s *spawner) openOOMScore() {
	base, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return
	}
	fd, err := unix.Open("/proc/self/oom_score_adj", unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	base = bytes.TrimSpace(base)
	if _, err := unix.Pwrite(fd, []byte(codeOOMScoreAdj), 0); err != nil {
		unix.Close(fd)
		return
	}
	if _, err := unix.Pwrite(fd, base, 0); err != nil {
		unix.Close(fd) // the agent stays at codeOOMScoreAdj: nothing better to do
		return
	}
	s.oomFD, s.oomBase = fd, base
}

func (s *spawner) closeOOMScore() {
	unix.Close(s.oomFD)
	s.oomFD = -1
}

// run starts req's command: forked by the spawner thread, or in the subreaper scope handed to
// a reaper (runReaper).
func (s *spawner) run(req *spawnRequest) spawnReply {
	// A command gets exactly the descriptors the request places at 0..2 (ForkExec clears
	// close-on-exec only on those): whatever else is open in this process, inherited by it or
	// opened without O_CLOEXEC by an embedding program, is marked first. Not on the spawner
	// thread: its seccomp filter is the runtime's business, this call must not depend on it.
	if err := CloseOnExecFrom(3); err != nil {
		return spawnReply{err: fmt.Errorf("%w: %v", errFDs, err)}
	}
	if g := req.group; g != nil && g.kind == scopeReaper {
		return s.runReaper(req)
	}
	return s.fork(req)
}

// fork hands req to the spawner thread.
func (s *spawner) fork(req *spawnRequest) spawnReply {
	req.reply = make(chan spawnReply, 1)
	select {
	case s.reqs <- req:
	case <-s.stop:
		return spawnReply{err: errors.New("agent is shutting down")}
	}
	return <-req.reply
}

// errFDs: the agent could not make sure a command inherits nothing but its stdio.
var errFDs = errors.New("cannot confine the command's file descriptors")

// reap is the only caller of wait4 in the process.
func (s *spawner) reap() {
	defer s.done.Done()
	for {
		select {
		case <-s.sigs:
		case <-s.stop:
			return
		}
		s.mu.Lock()
		if s.reapAll {
			s.reapAny()
		} else {
			s.reapTracked()
		}
		s.mu.Unlock()
	}
}

// reapAny collects every exited child (PID 1 inherits orphans) and dispatches tracked ones.
func (s *spawner) reapAny() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		s.dispatch(pid, ws)
	}
}

// reapTracked waits only for our own children, leaving any others to whoever started them.
func (s *spawner) reapTracked() {
	for pid := range s.waiters {
		var ws syscall.WaitStatus
		var got int
		var err error
		for {
			got, err = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
			if err != syscall.EINTR {
				break
			}
		}
		if got == pid {
			s.dispatch(pid, ws)
		} else if err == syscall.ECHILD {
			// Someone else reaped it: report it as killed rather than leave the waiter hanging.
			s.dispatch(pid, syscall.WaitStatus(syscall.SIGKILL))
		}
	}
}

// watchExit waits in the runtime's poller for pidf (pid's pidfd) to become readable, which it
// does once the process has exited, and then collects the exit status. The exit reaches its
// waiter by a wakeup of the poller instead of the SIGCHLD relay (signal handler, the signal
// goroutine, then reap), which on a busy machine is most of the time from a command's exit to
// the agent noticing it. SIGCHLD still reaps whatever this does not (no pidfd, orphans of PID
// 1); both take mu, so a status is dispatched exactly once. It returns when pidf is closed.
func (s *spawner) watchExit(pid int, pidf *os.File) {
	rc, err := pidf.SyscallConn()
	if err != nil {
		return
	}
	if rc.Read(func(fd uintptr) bool { return pidfdReadable(int(fd)) }) != nil {
		return
	}
	s.collect(pid)
}

// pidfdReadable reports whether a pidfd says its process has exited.
func pidfdReadable(fd int) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(p, 0)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n > 0 && p[0].Revents&unix.POLLIN != 0
	}
}

// collect dispatches pid's exit status if it is still awaited and the process has exited.
func (s *spawner) collect(pid int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.waiters[pid]; !ok {
		return // the reaper was first
	}
	var ws syscall.WaitStatus
	for {
		got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if got == pid {
			s.dispatch(pid, ws)
		}
		// Not yet (or no longer) waitable: the reaper settles it.
		return
	}
}

func (s *spawner) dispatch(pid int, ws syscall.WaitStatus) {
	if ch, ok := s.waiters[pid]; ok {
		ch <- ws
		delete(s.waiters, pid)
	}
}

// threadIn reports whether the calling thread is listed in a cgroup v1 tasks file (false when
// it cannot tell: then the caller moves it, which is always right).
func threadIn(tasks string) bool {
	b, err := kernfile.Read(tasks)
	if err != nil {
		return false
	}
	return listsID(b, unix.Gettid())
}

// listsID reports whether id is one of the newline-separated decimal ids in b.
func listsID(b []byte, id int) bool {
	want := strconv.Itoa(id)
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		if string(line) == want {
			return true
		}
	}
	return false
}

// writeTID moves the calling thread into a cgroup v1 tasks file. "0" names the calling thread:
// the kernel then moves it without taking cgroup_threadgroup_rwsem for writing, which naming
// a tid does (cgroup_procs_write_start: `*threadgroup_locked = pid || threadgroup`) and which
// waits for an RCU grace period. Measured in a sandbox: exec of true 22 ms -> 3 ms.
func writeTID(tasks string) error {
	return kernfile.Write(tasks, "0")
}

// enterCgroup is writeTID through fd, the tasks file (named tasks) kept open: a cgroup file
// open costs more than the write (measured in a live exec of true: the two moves of each exec
// were two opens and two closes more), and a kept descriptor still names its cgroup after a
// rename. Every v1 exec cgroup has its tasks open (cgroups.create), and the spawner its home's.
func enterCgroup(fd int, tasks string) error {
	return kernfile.WriteFD(fd, tasks, "0")
}
