//go:build linux

package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The subreaper scope is the kill scope where the agent has no cgroup it can write (gVisor
// under Cloud Run's launcher, a MicroVM guest, a pod): each command is started through a
// reaper, this binary re-executed with argv[0] reaperArg0, that marks itself a child subreaper
// (PR_SET_CHILD_SUBREAPER) and runs the command as its child, an ordinary process in a session
// of its own. Every process the command leaves behind, setsid'd or double-forked, is then the
// reaper's descendant: an orphan reparents to the reaper, not to init. When the command exits,
// or the agent asks (deadline, cancel, removal), or the agent goes away, the reaper kills every
// descendant it can find in /proc, reaps them, and only then reports the command's wait status
// and exits: the agent's wait for the reaper is the confirmation that nothing is left.
//
// A reaper is started ahead of its command (the agent keeps one ready, see nextReaper), so that
// an exec does not wait for a process start of this binary: it gets the command over its
// control socket. It runs as the agent's user, not the code's: code that runs as another user
// cannot signal or trace it. It keeps none of the command's stdio.
//
// The control socket (fd reaperCtlFD in the reaper) carries, agent to reaper, first the command:
// a 4-byte big-endian length with the command's stdin, stdout and stderr attached (SCM_RIGHTS),
// then that many bytes of reaperSpec as JSON; after it, lines: "s SIGNAL" send the command
// SIGNAL; "k" kill the command and everything it started; end of file: the same as "k" (before
// a command: exit). Reaper to agent, lines: "p PID" the command runs; "e ERRNO" it could not be
// started (then exit); "x STATUS SWEPT" its raw wait status, and 1 if every descendant is gone.
const (
	reaperArg0  = "airlock-exec-reaper"
	reaperCtlFD = 3
	maxSpec     = 64 << 20 // far above what ARG_MAX lets a command have
)

func init() {
	// Before anything else of the binary runs: a reaper is the agent's helper, not the agent.
	if len(os.Args) > 0 && os.Args[0] == reaperArg0 {
		// unix.Exit, not os.Exit: no exit hooks (a race-enabled build would sleep in them).
		unix.Exit(reaperMain())
	}
}

// reaperSpec is the command a reaper starts, as the spawner would have started it.
type reaperSpec struct {
	Path string   `json:"path"`
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`
	TTY  bool     `json:"tty,omitempty"` // fd 0 becomes the controlling terminal
	// UID and GID are the code's; absent, the command keeps the reaper's.
	UID *uint32 `json:"uid,omitempty"`
	GID uint32  `json:"gid,omitempty"`
}

// reaperDropped are the signals a reaper catches and drops: every one whose default would end
// or stop it (SIGCHLD, SIGURG, SIGWINCH are ignored by default; SIGPIPE is the runtime's).
var reaperDropped = []os.Signal{unix.SIGHUP, unix.SIGINT, unix.SIGQUIT, unix.SIGTERM, unix.SIGUSR1,
	unix.SIGUSR2, unix.SIGALRM, unix.SIGVTALRM, unix.SIGPROF, unix.SIGXCPU, unix.SIGXFSZ, unix.SIGIO,
	unix.SIGPWR, unix.SIGSTKFLT, unix.SIGTSTP, unix.SIGTTIN, unix.SIGTTOU}

// reaper is the state of one reaper process.
type reaper struct {
	ctl  *os.File
	self int

	mu     sync.Mutex // held across every reap, so a signal never reaches a reaped pid
	cmd    int        // the command's pid
	status syscall.WaitStatus
	done   bool // the command has been reaped
}

func reaperMain() int {
	// The command's Pdeathsig fires when the thread that forked it exits: keep that thread.
	runtime.LockOSThread()
	unix.CloseOnExec(reaperCtlFD)
	r := &reaper{ctl: os.NewFile(reaperCtlFD, "reaper-control"), self: os.Getpid()}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return r.refuse(err)
	}
	// Code running as this user cannot ptrace it, and its catchable signals are caught and
	// dropped (SIGKILL and SIGSTOP it still can send: see docs/platforms/gcp.md). Caught, not
	// ignored: an ignored signal would stay ignored in the command.
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	drop := make(chan os.Signal, 8)
	signal.Notify(drop, reaperDropped...)
	for sig := 34; sig <= 64; sig++ { // the real-time signals: they end a process by default
		signal.Notify(drop, syscall.Signal(sig))
	}
	go func() {
		for range drop {
		}
	}()
	// The reaper counts as its command: most killable, and the command inherits the score
	// (raising needs no privilege; where it fails the command keeps the agent's, as in spawn).
	if f, err := os.OpenFile("/proc/self/oom_score_adj", os.O_WRONLY, 0); err == nil {
		_, _ = f.WriteString(codeOOMScoreAdj)
		f.Close()
	}
	spec, stdio, err := readSpec(r.ctl)
	if err == io.EOF {
		return 0 // the agent dropped this reaper before giving it a command
	}
	if err != nil {
		return r.refuse(unix.EINVAL)
	}
	var cred *syscall.Credential
	if spec.UID != nil {
		cred = &syscall.Credential{Uid: *spec.UID, Gid: spec.GID, Groups: []uint32{}}
	}
	pid, err := syscall.ForkExec(spec.Path, spec.Argv, &syscall.ProcAttr{
		Dir:   spec.Dir,
		Env:   spec.Env,
		Files: []uintptr{uintptr(stdio[0]), uintptr(stdio[1]), uintptr(stdio[2])},
		Sys: &syscall.SysProcAttr{
			Setsid: true, Setctty: spec.TTY, Ctty: 0, Credential: cred,
			Pdeathsig: syscall.SIGKILL, // the reaper killed from outside takes the command along
		},
	})
	// The command's stdio is its own: held here, its output would not end when it does.
	for _, fd := range stdio {
		unix.Close(fd)
	}
	if err != nil {
		return r.refuse(err)
	}
	r.cmd = pid
	if _, err := fmt.Fprintf(r.ctl, "p %d\n", pid); err != nil {
		// The agent is gone before it knew of the command: nothing of it may outlive this.
		r.killAll()
	}
	go r.control()
	r.waitCommand()
	swept := r.sweep()
	flag := 0
	if swept {
		flag = 1
	}
	_, _ = fmt.Fprintf(r.ctl, "x %d %d\n", uint32(r.status), flag)
	return 0
}

// readSpec reads the command and its three stdio fds from the control socket.
func readSpec(ctl *os.File) (*reaperSpec, []int, error) {
	fd := int(ctl.Fd())
	var hdr [4]byte
	oob := make([]byte, unix.CmsgSpace(3*4))
	n, oobn, _, _, err := unix.Recvmsg(fd, hdr[:], oob, unix.MSG_CMSG_CLOEXEC)
	for err == unix.EINTR {
		n, oobn, _, _, err = unix.Recvmsg(fd, hdr[:], oob, unix.MSG_CMSG_CLOEXEC)
	}
	if err != nil {
		return nil, nil, err
	}
	var fds []int
	if cmsgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, c := range cmsgs {
			if rights, err := unix.ParseUnixRights(&c); err == nil {
				fds = append(fds, rights...)
			}
		}
	}
	closeAll := func() {
		for _, f := range fds {
			unix.Close(f)
		}
	}
	if n == 0 {
		closeAll()
		return nil, nil, io.EOF
	}
	if n < len(hdr) {
		if _, err := io.ReadFull(ctl, hdr[n:]); err != nil {
			closeAll()
			return nil, nil, err
		}
	}
	size := binary.BigEndian.Uint32(hdr[:])
	if len(fds) != 3 || size > maxSpec {
		closeAll()
		return nil, nil, fmt.Errorf("exec reaper: bad command header (%d fds, %d bytes)", len(fds), size)
	}
	buf := make([]byte, size)
	if _, err := io.ReadFull(ctl, buf); err != nil {
		closeAll()
		return nil, nil, err
	}
	var spec reaperSpec
	if err := json.Unmarshal(buf, &spec); err != nil || spec.Path == "" || len(spec.Argv) == 0 {
		closeAll()
		return nil, nil, fmt.Errorf("exec reaper: bad command: %v", err)
	}
	return &spec, fds, nil
}

// refuse reports that the command could not be started.
func (r *reaper) refuse(err error) int {
	errno, ok := err.(syscall.Errno)
	if !ok {
		errno = unix.EINVAL
	}
	_, _ = fmt.Fprintf(r.ctl, "e %d\n", int(errno))
	return 1
}

// control serves the agent's requests until the socket ends, which means the agent is gone:
// then, as for "k", everything the command started is killed.
func (r *reaper) control() {
	sc := bufio.NewScanner(r.ctl)
	for sc.Scan() {
		verb, arg, _ := strings.Cut(sc.Text(), " ")
		switch verb {
		case "s":
			if n, err := strconv.Atoi(arg); err == nil {
				r.signal(syscall.Signal(n))
			}
		case "k":
			r.killAll()
		}
	}
	r.killAll()
}

// signal sends sig to the command if it has not been reaped (its pid is still its own).
func (r *reaper) signal(sig syscall.Signal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.done {
		_ = unix.Kill(r.cmd, sig)
	}
}

// killAll sends SIGKILL to the command and every descendant found now; waitCommand and sweep
// see them die.
func (r *reaper) killAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.done {
		_ = unix.Kill(r.cmd, unix.SIGKILL)
	}
	r.killDescendants()
}

// waitCommand reaps children until the command is among them. The wait itself does not reap
// (WNOWAIT): reaping happens under mu, so signal never names a pid already given back.
func (r *reaper) waitCommand() {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err == unix.EINTR {
			continue
		}
		r.mu.Lock()
		r.reapLocked()
		done := r.done
		r.mu.Unlock()
		if done || err != nil {
			// err: no child at all, which cannot be while the command is unreaped.
			return
		}
	}
}

// reapLocked reaps every child that has exited, keeping the command's status; it reports
// whether any child is left.
func (r *reaper) reapLocked() bool {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		switch {
		case err == syscall.EINTR:
			continue
		case err != nil: // ECHILD: no child left
			return false
		case pid == 0:
			return true
		}
		if pid == r.cmd && !r.done {
			r.status, r.done = ws, true
		}
	}
}

// sweep kills and reaps descendants until the reaper has no child left, bounded by
// killTimeout; it reports whether that was reached. Usually the command leaves nothing and
// the first reap says so, without a look at /proc. A descendant whose parent dies becomes the
// reaper's child (it is their subreaper), so "no child" means "no descendant".
func (r *reaper) sweep() bool {
	ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
	defer cancel()
	for wait := newBackoff(); ; {
		r.mu.Lock()
		left := r.reapLocked()
		if left {
			// Forks that raced the previous round are found now, as children of a
			// process killed then or, their parent gone, as the reaper's.
			r.killDescendants()
		}
		r.mu.Unlock()
		if !left {
			return true
		}
		if !wait.Wait(ctx) {
			return false
		}
	}
}

// killDescendants sends SIGKILL to every process whose parent chain leads to the reaper.
func (r *reaper) killDescendants() {
	for _, pid := range descendants(r.self) {
		_ = unix.Kill(pid, unix.SIGKILL)
	}
}

// descendants lists the processes below pid, from /proc's parent links.
func descendants(pid int) []int {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	children := map[int][]int{}
	for _, n := range names {
		p, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		if pp, ok := parentOf(p); ok {
			children[pp] = append(children[pp], p)
		}
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// parentOf reads a process's parent pid from /proc/PID/stat.
func parentOf(pid int) (int, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	return parseStatPPID(b)
}

// parseStatPPID finds the parent pid in a /proc/PID/stat line: the fourth field, counted
// after the command name's closing parenthesis (the name itself may hold spaces and ')').
func parseStatPPID(b []byte) (int, bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, false
	}
	pp, err := strconv.Atoi(f[1])
	return pp, err == nil
}

// reaperExit is what a reaper reported: the command's wait status, and whether every
// descendant was confirmed gone.
type reaperExit struct {
	status syscall.WaitStatus
	swept  bool
}

// parseReaperLine reads one line of the reaper's: the command's pid ("p"), the errno it
// could not be started with ("e"), or its exit ("x").
func parseReaperLine(line string) (pid int, startErr error, exit *reaperExit, err error) {
	f := strings.Fields(line)
	bad := fmt.Errorf("exec reaper: unexpected report %q", line)
	if len(f) == 0 {
		return 0, nil, nil, bad
	}
	switch {
	case f[0] == "p" && len(f) == 2:
		n, err := strconv.Atoi(f[1])
		if err != nil || n <= 0 {
			return 0, nil, nil, bad
		}
		return n, nil, nil, nil
	case f[0] == "e" && len(f) == 2:
		n, err := strconv.Atoi(f[1])
		if err != nil || n <= 0 {
			return 0, nil, nil, bad
		}
		return 0, syscall.Errno(n), nil, nil
	case f[0] == "x" && len(f) == 3:
		st, err1 := strconv.ParseUint(f[1], 10, 32)
		sw, err2 := strconv.Atoi(f[2])
		if err1 != nil || err2 != nil || (sw != 0 && sw != 1) {
			return 0, nil, nil, bad
		}
		return 0, nil, &reaperExit{status: syscall.WaitStatus(uint32(st)), swept: sw == 1}, nil
	}
	return 0, nil, nil, bad
}

// reaperTimeout bounds how long the agent waits, once it asked a reaper to kill, before it
// kills the reaper itself (stopped, or stuck): longer than the reaper's own sweep.
const reaperTimeout = killTimeout + 10*time.Second
