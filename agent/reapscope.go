//go:build linux

package agent

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

// reaperExe is what the spawner executes to start a reaper: this very binary, whatever its
// name or path (the link names the running image even if the file has been replaced).
const reaperExe = "/proc/self/exe"

// noReaper, set by a test, keeps the process group as the scope where there is no cgroup.
var noReaper bool

// reaperAvailable reports whether commands can be started through a reaper (reaper.go): the
// kernel knows child subreapers and this binary can be executed again.
func reaperAvailable() bool {
	if noReaper {
		return false
	}
	if _, err := os.Stat(reaperExe); err != nil {
		return false
	}
	// Asked of the agent itself, which stays as it is; a reaper sets it on itself.
	var v int32
	_, _, errno := unix.Syscall6(unix.SYS_PRCTL, unix.PR_GET_CHILD_SUBREAPER, uintptr(unsafe.Pointer(&v)), 0, 0, 0, 0)
	return errno == 0
}

// reapLink is an exec's reaper as the agent holds it: the control socket (reaper.go has the
// protocol) and what the reaper said.
type reapLink struct {
	ctl   *os.File // the agent's end, in the poller
	child *os.File // the reaper's end, until the reaper has it
	buf   []byte   // read, not yet parsed
	pid   int      // the reaper's pid
	cmd   int      // the command's pid
	pidf  *os.File // the reaper's pidfd (the job's; nil: the kernel gave none)

	mu     sync.Mutex
	exited bool        // the reaper's exit has been collected: it is signalled no more
	timer  *time.Timer // kills the reaper if it has not ended reaperTimeout after a kill
	forced bool        // timer fired
	err    error       // why the exec's processes cannot be confirmed gone
}

func newReapLink() (*reapLink, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("exec reaper: control socket: %w", err)
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, fmt.Errorf("exec reaper: control socket: %w", err)
	}
	return &reapLink{ctl: os.NewFile(uintptr(fds[0]), "reaper-control"), child: os.NewFile(uintptr(fds[1]), "reaper-control")}, nil
}

// readLine returns the reaper's next line ("" and an error at the end of its reports).
func (l *reapLink) readLine() (string, error) {
	var tmp [128]byte
	for {
		if i := bytes.IndexByte(l.buf, '\n'); i >= 0 {
			line := string(l.buf[:i])
			l.buf = l.buf[i+1:]
			return line, nil
		}
		n, err := l.ctl.Read(tmp[:])
		l.buf = append(l.buf, tmp[:n]...)
		if err != nil && n == 0 {
			return "", err
		}
		if len(l.buf) > 4096 {
			return "", errors.New("exec reaper: report too long")
		}
	}
}

// started takes the reaper's first report: the command runs, or the errno it could not be
// started with (returned as it is, for the caller to classify as a fork's).
func (l *reapLink) started(pid int, pidf *os.File) error {
	l.pid, l.pidf = pid, pidf
	line, err := l.readLine()
	if err != nil {
		l.pid = 0 // gone: never signalled
		if errors.Is(err, unix.ECONNRESET) {
			// Its end closed with the command still unread in its queue (a unix socket then
			// resets the peer; one that had read it all would have given EOF): it never had
			// the command. Seen with a reaper started ahead across a gVisor pause.
			return fmt.Errorf("%w: exec reaper (pid %d) ended before it read the command", errReaperLost, pid)
		}
		// Killed, most likely by the command itself (code running as the agent's user): it
		// may have run, and what it started may survive.
		return fmt.Errorf("%w: exec reaper (pid %d) ended before it reported the command started: %v", sbtypes.ErrOutcomeUnknown, pid, err)
	}
	cmd, startErr, _, err := parseReaperLine(line)
	switch {
	case err != nil:
		return err
	case startErr != nil:
		l.pid = 0 // exiting of itself, with nothing started: never signalled
		return startErr
	case cmd == 0:
		return fmt.Errorf("exec reaper: unexpected report %q before the command started", line)
	}
	l.cmd = cmd
	return nil
}

// signalReaper sends sig to the reaper itself (through its pidfd when there is one, so a
// recycled pid is never hit). Called with mu held and the reaper not yet collected.
func (l *reapLink) signalReaper(sig syscall.Signal) {
	if l.pidf != nil {
		if rc, err := l.pidf.SyscallConn(); err == nil {
			if rc.Control(func(fd uintptr) { _ = unix.PidfdSendSignal(int(fd), sig, nil, 0) }) == nil {
				return
			}
		}
	}
	if l.pid > 0 {
		_ = unix.Kill(l.pid, sig)
	}
}

// send writes one request to the reaper. A reaper that is gone has nothing left to act on.
func (l *reapLink) send(msg string) error {
	if l.ctl == nil {
		return nil
	}
	if _, err := l.ctl.Write([]byte(msg)); err != nil && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, os.ErrClosed) {
		return fmt.Errorf("exec reaper (pid %d): %w", l.pid, err)
	}
	return nil
}

// forward asks the reaper to send sig to the command.
func (l *reapLink) forward(sig syscall.Signal) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.exited {
		return unix.ESRCH
	}
	return l.send(fmt.Sprintf("s %d\n", int(sig)))
}

// kill asks the reaper to kill the command and everything it started; the reaper exits once
// they are gone, which the job's wait sees. A reaper that does not (stopped by code running as
// its user, or stuck) is killed after reaperTimeout, and the exec's outcome is then unknown.
func (l *reapLink) kill() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.exited || l.pid == 0 {
		return nil
	}
	err := l.send("k\n")
	l.signalReaper(unix.SIGCONT)
	if l.timer == nil {
		l.timer = time.AfterFunc(reaperTimeout, func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if !l.exited {
				l.forced = true
				l.signalReaper(unix.SIGKILL)
			}
		})
	}
	return err
}

// exitStatus turns the reaper's wait status into the command's, from the reaper's last report.
// Without one (the reaper was killed), the reaper's own status stands and the exec's outcome
// is an error: what the command started may have escaped.
func (l *reapLink) exitStatus(ws syscall.WaitStatus) syscall.WaitStatus {
	l.mu.Lock()
	l.exited = true
	if l.timer != nil {
		l.timer.Stop()
	}
	forced := l.forced
	l.mu.Unlock()
	// The reaper has exited: its end is closed, so this read ends at what it wrote.
	for {
		line, err := l.readLine()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = fmt.Errorf("ended %s", describeStatus(ws))
			}
			if forced {
				err = fmt.Errorf("did not end within %v of being asked to kill, so was killed", reaperTimeout)
			}
			l.err = fmt.Errorf("exec reaper (pid %d) %v before reporting the command's exit: what the command started may survive", l.pid, err)
			return ws
		}
		_, _, ex, perr := parseReaperLine(line)
		if perr != nil {
			l.err = perr
			return ws
		}
		if ex == nil {
			continue
		}
		if !ex.swept {
			l.err = fmt.Errorf("exec reaper (pid %d): processes the command started were still there %v after it ended", l.pid, killTimeout)
		}
		return ex.status
	}
}

// close ends the link and returns what went wrong, if anything. A reaper still running sees the
// end of its control socket and kills everything.
func (l *reapLink) close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.timer != nil {
		l.timer.Stop()
	}
	if l.child != nil {
		l.child.Close()
		l.child = nil
	}
	if l.ctl != nil {
		l.ctl.Close()
		l.ctl = nil
	}
	return l.err
}

func describeStatus(ws syscall.WaitStatus) string {
	switch {
	case ws.Exited():
		return fmt.Sprintf("with status %d", ws.ExitStatus())
	case ws.Signaled():
		return "by " + unix.SignalName(ws.Signal())
	}
	return fmt.Sprintf("with wait status %#x", uint32(ws))
}

// spawned records the main process the spawner started: for a process group its group, for
// the subreaper the reaper's word that the command runs (or why it does not).
func (g *execGroup) spawned(pid int, pidf *os.File) error {
	switch g.kind {
	case scopePgrp:
		g.pgid = pid // Setsid made the child a session and group leader
	case scopeReaper:
		return g.rp.started(pid, pidf)
	}
	return nil
}

// exitStatus is the command's wait status given the main process's: with the subreaper the
// main process is the reaper, which reports the command's.
func (g *execGroup) exitStatus(ws syscall.WaitStatus) syscall.WaitStatus {
	if g.kind == scopeReaper {
		return g.rp.exitStatus(ws)
	}
	return ws
}

// hand gives the reaper its command: the header with the command's stdio attached, then the
// spec.
func (l *reapLink) hand(spec *reaperSpec, stdio []*os.File) error {
	body, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	if len(body) > maxSpec {
		return fmt.Errorf("%w: the command's argv and env are %d bytes, more than %d", sbtypes.ErrTooLarge, len(body), maxSpec)
	}
	fds := make([]int, len(stdio))
	for i, f := range stdio {
		fds[i] = int(f.Fd())
	}
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(body)))
	rc, err := l.ctl.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	// Four bytes and three fds: the socket's buffer is empty, so this never blocks.
	if err := rc.Write(func(fd uintptr) bool {
		serr = unix.Sendmsg(int(fd), hdr[:], unix.UnixRights(fds...), nil, 0)
		return serr != unix.EAGAIN
	}); err != nil {
		return err
	}
	runtime.KeepAlive(stdio)
	if serr != nil {
		return fmt.Errorf("exec reaper (pid %d): hand the command: %w", l.pid, serr)
	}
	if _, err := l.ctl.Write(body); err != nil {
		return fmt.Errorf("exec reaper (pid %d): hand the command: %w", l.pid, err)
	}
	return nil
}

// errReaperLost: a reaper ended before it read its command, so the command never ran and
// another reaper may be handed it (server.start does, once).
var errReaperLost = errors.New("exec reaper lost")

// nextReaper is a reaper started ahead of its command.
type nextReaper struct {
	pid    int
	pidfd  int // -1: the kernel gave none
	exited <-chan syscall.WaitStatus
	link   *reapLink
}

// startReaper starts a reaper from the spawner thread (it inherits that thread's filters, as a
// command would), waiting for its command.
func (s *spawner) startReaper() (*nextReaper, error) {
	l, err := newReapLink()
	if err != nil {
		return nil, err
	}
	// As run does for a command: the reaper passes on whatever it inherits.
	if err := CloseOnExecFrom(3); err != nil {
		l.close()
		return nil, fmt.Errorf("%w: %v", errFDs, err)
	}
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		l.close()
		return nil, err
	}
	rep := s.fork(&spawnRequest{argv0: reaperExe, argv: []string{reaperArg0}, dir: "/",
		files: []*os.File{null, null, null, l.child}, reaper: true})
	null.Close()
	l.child.Close()
	l.child = nil
	if rep.err != nil {
		l.close()
		return nil, fmt.Errorf("start exec reaper %s: %w", reaperExe, rep.err)
	}
	l.pid = rep.pid
	return &nextReaper{pid: rep.pid, pidfd: rep.pidfd, exited: rep.exited, link: l}, nil
}

// drop ends a reaper that never got a command: at the end of its socket it exits.
func (r *nextReaper) drop() {
	r.link.close()
	<-r.exited
	if r.pidfd >= 0 {
		unix.Close(r.pidfd)
	}
}

// runReaper hands req's command to the next reaper (or, when none is ready, to one started
// now; the next is started after the answer, see server.prepareNext). The reply is the reaper's: it is the exec's main process.
func (s *spawner) runReaper(req *spawnRequest) spawnReply {
	s.nextMu.Lock()
	if s.next == nil && s.filling {
		// One on its way is ready sooner than one started now, which would compete with it.
		s.filled.Wait()
	}
	r := s.next
	s.next = nil
	s.nextMu.Unlock()
	ahead := r != nil
	if r == nil {
		var err error
		if r, err = s.startReaper(); err != nil {
			return spawnReply{err: err}
		}
	}
	spec := &reaperSpec{Path: req.argv0, Argv: req.argv, Env: req.env, Dir: req.dir, TTY: req.tty}
	if s.cred != nil {
		uid := s.cred.Uid
		spec.UID, spec.GID = &uid, s.cred.Gid
	}
	err := r.link.hand(spec, req.files)
	if err != nil && ahead && (errors.Is(err, unix.EPIPE) || errors.Is(err, unix.ECONNRESET)) {
		// The reaper started ahead died while it waited (its end of the socket is gone: killed
		// from outside, or lost across a pause); it never had a command, so one started now
		// takes this one.
		slog.Warn("exec reaper started ahead is gone; starting another", "component", "agent", "pid", r.pid, "err", err)
		r.drop()
		if r, err = s.startReaper(); err != nil {
			return spawnReply{err: err}
		}
		err = r.link.hand(spec, req.files)
	}
	if err != nil {
		r.drop()
		return spawnReply{err: err}
	}
	req.group.rp = r.link
	return spawnReply{pid: r.pid, pidfd: r.pidfd, exited: r.exited}
}

// refill starts the next reaper in the background, unless one is there or on its way.
func (s *spawner) refill() {
	s.nextMu.Lock()
	defer s.nextMu.Unlock()
	if s.next != nil || s.filling || s.dropping {
		return
	}
	s.filling = true
	s.fills.Add(1)
	go func() {
		defer s.fills.Done()
		r, err := s.startReaper()
		s.nextMu.Lock()
		s.filling = false
		if err == nil && !s.dropping {
			s.next, r = r, nil
		}
		s.filled.Broadcast()
		s.nextMu.Unlock()
		if r != nil {
			r.drop()
		}
	}()
}

// dropNext ends the next reaper, if any; none is started after it. Call it before close.
func (s *spawner) dropNext() {
	s.nextMu.Lock()
	s.dropping = true
	s.nextMu.Unlock()
	s.fills.Wait()
	s.nextMu.Lock()
	r := s.next
	s.next = nil
	s.nextMu.Unlock()
	if r != nil {
		r.drop()
	}
}

// prepareNext readies the next exec's kill scope once an exec has been answered: a v1 cgroup,
// or a reaper. After, not at the take: a reaper's start is a process start of this binary,
// which would compete with the exec for the processor.
func (s *server) prepareNext() {
	s.cg.prepare()
	if s.cg.kind == scopeReaper {
		s.spawn.refill()
	}
}
