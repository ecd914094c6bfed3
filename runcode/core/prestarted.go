package core

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
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
// an interpreter with the run's deadline and caps (the agent's handoff, kept by the agent as
// an exec's) and collects its output and exit.

// processAgent is the background-process part of agent/client.Client that a run uses, which
// the local backend's agents provide.
type processAgent interface {
	Handoff(ctx context.Context, id string, req client.HandoffRequest) (*client.Stream, error)
	Signal(ctx context.Context, id, signal string) error
	Wait(ctx context.Context, id string) (sbtypes.ExecResult, error)
}

// Prestarted is what runcode's Prestart leaves in a sandbox: one waiting interpreter per
// language, and the client Prestart used, kept with its connections open for the run (a new
// connection is a noticeable part of a run this short). It owns that client: Close closes it.
type Prestarted struct {
	agent sbtypes.Agent
	// procs are the waiting interpreters' process ids in the agent.
	procs map[Language]string
}

// NewPrestarted is what was pre-started in a sandbox: procs' interpreters (their process ids),
// reached through agent, which the result owns from then on.
func NewPrestarted(agent sbtypes.Agent, procs map[Language]string) *Prestarted {
	return &Prestarted{agent: agent, procs: maps.Clone(procs)}
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

// prestartedState is Prestarted without its client: what a process that did not start the
// interpreters needs to hand one its code (the agent holds them by process id).
type prestartedState struct {
	Procs map[Language]waitingRef `json:"procs"`
}

type waitingRef struct {
	ID string `json:"id"`
}

// State encodes pre without its client so that another process can use the waiting
// interpreters (ResumePrestarted): a local spare is prestarted by the process that parks it
// and run by the one that claims it.
func (pre *Prestarted) State() ([]byte, error) {
	st := prestartedState{Procs: make(map[Language]waitingRef, len(pre.procs))}
	for l, id := range pre.procs {
		st.Procs[l] = waitingRef{ID: id}
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
	if len(st.Procs) == 0 {
		return nil, fmt.Errorf("%w: prestart state: no interpreter", sbtypes.ErrInvalid)
	}
	pre := &Prestarted{agent: agent, procs: make(map[Language]string, len(st.Procs))}
	for l, w := range st.Procs {
		if !CanPrestart(l) || w.ID == "" {
			return nil, fmt.Errorf("%w: prestart state: language %q, process %q", sbtypes.ErrInvalid, l, w.ID)
		}
		pre.procs[l] = w.ID
	}
	return pre, nil
}

// CanPrestart reports whether l's interpreter can wait for its code in a loader (python, node).
func CanPrestart(l Language) bool { return l == Python || l == Node }

// take returns the waiting interpreter for l ("": none) and removes every other one, so the
// run's code is alone in its sandbox, whatever it runs in.
func (pre *Prestarted) take(ctx context.Context, pa processAgent, l Language) (string, error) {
	if pre == nil {
		return "", nil
	}
	var others []string
	for lang, id := range pre.procs {
		if lang != l {
			others = append(others, id)
		}
	}
	errs := make([]error, len(others))
	var wg sync.WaitGroup
	for i, id := range others {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = discard(ctx, pa, id)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return "", err
	}
	return pre.procs[l], nil
}

// errInterpreterGone: the waiting interpreter had exited before it got the code; nothing of
// the run has happened yet.
var errInterpreterGone = errors.New("the pre-started interpreter had exited")

// runPrestarted hands req's code (and stdin) to the waiting interpreter id and collects its
// output and exit as Exec would. The run's deadline and caps go with the code and are the
// agent's to keep, as an exec's are (agent/client Handoff): a caller that dies cannot stretch
// them, and a caller that goes away takes the run with it. errInterpreterGone means the code
// never reached it (the caller runs it cold instead).
func runPrestarted(ctx context.Context, pa processAgent, id string, req Request, stdin io.Reader, opts Options) (res Result, err error) {
	c := newCapture(opts)
	// Stdin already in memory goes with the code; a stream follows once the agent has the
	// code (and is left unread if it refuses it).
	var first bytes.Buffer
	fmt.Fprintf(&first, "%d %d\n", len(req.Code), boolDigit(stdin != nil))
	first.WriteString(req.Code)
	sr, stdinIsString := stdin.(*strings.Reader)
	var more io.Reader
	switch {
	case stdinIsString:
		pos, _ := sr.Seek(0, io.SeekCurrent)
		if _, err := io.Copy(&first, sr); err != nil {
			return Result{}, fmt.Errorf("reading stdin: %w", err)
		}
		defer func() {
			if errors.Is(err, errInterpreterGone) {
				_, _ = sr.Seek(pos, io.SeekStart) // the cold run reads it from the start
			}
		}()
	case stdin != nil:
		more = stdin
	}
	st, err := pa.Handoff(ctx, id, client.HandoffRequest{
		Timeout:   time.Duration(req.TimeoutSeconds) * time.Second,
		MaxStdout: c.capBytes, MaxStderr: c.capBytes,
		Input: first.Bytes(), More: more,
	})
	if err != nil {
		// ErrConflict: it had exited; ErrNotFound: the agent no longer holds it, or is older
		// than handoffs (a spare parked before an upgrade). The code never got there: the
		// interpreter goes (if it waits still) and the run is cold.
		if errors.Is(err, sbtypes.ErrConflict) || errors.Is(err, sbtypes.ErrNotFound) {
			if err := discard(ctx, pa, id); err != nil {
				return Result{}, err
			}
			return Result{}, errInterpreterGone
		}
		return Result{}, fmt.Errorf("handing the code to the interpreter: %w", err)
	}
	ex, err := st.Wait(c.stdout, c.stderr)
	if err != nil {
		return Result{}, err
	}
	return c.resultOf(ex, req.TimeoutSeconds)
}

// discard kills a waiting interpreter that got no code (nothing else runs in its cgroup) and
// waits until the agent has seen it gone: much faster than a removal's freeze-and-kill of a
// many-threaded node.
func discard(ctx context.Context, pa processAgent, id string) error {
	err := pa.Signal(ctx, id, "SIGKILL")
	if err == nil || errors.Is(err, sbtypes.ErrConflict) {
		_, err = pa.Wait(ctx, id)
	}
	if err != nil && !errors.Is(err, sbtypes.ErrNotFound) {
		return fmt.Errorf("removing a pre-started interpreter: %w", err)
	}
	return nil
}

func boolDigit(b bool) int {
	if b {
		return 1
	}
	return 0
}
