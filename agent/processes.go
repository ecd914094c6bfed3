//go:build linux

package agent

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
	"github.com/airlock-sandbox/airlock/token"
)

// processes are background jobs: started, then attached to, fed and signalled by later calls.
type processes struct {
	s    *server
	mu   sync.Mutex
	byID map[string]*proc
	wg   sync.WaitGroup
}

type proc struct {
	j       *job
	argv    []string
	started time.Time
	out     *ring
	cancel  context.CancelFunc
	done    chan struct{}
	stdinMu sync.Mutex // one stdin writer at a time, so two calls' bytes never interleave
	exit    wire.Exit  // set before done is closed
	err     error
}

func newProcesses(s *server) *processes {
	return &processes{s: s, byID: map[string]*proc{}}
}

func (p *proc) describe() wire.Process {
	d := wire.Process{ID: p.j.id, Argv: p.argv, TTY: p.j.spec.tty, State: wire.StateRunning, StartedAt: p.started.UTC().Format(time.RFC3339Nano)}
	select {
	case <-p.done:
		d.State = wire.StateExited
		ex := p.exit
		d.Exit = &ex
	default:
	}
	return d
}

// killAll kills every running process (the agent is stopping).
func (ps *processes) killAll() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for _, p := range ps.byID {
		p.cancel()
	}
}

func (ps *processes) wait() { ps.wg.Wait() }

func (ps *processes) get(id string) (*proc, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p, ok := ps.byID[id]
	if !ok {
		return nil, fmt.Errorf("%w: no background process %q", sbtypes.ErrNotFound, id)
	}
	return p, nil
}

// admit makes room for one more process, forgetting the oldest exited one if needed.
func (ps *processes) admit() error {
	if len(ps.byID) < maxProcesses {
		return nil
	}
	var oldest *proc
	for _, p := range ps.byID {
		select {
		case <-p.done:
			if oldest == nil || p.started.Before(oldest.started) {
				oldest = p
			}
		default:
		}
	}
	if oldest == nil {
		return fmt.Errorf("%w: %d background processes are running, the most this agent keeps", sbtypes.ErrConflict, maxProcesses)
	}
	delete(ps.byID, oldest.j.id)
	return nil
}

func (s *server) processRoutes(mux *http.ServeMux) {
	x := func(h http.HandlerFunc) http.HandlerFunc { return s.authed(token.Execute, h) }
	mux.HandleFunc("POST /v1/processes", x(s.startProcess))
	mux.HandleFunc("GET /v1/processes", x(s.listProcesses))
	mux.HandleFunc("GET /v1/processes/{id}", x(s.procHandler(s.getProcess)))
	mux.HandleFunc("DELETE /v1/processes/{id}", x(s.procHandler(s.deleteProcess)))
	mux.HandleFunc("GET /v1/processes/{id}/output", x(s.procHandler(s.attach)))
	mux.HandleFunc("POST /v1/processes/{id}/stdin", x(s.procHandler(s.processStdin)))
	mux.HandleFunc("POST /v1/processes/{id}/signal", x(s.procHandler(s.signalProcess)))
	mux.HandleFunc("GET /v1/processes/{id}/wait", x(s.procHandler(s.waitProcess)))
	mux.HandleFunc("POST /v1/processes/{id}/resize", x(s.procHandler(s.resizeProcess)))
}

func (s *server) procHandler(h func(http.ResponseWriter, *http.Request, *proc)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, err := s.procs.get(r.PathValue("id"))
		if err != nil {
			writeError(w, err)
			return
		}
		h(w, r, p)
	}
}

func (s *server) startProcess(w http.ResponseWriter, r *http.Request) {
	var req wire.ExecRequest
	if err := readRequest(r, &req); err != nil {
		writeError(w, err)
		return
	}
	sp, err := s.validate(&req)
	if err != nil {
		writeError(w, err)
		return
	}
	ps := s.procs
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if s.life.Err() != nil {
		writeError(w, fmt.Errorf("%w: the agent is stopping", sbtypes.ErrRefused))
		return
	}
	if err := ps.admit(); err != nil {
		writeError(w, err)
		return
	}
	// The ring holds everything the caps let through, so a reader that falls behind loses
	// nothing a foreground exec would deliver; the memory is the caller's choice and charged
	// to the sandbox's own cgroup.
	out := newRing(int(max(int64(ringBufferBytes), sp.maxStdout+sp.maxStderr)))
	j, err := s.start(sp, out)
	if err != nil {
		writeError(w, err)
		return
	}
	ctx, cancel := context.WithCancel(s.life)
	p := &proc{j: j, argv: sp.argv, started: j.started, out: out, cancel: cancel, done: make(chan struct{})}
	ps.byID[j.id] = p
	ps.wg.Add(1)
	running := s.act.begin() // a running process keeps the agent from going idle
	go func() {
		defer ps.wg.Done()
		defer running()
		defer cancel()
		p.exit, p.err = s.supervise(ctx, j)
		p.out.close()
		close(p.done)
		if j.rest != nil {
			// The attach waiting for done writes the exit first (the agent runs on one
			// processor: this goroutine would otherwise keep it through rest's first calls).
			runtime.Gosched()
			if err := j.rest(); err != nil {
				s.log.Error("background process: removing what it left after its exit was reported", "id", j.id, "err", err)
			}
		}
		s.prepareNext()
	}()
	writeJSON(w, http.StatusCreated, p.describe())
}

func (s *server) listProcesses(w http.ResponseWriter, r *http.Request) {
	if err := onlyQuery(r); err != nil {
		writeError(w, err)
		return
	}
	s.procs.mu.Lock()
	list := make([]wire.Process, 0, len(s.procs.byID))
	for _, p := range s.procs.byID {
		list = append(list, p.describe())
	}
	s.procs.mu.Unlock()
	slices.SortFunc(list, func(a, b wire.Process) int { return strings.Compare(a.StartedAt+a.ID, b.StartedAt+b.ID) })
	writeJSON(w, http.StatusOK, list)
}

func (s *server) getProcess(w http.ResponseWriter, r *http.Request, p *proc) {
	if err := onlyQuery(r); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, p.describe())
}

// deleteProcess kills a running process and forgets it.
func (s *server) deleteProcess(w http.ResponseWriter, r *http.Request, p *proc) {
	if err := onlyQuery(r); err != nil {
		writeError(w, err)
		return
	}
	p.cancel()
	<-p.done
	s.procs.mu.Lock()
	delete(s.procs.byID, p.j.id)
	s.procs.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// attach streams the process's output from the oldest frame still held (from=start) or from
// now (from=live), then its terminal frame. A slow reader never blocks the process: it skips
// the frames the ring dropped (visible as a gap in seq). follow=false sends only what is held
// now and ends there, with the terminal frame only if the process has exited: a look at the
// output of a process that runs on (a server an MCP agent started).
func (s *server) attach(w http.ResponseWriter, r *http.Request, p *proc) {
	if err := onlyQuery(r, "from", "follow"); err != nil {
		writeError(w, err)
		return
	}
	follow, err := queryBool(r, "follow", true)
	if err != nil {
		writeError(w, err)
		return
	}
	var cursor uint64
	switch from := r.URL.Query().Get("from"); from {
	case "", "start":
	case "live":
		cursor = p.out.last()
	default:
		writeError(w, fmt.Errorf("%w: query parameter from=%q: want start or live", sbtypes.ErrInvalid, from))
		return
	}
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", wire.ContentTypeFrames)
	w.Header().Set("X-Airlock-Exec-Id", p.j.id)
	w.WriteHeader(http.StatusOK)
	var buf []byte
	for {
		frames, notify, closed := p.out.since(cursor)
		buf = buf[:0]
		for _, f := range frames {
			buf = wire.AppendOutput(buf, f.typ, f.seq, f.data)
			cursor = f.seq
		}
		if len(buf) > 0 {
			if _, err := w.Write(buf); err != nil {
				return
			}
		}
		if len(frames) == 0 && closed {
			<-p.done
			if p.err != nil {
				code, _ := wire.CodeOf(p.err)
				_ = wire.WriteJSONFrame(w, wire.FrameError, wire.Error{Code: code, Message: p.err.Error()})
			} else {
				_ = wire.WriteJSONFrame(w, wire.FrameExit, p.exit)
			}
			// Not flushed: returning, the server writes it with the end of the body in one
			// write, so the client reads both at once and keeps the connection.
			return
		}
		if len(frames) == 0 && !follow {
			return // what was held is sent; the process runs on
		}
		if err := rc.Flush(); err != nil {
			return
		}
		if len(frames) == 0 {
			select {
			case <-notify:
			case <-r.Context().Done():
				return
			}
		}
	}
}

// processStdin appends the body to the process's stdin; close=true then closes it (on a
// terminal: sends VEOF). Work with its own deadline and caps goes through a handoff instead
// (handoff.go).
func (s *server) processStdin(w http.ResponseWriter, r *http.Request, p *proc) {
	if err := onlyQuery(r, "close"); err != nil {
		writeError(w, err)
		return
	}
	closeAfter, err := queryBool(r, "close", false)
	if err != nil {
		writeError(w, err)
		return
	}
	if !p.j.spec.stdin {
		writeError(w, fmt.Errorf("%w: process %s was started with stdin false", sbtypes.ErrConflict, p.j.id))
		return
	}
	select {
	case <-p.done:
		writeError(w, fmt.Errorf("%w: process %s has exited", sbtypes.ErrConflict, p.j.id))
		return
	default:
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if err := p.j.copyStdin(r.Body); err != nil {
		writeError(w, err)
		return
	}
	if closeAfter {
		p.j.endStdin()
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) signalProcess(w http.ResponseWriter, r *http.Request, p *proc) {
	var req wire.SignalRequest
	if err := readRequest(r, &req); err != nil {
		writeError(w, err)
		return
	}
	name := strings.ToUpper(req.Signal)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	sig := unix.SignalNum(name)
	if sig == 0 {
		writeError(w, fmt.Errorf("%w: signal %q is not a known signal name", sbtypes.ErrInvalid, req.Signal))
		return
	}
	select {
	case <-p.done:
		writeError(w, fmt.Errorf("%w: process %s has exited", sbtypes.ErrConflict, p.j.id))
		return
	default:
	}
	if err := p.j.signal(sig); err != nil {
		if err == syscall.ESRCH {
			writeError(w, fmt.Errorf("%w: process %s has exited", sbtypes.ErrConflict, p.j.id))
			return
		}
		writeError(w, fmt.Errorf("%w: signal %s: %v", classify(err), name, err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) waitProcess(w http.ResponseWriter, r *http.Request, p *proc) {
	if err := onlyQuery(r); err != nil {
		writeError(w, err)
		return
	}
	select {
	case <-p.done:
	case <-r.Context().Done():
		return
	}
	if p.err != nil {
		writeError(w, p.err)
		return
	}
	writeJSON(w, http.StatusOK, p.exit)
}

func (s *server) resizeProcess(w http.ResponseWriter, r *http.Request, p *proc) {
	var req wire.ResizeRequest
	if err := readRequest(r, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.Rows <= 0 || req.Rows > maxTermSize || req.Cols <= 0 || req.Cols > maxTermSize {
		writeError(w, fmt.Errorf("%w: rows/cols %dx%d is outside 1..%d", sbtypes.ErrInvalid, req.Rows, req.Cols, maxTermSize))
		return
	}
	if p.j.ptm == nil {
		writeError(w, fmt.Errorf("%w: process %s has no terminal (started with tty false)", sbtypes.ErrConflict, p.j.id))
		return
	}
	select {
	case <-p.done:
		writeError(w, fmt.Errorf("%w: process %s has exited", sbtypes.ErrConflict, p.j.id))
		return
	default:
	}
	if err := setWinsize(p.j.ptm, req.Rows, req.Cols); err != nil {
		writeError(w, fmt.Errorf("%w: resize: %v", classify(err), err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// ring keeps a bounded tail of a process's output for attach, dropping the oldest frames.
type ring struct {
	mu     sync.Mutex
	limit  int
	size   int
	seq    uint64
	frames []ringFrame
	notify chan struct{}
	closed bool
}

type ringFrame struct {
	seq  uint64
	typ  byte
	data []byte
}

func newRing(limit int) *ring { return &ring{limit: limit, notify: make(chan struct{})} }

func (r *ring) output(typ byte, data []byte, _ bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	r.frames = append(r.frames, ringFrame{seq: r.seq, typ: typ, data: slices.Clone(data)})
	r.size += len(data)
	for r.size > r.limit && len(r.frames) > 1 {
		r.size -= len(r.frames[0].data)
		r.frames[0] = ringFrame{}
		r.frames = r.frames[1:]
	}
	close(r.notify)
	r.notify = make(chan struct{})
	return true
}

func (r *ring) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	close(r.notify)
	r.notify = make(chan struct{})
}

func (r *ring) last() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seq
}

// since returns the frames after seq, a channel closed at the next change, and whether the
// output is complete.
func (r *ring) since(seq uint64) ([]ringFrame, <-chan struct{}, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	i, _ := slices.BinarySearchFunc(r.frames, seq+1, func(f ringFrame, s uint64) int {
		switch {
		case f.seq < s:
			return -1
		case f.seq > s:
			return 1
		}
		return 0
	})
	return slices.Clone(r.frames[i:]), r.notify, r.closed
}
