package runcode

import (
	"fmt"

	"github.com/airlock-sandbox/airlock/runcode/core"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// PrestartedState encodes what a PrestartFunc returned so that another process can use the
// waiting interpreters (ResumePrestarted): a local spare is prestarted by the process that
// parks it and run by the one that claims it. The caller still closes pre.
func PrestartedState(pre any) ([]byte, error) {
	p, ok := pre.(*core.Prestarted)
	if !ok || p == nil {
		return nil, fmt.Errorf("%w: prestart state: %T is not what Prestart returns", sandbox.ErrInvalid, pre)
	}
	return p.State()
}

// ResumePrestarted is the inverse of PrestartedState over a new client of the same sandbox's
// agent; the result (a *core.Prestarted) is what a RunPool's ClaimForRun returns. It owns
// agent from then on.
func ResumePrestarted(agent sandbox.Agent, state []byte) (any, error) {
	pre, err := core.ResumePrestarted(agent, state)
	if err != nil {
		return nil, err // an untyped nil: a caller's pre != nil means there is one
	}
	return pre, nil
}
