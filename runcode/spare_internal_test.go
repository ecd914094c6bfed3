package runcode

import (
	"errors"
	"testing"

	"github.com/airlock-sandbox/airlock/runcode/core"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// TestPrestartedStateWrappers: PrestartedState takes core's Prestarted from the any a
// PrestartFunc hands around, and core.ResumePrestarted reads what it wrote.
func TestPrestartedStateWrappers(t *testing.T) {
	pre := core.NewPrestarted(nil, map[Language]string{Python: "p1"})
	data, err := PrestartedState(pre)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := core.ResumePrestarted(nil, data); err != nil {
		t.Fatal(err)
	}
	if _, err := PrestartedState("x"); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("state of a string: %v", err)
	}
	if _, err := PrestartedState((*core.Prestarted)(nil)); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("state of a nil Prestarted: %v", err)
	}
}
