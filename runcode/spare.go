package runcode

import (
	"encoding/json"
	"fmt"

	"github.com/airlock-sandbox/airlock/sandbox"
)

// prestartedState is prestarted without its client: what a process that did not start the
// interpreters needs to hand one its code (the agent holds them by process id).
type prestartedState struct {
	MaxOutput int64                   `json:"maxOutput"`
	Procs     map[Language]waitingRef `json:"procs"`
}

type waitingRef struct {
	ID       string `json:"id"`
	ReadySeq uint64 `json:"readySeq"`
}

// PrestartedState encodes what a PrestartFunc returned so that another process can use the
// waiting interpreters (ResumePrestarted): a local spare is prestarted by the process that
// parks it and run by the one that claims it. The caller still closes pre.
func PrestartedState(pre any) ([]byte, error) {
	p, ok := pre.(*prestarted)
	if !ok || p == nil {
		return nil, fmt.Errorf("%w: prestart state: %T is not what Prestart returns", sandbox.ErrInvalid, pre)
	}
	st := prestartedState{MaxOutput: p.maxOutput, Procs: make(map[Language]waitingRef, len(p.procs))}
	for l, w := range p.procs {
		st.Procs[l] = waitingRef{ID: w.id, ReadySeq: w.readySeq}
	}
	return json.Marshal(st)
}

// ResumePrestarted is the inverse of PrestartedState over a new client of the same sandbox's
// agent; the result is what a RunPool's ClaimForRun returns. It owns agent from then on.
func ResumePrestarted(agent sandbox.Agent, state []byte) (any, error) {
	var st prestartedState
	if err := json.Unmarshal(state, &st); err != nil {
		return nil, fmt.Errorf("%w: prestart state: %v", sandbox.ErrInvalid, err)
	}
	if st.MaxOutput <= 0 || len(st.Procs) == 0 {
		return nil, fmt.Errorf("%w: prestart state: no interpreter or no output cap", sandbox.ErrInvalid)
	}
	pre := &prestarted{agent: agent, procs: make(map[Language]*waiting, len(st.Procs)), maxOutput: st.MaxOutput}
	for l, w := range st.Procs {
		if !canPrestart(l) || w.ID == "" {
			return nil, fmt.Errorf("%w: prestart state: language %q, process %q", sandbox.ErrInvalid, l, w.ID)
		}
		pre.procs[l] = &waiting{id: w.ID, readySeq: w.ReadySeq}
	}
	return pre, nil
}
