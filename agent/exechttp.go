//go:build linux

package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

// frameWriter writes frames to an HTTP response as they are produced. Writes are synchronous:
// a client that stops reading blocks the pumps, which stop draining the pipes, which blocks the
// command's writes. Nothing is buffered without bound.
type frameWriter struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	rc      *http.ResponseController
	seq     uint64
	buf     []byte
	err     error
	gone    func() // called once when the client is found gone
	flushed bool   // the response head has gone out
	ended   bool   // terminal was called: the head timer must no longer touch the response
}

// headDelay is how long the response head (200, X-Airlock-Exec-Id) may wait for the first
// output or the terminal frame to travel with. A short command's whole answer is then one write
// (and one wakeup of the client) instead of three; a longer one's head goes out after this.
const headDelay = 3 * time.Millisecond

// flushHead sends the response head if nothing has yet.
func (f *frameWriter) flushHead() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil || f.flushed || f.ended {
		return
	}
	f.write(nil, true)
}

func (f *frameWriter) output(typ byte, data []byte, more bool) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return false
	}
	f.seq++
	f.buf = wire.AppendOutput(f.buf[:0], typ, f.seq, data)
	f.write(f.buf, !more)
	return f.err == nil
}

// terminal writes the terminal frame. Unflushed unless asked: the handler returns right after,
// and the server then writes it together with the end of the body, so the client sees both
// in one read (and, having read the body to its end, keeps the connection).
func (f *frameWriter) terminal(typ byte, v any, flush bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ended = true
	if f.err != nil {
		return
	}
	b, err := json.Marshal(v)
	if err != nil {
		f.err = err
		return
	}
	f.buf = append(f.buf[:0], typ, 0, 0, 0, 0)
	f.buf[1], f.buf[2], f.buf[3], f.buf[4] = byte(len(b)>>24), byte(len(b)>>16), byte(len(b)>>8), byte(len(b))
	f.buf = append(f.buf, b...)
	f.write(f.buf, flush)
}

func (f *frameWriter) write(b []byte, flush bool) {
	var err error
	if len(b) > 0 {
		_, err = f.w.Write(b)
	}
	if err == nil && flush {
		err = f.rc.Flush()
		f.flushed = true
	}
	if err != nil {
		f.err = err
		if f.gone != nil {
			go f.gone()
		}
	}
}

// interruptBody ends a read of the request body still blocked once the handler is done with it
// (done is closed when the reader returns; nil: no reader): the body must not be read after the
// handler returns. That leaves the connection unusable: abort reports it, and the caller closes
// the connection after its terminal frame (http.ErrAbortHandler) instead of keeping it alive.
func interruptBody(rc *http.ResponseController, done <-chan struct{}) (abort bool) {
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
	}
	_ = rc.SetReadDeadline(time.Now())
	<-done
	return true
}

// readHeader decodes a streaming request's JSON header (bounded, unknown fields refused) into v
// and returns the rest of the body: the bytes after the header.
func readHeader(r *http.Request, v any) (io.Reader, error) {
	if err := onlyQuery(r); err != nil {
		return nil, err
	}
	hdr := &limitedReader{r: r.Body, n: maxRequestHeader}
	dec := json.NewDecoder(hdr)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return nil, jsonError(err)
	}
	hdr.n = -1
	return io.MultiReader(dec.Buffered(), r.Body), nil
}

// execHandler serves POST /v1/exec: JSON header, then (stdin: true) stdin bytes in the same
// body; the response is a frame stream ending in exactly one exit or error frame.
func (s *server) execHandler(w http.ResponseWriter, r *http.Request) {
	var req wire.ExecRequest
	rest, err := readHeader(r, &req)
	if err != nil {
		writeError(w, err)
		return
	}
	if !req.Stdin {
		var one [1]byte
		if n, _ := io.ReadFull(rest, one[:]); n > 0 {
			writeError(w, fmt.Errorf("%w: request body continues after the JSON header but stdin is false", sbtypes.ErrInvalid))
			return
		}
	}
	sp, err := s.validate(&req)
	if err != nil {
		writeError(w, err)
		return
	}
	if sp.exitFirst {
		// An exec's answer is its caller's proof that nothing of it runs on.
		writeError(w, fmt.Errorf("%w: exitFirst: only a background process (POST /v1/processes) may report its exit first", sbtypes.ErrInvalid))
		return
	}
	rc := http.NewResponseController(w)
	if req.Stdin {
		if err := rc.EnableFullDuplex(); err != nil {
			writeError(w, fmt.Errorf("%w: stdin needs a full-duplex connection: %v", sbtypes.ErrUnsupported, err))
			return
		}
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	fw := &frameWriter{w: w, rc: rc, gone: cancel}
	j, err := s.start(sp, fw)
	if err != nil {
		writeError(w, err)
		return
	}
	// Runs once the terminal frame is written: the next exec's cgroup is made off its path.
	defer s.prepareNext()
	// A client that stops reading may hold this handler only until the deadline plus a grace.
	_ = rc.SetWriteDeadline(j.started.Add(sp.timeout + drainGrace))
	w.Header().Set("Content-Type", wire.ContentTypeFrames)
	w.Header().Set("X-Airlock-Exec-Id", j.id)
	w.WriteHeader(http.StatusOK)
	head := time.AfterFunc(headDelay, fw.flushHead)
	defer head.Stop()
	var stdinDone chan struct{}
	if req.Stdin {
		stdinDone = make(chan struct{})
		go func() {
			defer close(stdinDone)
			if err := j.feedStdin(rest); err != nil {
				// Not EOF: the client went away mid-body (or the exec is over, see below).
				cancel()
			}
		}()
	}
	ex, err := s.supervise(ctx, j)
	abort := interruptBody(rc, stdinDone)
	defer func() {
		if abort {
			panic(http.ErrAbortHandler)
		}
		// Deadlines belong to this exchange, not to the kept-alive connection.
		_ = rc.SetWriteDeadline(time.Time{})
	}()
	// An aborted exchange is not finished by the server: flush the terminal frame here.
	if err != nil {
		code, _ := wire.CodeOf(err)
		fw.terminal(wire.FrameError, wire.Error{Code: code, Message: err.Error()}, abort)
		s.log.Error("exec", "id", j.id, "err", err)
		return
	}
	fw.terminal(wire.FrameExit, ex, abort)
}

// limitedReader fails past n bytes (n < 0: unlimited), bounding the JSON header of a body
// whose remainder is stdin.
type limitedReader struct {
	r io.Reader
	n int64
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n < 0 {
		return l.r.Read(p)
	}
	if l.n == 0 {
		return 0, fmt.Errorf("%w: exec request header exceeds %d bytes", sbtypes.ErrTooLarge, maxRequestHeader)
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	return n, err
}
