package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
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
	l.child.Close()
	l.child = nil
	line, err := l.readLine()
	if err != nil {
		l.pid = 0 // gone: never signalled
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
