//go:build linux

package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/internal/kernfile"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

// execSpec is a validated request.
type execSpec struct {
	argv      []string // argv[0] as requested
	path      string   // resolved executable
	env       []string
	dir       string
	timeout   time.Duration
	stdin     bool
	maxStdout int64
	maxStderr int64
	tty       bool
	rows      int
	cols      int
	exitFirst bool // background process only (wire.ExecRequest.ExitFirst)
}

// outputGrace is how long output may still arrive after everything the exec started is dead
// (cgroup scopes): long enough for the last bytes in flight, far too short for a process of
// another exec that was handed this exec's stdout (SCM_RIGHTS) to hold the call open.
const outputGrace = 100 * time.Millisecond

const (
	pipeSize    = 256 << 10
	readSize    = 64 << 10
	defaultRows = 24
	defaultCols = 80
	maxTermSize = 10000
)

// validate turns a wire request into a spec, refusing anything it cannot honour exactly.
func (s *server) validate(req *wire.ExecRequest) (*execSpec, error) {
	inv := func(field, format string, a ...any) error {
		return fmt.Errorf("%w: %s: %s", sbtypes.ErrInvalid, field, fmt.Sprintf(format, a...))
	}
	sp := &execSpec{stdin: req.Stdin, tty: req.TTY, exitFirst: req.ExitFirst}
	switch {
	case len(req.Argv) > 0 && req.Shell != "":
		return nil, inv("argv", "argv and shell are both set; set exactly one")
	case len(req.Argv) > 0:
		if len(req.Argv) > maxArgs {
			return nil, inv("argv", "%d arguments, at most %d allowed", len(req.Argv), maxArgs)
		}
		for i, a := range req.Argv {
			if strings.IndexByte(a, 0) >= 0 {
				return nil, inv(fmt.Sprintf("argv[%d]", i), "contains a NUL byte")
			}
		}
		if req.Argv[0] == "" {
			return nil, inv("argv[0]", "is empty")
		}
		sp.argv = slices.Clone(req.Argv)
	case req.Shell != "":
		if strings.IndexByte(req.Shell, 0) >= 0 {
			return nil, inv("shell", "contains a NUL byte")
		}
		sp.argv = []string{"/bin/sh", "-c", req.Shell}
	default:
		return nil, inv("argv", "neither argv nor shell is set; set exactly one")
	}
	var err error
	if sp.timeout, err = s.deadline(req.TimeoutMs); err != nil {
		return nil, err
	}
	if sp.maxStdout, sp.maxStderr, err = s.outputCaps(req.MaxStdout, req.MaxStderr); err != nil {
		return nil, err
	}
	if req.TTY {
		sp.rows, sp.cols = req.Rows, req.Cols
		if sp.rows == 0 {
			sp.rows = defaultRows
		}
		if sp.cols == 0 {
			sp.cols = defaultCols
		}
		if sp.rows < 0 || sp.rows > maxTermSize || sp.cols < 0 || sp.cols > maxTermSize {
			return nil, inv("rows/cols", "%dx%d is outside 1..%d", sp.rows, sp.cols, maxTermSize)
		}
	} else if req.Rows != 0 || req.Cols != 0 {
		return nil, inv("rows/cols", "set without tty")
	}

	env := map[string]string{}
	for k, v := range s.cfg.Env {
		env[k] = v
	}
	if len(req.Env) > maxEnv {
		return nil, inv("env", "%d variables, at most %d allowed", len(req.Env), maxEnv)
	}
	for k, v := range req.Env {
		if err := validateEnvName("env", k); err != nil {
			return nil, err
		}
		if err := validateEnvValue("env", k, v); err != nil {
			return nil, err
		}
		env[k] = v
	}
	if req.TTY {
		if _, ok := env["TERM"]; !ok {
			env["TERM"] = "xterm"
		}
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		sp.env = append(sp.env, k+"="+env[k])
	}

	sp.dir = req.Cwd
	if sp.dir == "" {
		sp.dir = s.cfg.Workdir
	}
	if sp.dir == "" {
		sp.dir = "/"
	}
	if !path.IsAbs(sp.dir) || strings.IndexByte(sp.dir, 0) >= 0 {
		return nil, inv("cwd", "%q is not an absolute path", sp.dir)
	}
	if fi, err := os.Stat(sp.dir); err != nil {
		return nil, fmt.Errorf("%w: cwd %q: %v", classify(err), sp.dir, err)
	} else if !fi.IsDir() {
		return nil, inv("cwd", "%q is not a directory", sp.dir)
	}

	p, err := lookPath(sp.argv[0], env["PATH"], sp.dir)
	if err != nil {
		return nil, err
	}
	sp.path = p
	return sp, nil
}

// deadline checks a request's timeoutMs: required, and at most the agent's maximum.
func (s *server) deadline(ms int64) (time.Duration, error) {
	if ms <= 0 {
		return 0, fmt.Errorf("%w: timeoutMs: %d: a deadline is required (milliseconds > 0, at most %d)", sbtypes.ErrInvalid, ms, s.cfg.MaxTimeout.Milliseconds())
	}
	if ms > s.cfg.MaxTimeout.Milliseconds() {
		return 0, fmt.Errorf("%w: timeoutMs: %d exceeds this agent's maximum %d", sbtypes.ErrInvalid, ms, s.cfg.MaxTimeout.Milliseconds())
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// outputCaps checks a request's per-stream caps; 0 is the agent's default.
func (s *server) outputCaps(stdout, stderr int64) (int64, int64, error) {
	caps := [2]int64{stdout, stderr}
	for i, field := range []string{"maxStdout", "maxStderr"} {
		switch {
		case caps[i] < 0:
			return 0, 0, fmt.Errorf("%w: %s: %d is negative (0 means the agent's default %d)", sbtypes.ErrInvalid, field, caps[i], s.cfg.DefaultOutputCap)
		case caps[i] == 0:
			caps[i] = s.cfg.DefaultOutputCap
		}
	}
	return caps[0], caps[1], nil
}

// lookPath finds file the way execvp would, with the command's PATH (not the agent's).
func lookPath(file, pathEnv, dir string) (string, error) {
	check := func(p string) error {
		abs := p
		if !path.IsAbs(abs) {
			abs = path.Join(dir, abs)
		}
		fi, err := os.Stat(abs)
		if err != nil {
			return err
		}
		if fi.IsDir() || fi.Mode()&0o111 == 0 {
			return fmt.Errorf("%s is not an executable file", p)
		}
		return nil
	}
	if strings.Contains(file, "/") {
		if err := check(file); err != nil {
			return "", fmt.Errorf("%w: argv[0]: %q: %v", classify(err), file, err)
		}
		return file, nil
	}
	for _, d := range strings.Split(pathEnv, ":") {
		if d == "" {
			continue // execvp's "current directory" entry is a trap, not a feature
		}
		p := path.Join(d, file)
		if check(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: argv[0]: executable %q not found in PATH %q", sbtypes.ErrNotFound, file, pathEnv)
}

// classify maps an OS error to a sandbox error class.
func classify(err error) error {
	switch {
	case errors.Is(err, os.ErrNotExist):
		return sbtypes.ErrNotFound
	case errors.Is(err, os.ErrPermission), errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EROFS):
		return sbtypes.ErrForbidden
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ELOOP),
		errors.Is(err, syscall.ENAMETOOLONG), errors.Is(err, syscall.EINVAL):
		return sbtypes.ErrInvalid
	case errors.Is(err, os.ErrExist), errors.Is(err, syscall.ENOTEMPTY), errors.Is(err, syscall.EBUSY):
		return sbtypes.ErrConflict
	case errors.Is(err, syscall.EFBIG), errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return sbtypes.ErrTooLarge
	}
	return sbtypes.ErrRefused
}

// sink receives a job's output. output returns false once the consumer is gone. data is only
// lent for the call (a pooled read buffer): a sink copies what it keeps.
type sink interface {
	// more says that further output is already waiting in the pipe, so a flush can wait.
	output(typ byte, data []byte, more bool) bool
}

// job is one running command and its kill scope.
type job struct {
	id      string
	spec    *execSpec
	group   *execGroup
	pid     int
	pidf    *os.File // the main process's pidfd (nil: the kernel gave none), in the poller
	started time.Time
	exited  <-chan syscall.WaitStatus

	outs []*os.File // read ends (stdout, stderr) or the pty master
	ptm  *os.File   // pty master (also in outs), for resize and stdin

	stdinMu sync.Mutex
	stdin   *os.File // write end (the pty master for a tty), nil when closed or none

	mu   sync.Mutex // guards done against signal()
	done bool       // the main process has been reaped

	// rest, set by supervise for an exitFirst job that left processes behind, empties and
	// removes its cgroup; the caller runs it once the exit is reported.
	rest func() error

	// deadline is the timer supervise waits on; handOver moves it, or before supervise
	// has made it, leaves the time in deadlineAt (both guarded by mu).
	deadline   *time.Timer
	deadlineAt time.Time
	// handed: work was handed to the job (handoff.go), which a job takes once (guarded by mu).
	handed bool

	// out is the output's way to its consumer, through the caps.
	out *streams
}

// streams is a job's output on its way to its sink: each stream's cap, what has gone through
// and whether it was cut. Work handed to a waiting process (handoff.go) swaps the sink and
// the caps at once, so that its output is capped as an exec's is, counted from the handoff.
type streams struct {
	mu        sync.Mutex // held while a frame goes out: a swap never splits one
	out       sink
	gone      bool // out said its consumer is gone
	limit     [2]int64
	sent      [2]int64
	truncated [2]bool
}

// forward passes data of stream i (0 stdout, 1 stderr) to the sink within its cap; more says
// that further output is already waiting (the flush can wait). Past the cap, or once the
// consumer is gone, data is dropped: the pipe is drained, so a cap never blocks the command.
func (st *streams) forward(i int, typ byte, data []byte, more func() bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.gone || st.out == nil {
		return
	}
	m := int64(len(data))
	if st.sent[i]+m > st.limit[i] {
		m = st.limit[i] - st.sent[i]
		st.truncated[i] = true
	}
	if m <= 0 {
		return
	}
	st.sent[i] += m
	// Hold the flush only when more output is already waiting and will be forwarded: past
	// the cap nothing follows, so this frame must go now.
	st.gone = !st.out.output(typ, data[:m], st.sent[i] < st.limit[i] && more())
}

// cut records that stream i lost bytes still arriving when it was cut off.
func (st *streams) cut(i int) {
	st.mu.Lock()
	st.truncated[i] = true
	st.mu.Unlock()
}

// swap sends the output from now on to out, each stream capped afresh at limits.
func (st *streams) swap(out sink, limits [2]int64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.out, st.gone, st.limit = out, false, limits
	st.sent, st.truncated = [2]int64{}, [2]bool{}
}

func (st *streams) wasTruncated() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.truncated[0] || st.truncated[1]
}

// handOver makes the job's deadline d from now and sends its output from now on to out,
// capped afresh at limits: a background process handed its work later than it started (a
// waiting interpreter given its code) gets the work's deadline and caps, kept here in the
// sandbox so that no client's death stretches them. It fails with ErrConflict when the job
// has no running deadline any more (it has exited or its deadline has passed) or was handed
// work before.
func (j *job) handOver(d time.Duration, out sink, limits [2]int64) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	switch {
	case j.handed:
		return fmt.Errorf("%w: process %s was handed its work already", sbtypes.ErrConflict, j.id)
	case j.done:
		return fmt.Errorf("%w: process %s has exited", sbtypes.ErrConflict, j.id)
	case j.deadline == nil:
		j.deadlineAt = time.Now().Add(d)
	case !j.deadline.Stop():
		// Stop reports false when the timer has fired: the old deadline stands, passed.
		return fmt.Errorf("%w: process %s has passed its deadline", sbtypes.ErrConflict, j.id)
	default:
		j.deadline.Reset(d)
	}
	j.handed = true
	j.out.swap(out, limits)
	return nil
}

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// start creates the exec's cgroup and I/O and forks the command, whose output goes to out.
func (s *server) start(sp *execSpec, out sink) (*job, error) {
	g, err := s.cg.group()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", sbtypes.ErrRefused, err)
	}
	j := &job{id: g.id, spec: sp, group: g, out: &streams{out: out, limit: [2]int64{sp.maxStdout, sp.maxStderr}}}
	fail := func(err error) (*job, error) {
		j.closeIO()
		if derr := g.destroy(); derr != nil {
			err = errors.Join(err, derr)
		}
		return nil, err
	}
	var child []*os.File // the child's ends, closed here once it has them
	defer func() {
		for _, f := range child {
			f.Close()
		}
	}()
	if sp.tty {
		ptm, pts, err := pty.Open()
		if err != nil {
			return fail(fmt.Errorf("%w: open pty: %v", sbtypes.ErrRefused, err))
		}
		child = append(child, pts)
		j.ptm = ptm
		j.outs = []*os.File{ptm}
		// pty.Open's ioctls went through ptm.Fd(), which puts the master in blocking mode:
		// a blocked Read could then not be interrupted when the output is cut off (supervise).
		if err := setNonblock(ptm); err != nil {
			return fail(fmt.Errorf("%w: pty: %v", sbtypes.ErrRefused, err))
		}
		if err := setWinsize(ptm, sp.rows, sp.cols); err != nil {
			return fail(fmt.Errorf("%w: set pty size: %v", sbtypes.ErrRefused, err))
		}
		if s.spawn.cred != nil {
			// The terminal belongs to the code that uses it, as a login's would.
			if err := pts.Chown(int(s.spawn.cred.Uid), int(s.spawn.cred.Gid)); err != nil {
				return fail(fmt.Errorf("%w: chown pty: %v", sbtypes.ErrRefused, err))
			}
		}
		if sp.stdin {
			j.stdin = ptm // writes to the master are the terminal's input
		}
	} else {
		var in *os.File
		if sp.stdin {
			r, w, err := commandPipe(false)
			if err != nil {
				return fail(fmt.Errorf("%w: stdin pipe: %v", sbtypes.ErrRefused, err))
			}
			in, j.stdin = r, w
		} else {
			fd, err := kernfile.Open(os.DevNull, unix.O_RDONLY)
			if err != nil {
				return fail(fmt.Errorf("%w: %v", sbtypes.ErrRefused, err))
			}
			in = os.NewFile(uintptr(fd), os.DevNull)
		}
		child = append(child, in)
		for range 2 {
			r, w, err := commandPipe(true)
			if err != nil {
				return fail(fmt.Errorf("%w: output pipe: %v", sbtypes.ErrRefused, err))
			}
			// A larger pipe lets a fast writer run ahead of the agent between reads.
			_, _ = unix.FcntlInt(w.Fd(), unix.F_SETPIPE_SZ, pipeSize)
			j.outs = append(j.outs, r)
			child = append(child, w)
		}
	}
	files := child
	if sp.tty {
		files = []*os.File{child[0], child[0], child[0]}
	}
	j.started = time.Now()
	req := &spawnRequest{argv0: sp.path, argv: sp.argv, env: sp.env, dir: sp.dir, files: files, tty: sp.tty, group: g}
	for try := 1; ; try++ {
		rep := s.spawn.run(req)
		if rep.err != nil {
			return fail(fmt.Errorf("%w: start %q: %v", classify(rep.err), sp.argv[0], rep.err))
		}
		j.pid, j.exited, j.pidf = rep.pid, rep.exited, nil
		if rep.pidfd >= 0 {
			// Non-blocking so that the poller takes it: supervise learns of the exit from it.
			if err := unix.SetNonblock(rep.pidfd, true); err != nil {
				unix.Close(rep.pidfd)
			} else {
				j.pidf = os.NewFile(uintptr(rep.pidfd), "pidfd")
			}
		}
		err := g.spawned(rep.pid, j.pidf)
		if err == nil {
			return j, nil
		}
		if errors.Is(err, errReaperLost) && try == 1 {
			// Nothing ran (errReaperLost): the lost reaper is reaped and a new one started.
			s.log.Warn("exec reaper lost before it read the command; starting another", "id", g.id, "err", err)
			<-rep.exited
			if j.pidf != nil {
				j.pidf.Close()
			}
			_ = g.rp.close()
			g.rp = nil
			continue
		}
		if !errors.Is(err, sbtypes.ErrOutcomeUnknown) {
			err = fmt.Errorf("%w: start %q: %v", classify(err), sp.argv[0], err)
		}
		return fail(err)
	}
}

// commandPipe makes a pipe between the agent and a command: r is the read end, w the write
// end, and the agent's end (r when the command writes, w when it reads) is non-blocking and in
// the runtime's poller, so reads and writes wait there and honour deadlines. The command's end
// stays blocking and out of the poller: os.Pipe would register it too (an epoll_ctl pair, and a
// wakeup of the poller's thread for a write end, which is ready at once) only for it to be
// made blocking again and closed as soon as the command has it.
func commandPipe(commandWrites bool) (r, w *os.File, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, nil, err
	}
	ours := p[1]
	if commandWrites {
		ours = p[0]
	}
	if err := unix.SetNonblock(ours, true); err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return nil, nil, err
	}
	return os.NewFile(uintptr(p[0]), "|0"), os.NewFile(uintptr(p[1]), "|1"), nil
}

// outputHolders returns a test for whether a process holds the job's output pipes open (nil:
// it cannot tell, for a terminal, and every process counts as holding it).
func (j *job) outputHolders() func(pid int) bool {
	if j.spec.tty {
		return nil
	}
	inos := map[uint64]bool{}
	for _, f := range j.outs {
		var st unix.Stat_t
		rc, err := f.SyscallConn()
		if err != nil {
			return nil
		}
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = unix.Fstat(int(fd), &st) }); err != nil || serr != nil {
			return nil
		}
		inos[st.Ino] = true
	}
	return func(pid int) bool { return holdsPipe(pid, inos) }
}

// closeIO closes the agent's ends of the command's I/O.
func (j *job) closeIO() {
	j.closeStdin()
	for _, f := range j.outs {
		f.Close()
	}
	if j.pidf != nil {
		j.pidf.Close()
	}
}

// stopPumps cuts the output streams off: a read deadline in the past wakes every blocked
// Read, and pump then forwards only what is already buffered.
func (j *job) stopPumps() {
	for _, f := range j.outs {
		if err := f.SetReadDeadline(time.Unix(1, 0)); err != nil {
			// Not pollable (never for pipes and the pty master as opened here): closing is
			// the only other way to end the read.
			f.Close()
		}
	}
}

// reaped records that the main process is gone, so signal() never reaches a recycled pid.
func (j *job) reaped() {
	j.mu.Lock()
	j.done = true
	j.mu.Unlock()
}

func (j *job) closeStdin() {
	j.stdinMu.Lock()
	defer j.stdinMu.Unlock()
	if j.stdin != nil && j.stdin != j.ptm {
		j.stdin.Close()
	}
	j.stdin = nil
}

// signal delivers sig to the main process through its pidfd, so a recycled pid is never hit.
func (j *job) signal(sig syscall.Signal) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	switch {
	case j.done:
		return unix.ESRCH
	case j.group.kind == scopeReaper:
		return j.group.rp.forward(sig) // the main process is the command's reaper
	case j.pidf != nil:
		rc, err := j.pidf.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = unix.PidfdSendSignal(int(fd), sig, nil, 0) }); err != nil {
			return err
		}
		return serr
	}
	// Kernels without pidfd: the pid is ours until reaped, and reaped() is recorded at once.
	return unix.Kill(j.pid, sig)
}

// pump forwards output stream i (0 stdout, 1 stderr; a terminal's is 0) to the job's sink
// within its cap (streams.forward), and keeps draining past it so the cap never blocks the
// command. It ends at EOF, or when supervise cuts the stream off by an expired read deadline
// (stopPumps): then it forwards what is already in the pipe and no more, and marks the stream
// truncated if bytes were still arriving.
func pump(r *os.File, i int, st *streams, wg *sync.WaitGroup) {
	defer wg.Done()
	bp := readBufs.Get().(*[]byte)
	defer readBufs.Put(bp)
	buf := *bp
	typ := [2]byte{wire.FrameStdout, wire.FrameStderr}[i]
	for {
		n, err := r.Read(buf)
		if n > 0 {
			st.forward(i, typ, buf[:n], func() bool { return pending(r) > 0 })
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// Cut off: the bytes present now were written while the exec ran; whatever
			// arrives later comes from outside it. Bounded by the count taken here, so a
			// writer that never stops cannot keep this loop going.
			left := pending(r)
			for left > 0 {
				n := readNow(r, buf[:min(left, len(buf))])
				if n <= 0 {
					break
				}
				left -= n
				st.forward(i, typ, buf[:n], func() bool { return left > 0 })
			}
			if pending(r) > 0 {
				st.cut(i)
			}
			return
		}
		if err != nil {
			// EIO is how a pty master reports that the last slave fd closed.
			return
		}
	}
}

// readBufs holds pump's read buffers. A sink copies what it keeps (frameWriter into the
// response, ring a clone), so a buffer is free again once its pump returns. Allocated per exec,
// two of them were 128 KiB of garbage for every command, most of it never written: its clearing
// and the collections it brought on were measurable in a live exec of true.
var readBufs = sync.Pool{New: func() any {
	b := make([]byte, readSize)
	return &b
}}

// pending returns how many bytes are readable right now (FIONREAD), so the writer can batch
// frames into fewer flushes without delaying any output that is not already there.
func pending(f *os.File) int {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	cerr := rc.Control(func(fd uintptr) {
		n, err = unix.IoctlGetInt(int(fd), unix.TIOCINQ)
	})
	if cerr != nil || err != nil {
		return 0
	}
	return n
}

// readNow reads without waiting and without regard to the read deadline (which has expired
// when the stream was cut off); 0 when nothing is there.
func readNow(f *os.File, b []byte) int {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	_ = rc.Control(func(fd uintptr) {
		for {
			n, err = unix.Read(int(fd), b)
			if err != unix.EINTR {
				break
			}
		}
	})
	if err != nil {
		return 0
	}
	return n
}

// setNonblock makes f's descriptor non-blocking again, so reads wait in the poller and
// respect deadlines.
func setNonblock(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.SetNonblock(int(fd), true) }); err != nil {
		return err
	}
	return serr
}

// setWinsize sets a terminal's size without f.Fd() (which would make f blocking again).
func setWinsize(f *os.File, rows, cols int) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(rows), Col: uint16(cols)})
	}); err != nil {
		return err
	}
	return ierr
}

// supervise waits for the job to end (exit, deadline or ctx), makes sure nothing it started
// survives, and returns its exit. All output has been passed to the job's sink when it returns.
func (s *server) supervise(ctx context.Context, j *job) (wire.Exit, error) {
	var wg sync.WaitGroup
	for i, f := range j.outs {
		wg.Add(1)
		go pump(f, i, j.out, &wg)
	}
	if j.pidf != nil {
		go s.spawn.watchExit(j.pid, j.pidf)
	}
	// A closed channel, not a timer's one-shot one: the deadline is waited on twice.
	expired := make(chan struct{})
	j.mu.Lock()
	timeout := j.spec.timeout
	if !j.deadlineAt.IsZero() {
		timeout = time.Until(j.deadlineAt)
	}
	timer := time.AfterFunc(timeout, func() { close(expired) })
	j.deadline = timer
	j.mu.Unlock()
	defer timer.Stop()
	var (
		ws        syscall.WaitStatus
		timedOut  bool
		cancelled bool
		errs      []error
	)
	select {
	case ws = <-j.exited:
	case <-expired:
		timedOut = true
		errs = append(errs, j.group.kill())
		ws = <-j.exited
	case <-ctx.Done():
		cancelled = true
		errs = append(errs, j.group.kill())
		ws = <-j.exited
	}
	ws = j.group.exitStatus(ws)
	end := time.Now()
	j.reaped()
	// The exec owns everything it started: what outlives the main process dies with it
	// (exitFirst: is sent SIGKILL now and confirmed gone after the report).
	if j.spec.exitFirst && !timedOut && !cancelled {
		var err error
		j.rest, err = j.group.release(j.outputHolders())
		errs = append(errs, err)
	} else {
		errs = append(errs, j.group.finish())
	}
	j.closeStdin()
	pumpsDone := make(chan struct{})
	go func() { wg.Wait(); close(pumpsDone) }()
	// Output ends at EOF, which anyone holding a write end can postpone: a process of another
	// exec handed this one's stdout (SCM_RIGHTS), or, with only a process group, a setsid'd
	// escapee. With a cgroup everything this exec started is dead by now, so what is still
	// to come gets a short grace; with a process group the escapee may be this exec's own and
	// gets until the deadline. Never longer than the deadline or the caller.
	var grace <-chan time.Time
	if j.group.kind != scopePgrp {
		t := time.NewTimer(outputGrace)
		defer t.Stop()
		grace = t.C
	}
	select {
	case <-pumpsDone:
	case <-grace:
	case <-expired:
	case <-ctx.Done():
	}
	j.stopPumps()
	<-pumpsDone
	j.closeIO()
	ex := wire.Exit{TimedOut: timedOut, Cancelled: cancelled, DurationMs: end.Sub(j.started).Milliseconds(), Truncated: j.out.wasTruncated()}
	switch {
	case ws.Exited():
		ex.ExitCode = ws.ExitStatus()
	case ws.Signaled():
		ex.ExitCode = -1
		ex.Signal = unix.SignalName(ws.Signal())
	default:
		ex.ExitCode = -1
	}
	// Any process of the exec, not only the main one: `sh -c 'big; echo $?'` survives its
	// child's OOM kill and exits 0, and that is still an exec the OOM killer cut short.
	ex.OOMKilled = j.group.oomKilled
	if err := errors.Join(errs...); err != nil {
		// Something may have survived: never report a clean outcome.
		return ex, fmt.Errorf("%w: exec %s ended but its processes could not be confirmed gone: %v", sbtypes.ErrOutcomeUnknown, j.id, err)
	}
	return ex, nil
}

// feedStdin copies r into the job's stdin and ends it at EOF. It returns r's error (nil at EOF).
func (j *job) feedStdin(r io.Reader) error {
	if err := j.copyStdin(r); err != nil {
		return err
	}
	j.endStdin()
	return nil
}

// copyStdin copies r into the job's stdin until r ends. Once the command has gone or closed its
// stdin the rest of r is read and dropped, as a pipe would.
func (j *job) copyStdin(r io.Reader) error {
	buf := make([]byte, 32<<10)
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			// Not written under stdinMu: a command that never reads would block the write,
			// and closeStdin must still be able to close the pipe (which unblocks it).
			j.stdinMu.Lock()
			w := j.stdin
			j.stdinMu.Unlock()
			var werr error
			if w != nil {
				_, werr = w.Write(buf[:n])
			}
			if w == nil || werr != nil {
				_, err := io.Copy(io.Discard, r)
				return err
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

// endStdin closes the command's stdin; on a terminal, where there is nothing to close, it
// types VEOF (^D) as a user would.
func (j *job) endStdin() {
	if j.spec.tty {
		j.stdinMu.Lock()
		w := j.stdin
		j.stdinMu.Unlock()
		if w != nil {
			_, _ = w.Write([]byte{4})
		}
		return
	}
	j.closeStdin()
}
