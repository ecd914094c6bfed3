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
	pre := core.NewPrestarted(nil, 16<<20, map[Language]core.Waiting{Python: {ID: "p1", ReadySeq: 3}})
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

func TestPrestartNegativeCap(t *testing.T) {
	if _, err := Prestart(PrestartOptions{Languages: []Language{Python}, MaxOutputBytes: -1}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("negative cap: %v", err)
	}
}
