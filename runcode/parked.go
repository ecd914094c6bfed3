package runcode

import (
	"fmt"

	"github.com/airlock-sandbox/airlock/runcode/core"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// PrestartedState encodes what a PrestartFunc returned so that another process can use the
// waiting interpreters (ResumePrestarted): a local parked sandbox is prestarted by the process that
// parks it and run by the one that claims it. The caller still closes pre.
func PrestartedState(pre any) ([]byte, error) {
	p, ok := pre.(*core.Prestarted)
	if !ok || p == nil {
		return nil, fmt.Errorf("%w: prestart state: %T is not what Prestart returns", sandbox.ErrInvalid, pre)
	}
	return p.State()
}
