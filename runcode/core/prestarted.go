package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

// Pre-started interpreters (docs/pool.md#pre-started-interpreters): runcode's Prestart starts,
// per language, the command a cold run would exec, blocked in a loader reading stdin until it
// gets one frame,
//
//	"<code bytes> <stdin: 0|1>\n" code [stdin...]
//
// after which it runs the code as the cold command would. This side hands a run's code to such
// an interpreter and collects its output and exit; the loader's ready marker is the output
// frame numbered Waiting.ReadySeq, and the program's output follows it.

// processAgent is the background-process part of agent/client.Client that a run uses, which
// the local backend's agents provide.
type processAgent interface {
	Attach(ctx context.Context, id string, fromStart bool) (*client.Stream, error)
	WriteStdin(ctx context.Context, id string, r io.Reader, closeAfter bool) error
	WriteStdinDeadline(ctx context.Context, id string, r io.Reader, closeAfter bool, d time.Duration) error
	RemoveProcess(ctx context.Context, id string) error
	Signal(ctx context.Context, id, signal string) error
	Wait(ctx context.Context, id string) (sbtypes.ExecResult, error)
}

// Prestarted is what runcode's Prestart leaves in a sandbox: one waiting interpreter per
// language, and the client Prestart used, kept with its connections open for the run (a new
// connection is a noticeable part of a run this short). It owns that client: Close closes it.
type Prestarted struct {
	agent sbtypes.Agent
	procs map[Language]*waiting
	// maxOutput is the interpreters' output cap (PrestartOptions.MaxOutputBytes).
	maxOutput int64
}

// Waiting is one interpreter blocked in its loader: its process id in the agent, and the
// sequence number of its ready marker's output frame.
type Waiting struct {
	ID       string
	ReadySeq uint64
}

// NewPrestarted is what was pre-started in a sandbox: procs' interpreters, started with output
// cap maxOutput per stream, reached through agent, which the result owns from then on.
func NewPrestarted(agent sbtypes.Agent, maxOutput int64, procs map[Language]Waiting) *Prestarted {
	pre := &Prestarted{agent: agent, procs: make(map[Language]*waiting, len(procs)), maxOutput: maxOutput}
	for l, w := range procs {
		pre.procs[l] = &waiting{id: w.ID, readySeq: w.ReadySeq}
	}
	return pre
}

// Close releases the client's connections (the pool calls it for a sandbox it drops unused).
func (pre *Prestarted) Close() error {
	if pre.agent == nil {
		return nil
	}
	return pre.agent.Close()
}

// Agent is the client pre owns, to run with (RunIn's agent).
func (pre *Prestarted) Agent() sbtypes.Agent { return pre.agent }

// waiting is one interpreter blocked in its loader.
type waiting struct {
	id string
	// readySeq is the sequence number of the marker frame; program output comes after it.
	readySeq uint64
}

// prestartedState is Prestarted without its client: what a process that did not start the
// interpreters needs to hand one its code (the agent holds them by process id).
type prestartedState struct {
	MaxOutput int64                   `json:"maxOutput"`
	Procs     map[Language]waitingRef `json:"procs"`
}

type waitingRef struct {
	ID       string `json:"id"`
	ReadySeq uint64 `json:"readySeq"`
}

// State encodes pre without its client so that another process can use the waiting
// interpreters (ResumePrestarted): a local parked sandbox is prestarted by the process that parks it
// and run by the one that claims it.
func (pre *Prestarted) State() ([]byte, error) {
	st := prestartedState{MaxOutput: pre.maxOutput, Procs: make(map[Language]waitingRef, len(pre.procs))}
	for l, w := range pre.procs {
		st.Procs[l] = waitingRef{ID: w.id, ReadySeq: w.readySeq}
	}
	return json.Marshal(st)
}

// ResumePrestarted is the inverse of State over a new client of the same sandbox's agent. The
// result owns agent from then on; on an error the caller still does.
func ResumePrestarted(agent sbtypes.Agent, state []byte) (*Prestarted, error) {
	var st prestartedState
	if err := json.Unmarshal(state, &st); err != nil {
		return nil, fmt.Errorf("%w: prestart state: %v", sbtypes.ErrInvalid, err)
	}
	if st.MaxOutput <= 0 || len(st.Procs) == 0 {
		return nil, fmt.Errorf("%w: prestart state: no interpreter or no output cap", sbtypes.ErrInvalid)
	}
	pre := &Prestarted{agent: agent, procs: make(map[Language]*waiting, len(st.Procs)), maxOutput: st.MaxOutput}
	for l, w := range st.Procs {
		if !CanPrestart(l) || w.ID == "" {
			return nil, fmt.Errorf("%w: prestart state: language %q, process %q", sbtypes.ErrInvalid, l, w.ID)
		}
		pre.procs[l] = &waiting{id: w.ID, readySeq: w.ReadySeq}
	}
	return pre, nil
}

// CanPrestart reports whether l's interpreter can wait for its code in a loader (python, node).
func CanPrestart(l Language) bool { return l == Python || l == Node }

// take returns the waiting interpreter for l (nil: none) and removes every other one, so the
// run's code is alone in its sandbox, whatever it runs in.
func (pre *Prestarted) take(ctx context.Context, pa processAgent, l Language, usable bool) (*waiting, error) {
	if pre == nil {
		return nil, nil
	}
	var w *waiting
	var others []string
	for lang, x := range pre.procs {
		if lang == l && usable {
			w = x
			continue
		}
		others = append(others, x.id)
	}
	if len(others) == 0 {
		return w, nil
	}
	errs := make([]error, len(others))
	var wg sync.WaitGroup
	for i, id := range others {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// SIGKILL to the interpreter (nothing else runs in its cgroup: it never got code),
			// then wait until the agent has seen its cgroup empty: much faster than a removal's
			// freeze-and-kill of a many-threaded node.
			err := pa.Signal(ctx, id, "SIGKILL")
			if err == nil || errors.Is(err, sbtypes.ErrConflict) {
				_, err = pa.Wait(ctx, id)
			}
			if err != nil && !errors.Is(err, sbtypes.ErrNotFound) {
				errs[i] = fmt.Errorf("removing a pre-started interpreter: %w", err)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return w, nil
}

// errInterpreterGone: the waiting interpreter had exited before it got the code; nothing of
// the run has happened yet.
var errInterpreterGone = errors.New("the pre-started interpreter had exited")

// runPrestarted hands req's code (and stdin) to the waiting interpreter w and collects its
// output and exit as Exec would. The run's deadline goes with the code and is the agent's to
// keep, as an exec's is: a caller that dies (SIGKILL, a closed terminal) cannot stretch it.
// errInterpreterGone means the code never reached it (the caller runs it cold instead).
func runPrestarted(ctx context.Context, pa processAgent, w *waiting, req Request, stdin io.Reader, opts Options, log *slog.Logger) (Result, error) {
	timeout := time.Duration(req.TimeoutSeconds) * time.Second
	start := time.Now()
	c := newCapture(opts)
	stdout, stderr := c.stdout, c.stderr

	// Streams and stdin outlive a cancelled caller long enough to be wound down here.
	bg, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	type outcome struct {
		res  *sbtypes.ExecResult
		gap  bool
		err  error
		gone bool // ended before any output of the program
	}
	done := make(chan outcome, 1)
	collect := func() {
		st, err := pa.Attach(bg, w.id, true)
		if err != nil {
			done <- outcome{err: fmt.Errorf("attaching to the interpreter: %w", err)}
			return
		}
		defer st.Close()
		last := w.readySeq
		var o outcome
		for {
			ev, err := st.Next()
			if err != nil {
				o.err = err
				done <- o
				return
			}
			if ev.Result != nil {
				o.res = ev.Result
				done <- o
				return
			}
			f := ev.Output
			if f.Seq <= w.readySeq {
				continue // the loader's marker
			}
			if f.Seq != last+1 {
				o.gap = true // the agent's ring dropped frames this reader had not read
			}
			last = f.Seq
			dst := stdout
			if f.Stream == sbtypes.Stderr {
				dst = stderr
			}
			if _, err := dst.Write(f.Data); err != nil {
				o.err = fmt.Errorf("write %s: %w", f.Stream, err)
				done <- o
				return
			}
		}
	}

	kill := func() error {
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), terminateTimeout)
		defer cancel()
		if err := pa.RemoveProcess(kctx, w.id); err != nil && !errors.Is(err, sbtypes.ErrNotFound) {
			return err
		}
		return nil
	}
	// Stdin already in memory goes in the same request as the code; a stream follows in a
	// second one once the code is in (and is left unread if the interpreter is gone). The
	// first request's body is one string: a body of known length, in memory, is written
	// before the answer is read (agent/client's transport), not by a goroutine of its own.
	var first strings.Builder
	fmt.Fprintf(&first, "%d %d\n", len(req.Code), boolDigit(stdin != nil))
	first.WriteString(req.Code)
	sr, stdinIsString := stdin.(*strings.Reader)
	closeFirst := stdin == nil || stdinIsString
	var pos int64
	if stdinIsString {
		pos, _ = sr.Seek(0, io.SeekCurrent)
		if _, err := io.Copy(&first, sr); err != nil {
			return Result{}, fmt.Errorf("reading stdin: %w", err)
		}
	}
	// The code first, then the output: the interpreter starts on the code while the attach
	// request is made, instead of the two requests competing for the agent on the way to the
	// program's first line. The agent keeps a process's output from its start (at least 1 MiB),
	// so nothing printed before the attach is lost.
	if err := pa.WriteStdinDeadline(bg, w.id, strings.NewReader(first.String()), closeFirst, timeout); err != nil {
		// ErrInvalid: an agent older than the deadline it is handed (a sandbox parked before an
		// upgrade) refuses the request before reading it: the code never got there either, and
		// the cold run's exec has its deadline kept by any agent.
		if errors.Is(err, sbtypes.ErrConflict) || errors.Is(err, sbtypes.ErrNotFound) || errors.Is(err, sbtypes.ErrInvalid) {
			// It had exited (or the agent no longer holds it): the code never got there.
			_ = kill()
			if stdinIsString {
				_, _ = sr.Seek(pos, io.SeekStart) // the cold run reads it from the start
			}
			return Result{}, errInterpreterGone
		}
		return Result{}, errors.Join(fmt.Errorf("handing the code to the interpreter: %w", err), kill())
	}
	go collect()
	var stdinDone chan struct{}
	if !closeFirst {
		stdinDone = make(chan struct{})
		go func() {
			defer close(stdinDone)
			// Errors here are the program's business (it may exit without reading).
			_ = pa.WriteStdin(bg, w.id, stdin, true)
		}()
	}
	var (
		o      outcome
		ctxErr error
	)
	select {
	case o = <-done:
	case <-ctx.Done():
		ctxErr = ctx.Err()
		kerr := kill()
		stop()
		<-done
		if stdinDone != nil {
			<-stdinDone
		}
		return Result{}, errors.Join(ctxErr, kerr)
	}
	end := time.Now()
	stop()
	if stdinDone != nil {
		<-stdinDone
	}
	if o.err != nil {
		return Result{}, errors.Join(o.err, kill())
	}
	ex := *o.res
	if o.gap {
		log.Warn("run_code: output of a pre-started interpreter was dropped by the agent's buffer before it was read; result marked truncated", "process", w.id)
	}
	res := c.result(ex, ex.TimedOut, o.gap)
	res.DurationMs = end.Sub(start).Milliseconds()
	res.TimeoutSeconds = req.TimeoutSeconds
	return res, nil
}

func boolDigit(b bool) int {
	if b {
		return 1
	}
	return 0
}

// usable reports whether a run may use a waiting interpreter: its output cap fits the one the
// interpreter was started with.
func (pre *Prestarted) usable(opts Options) bool {
	return outputCap(opts) <= pre.maxOutput
}
