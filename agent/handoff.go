//go:build linux

package agent

import (
	"fmt"
	"net/http"
	"time"

	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

// handoffHandler serves POST /v1/processes/{id}/handoff: work handed to a background process
// that waits for it on its stdin (a pre-started interpreter), kept as an exec is. The JSON
// header (wire.HandoffRequest) gives the work's deadline and caps, which replace the
// process's; the rest of the body is written to its stdin, closed when the body ends (unless
// More: then by a later POST .../stdin?close=true). The
// answer is a frame stream, as an exec's, of the output from the handoff on, ending with the
// process's exit (its duration counted from the handoff). The caller going away kills the
// process, as an exec's does; a caller that stays but stops reading stretches nothing: the
// deadline is kept here.
func (s *server) handoffHandler(w http.ResponseWriter, r *http.Request, p *proc) {
	var req wire.HandoffRequest
	input, err := readHeader(r, &req)
	if err != nil {
		writeError(w, err)
		return
	}
	timeout, err := s.deadline(req.TimeoutMs)
	if err != nil {
		writeError(w, err)
		return
	}
	maxOut, maxErr, err := s.outputCaps(req.MaxStdout, req.MaxStderr)
	if err != nil {
		writeError(w, err)
		return
	}
	switch {
	case !p.j.spec.stdin:
		writeError(w, fmt.Errorf("%w: process %s was started with stdin false: nothing waits for work on its stdin", sbtypes.ErrConflict, p.j.id))
		return
	case p.j.spec.tty:
		writeError(w, fmt.Errorf("%w: process %s has a terminal: work is handed through a pipe, and a terminal's output has one stream", sbtypes.ErrConflict, p.j.id))
		return
	}
	rc := http.NewResponseController(w)
	if err := rc.EnableFullDuplex(); err != nil {
		writeError(w, fmt.Errorf("%w: a handoff needs a full-duplex connection: %v", sbtypes.ErrUnsupported, err))
		return
	}
	// One stdin writer at a time: the work's input goes in before any appended to it (More),
	// which a client sends once it has this answer.
	p.stdinMu.Lock()
	fw := &frameWriter{w: w, rc: rc, gone: p.cancel}
	handed := time.Now()
	if err := p.j.handOver(timeout, fw, [2]int64{maxOut, maxErr}); err != nil {
		p.stdinMu.Unlock()
		writeError(w, err)
		return
	}
	// A client that stops reading holds this handler only until the deadline plus a grace.
	_ = rc.SetWriteDeadline(handed.Add(timeout + drainGrace))
	w.Header().Set("Content-Type", wire.ContentTypeFrames)
	w.Header().Set("X-Airlock-Exec-Id", p.j.id)
	w.WriteHeader(http.StatusOK)
	head := time.AfterFunc(headDelay, fw.flushHead)
	defer head.Stop()
	stdinDone := make(chan struct{})
	go func() {
		defer close(stdinDone)
		defer p.stdinMu.Unlock()
		if err := p.j.copyStdin(input); err != nil {
			p.cancel() // not EOF: the client went away mid-body
			return
		}
		if !req.More {
			p.j.endStdin()
		}
	}()
	select {
	case <-p.done:
	case <-r.Context().Done():
		p.cancel() // the client went away: the work dies with it, as an exec does
		<-p.done
	}
	abort := interruptBody(rc, stdinDone)
	defer func() {
		if abort {
			panic(http.ErrAbortHandler)
		}
		_ = rc.SetWriteDeadline(time.Time{})
		_ = rc.SetReadDeadline(time.Time{})
	}()
	if p.err != nil {
		code, _ := wire.CodeOf(p.err)
		fw.terminal(wire.FrameError, wire.Error{Code: code, Message: p.err.Error()}, abort)
		return
	}
	ex := p.exit
	ex.DurationMs = max(ex.DurationMs-handed.Sub(p.j.started).Milliseconds(), 0)
	fw.terminal(wire.FrameExit, ex, abort)
}
