package runcode

import (
	"errors"
	"testing"

	"github.com/airlock-sandbox/airlock/runcode/core"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// TestPrestartedStateWrappers: PrestartedState and ResumePrestarted carry core's Prestarted
// through the any a PrestartFunc and a RunPool hand around.
func TestPrestartedStateWrappers(t *testing.T) {
	pre := core.NewPrestarted(nil, 16<<20, map[Language]core.Waiting{Python: {ID: "p1", ReadySeq: 3}})
	data, err := PrestartedState(pre)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ResumePrestarted(nil, data)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := got.(*core.Prestarted); !ok {
		t.Fatalf("resumed a %T, want *core.Prestarted (what claim takes)", got)
	}
	if _, err := PrestartedState("x"); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("state of a string: %v", err)
	}
	if _, err := PrestartedState((*core.Prestarted)(nil)); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("state of a nil Prestarted: %v", err)
	}
	// A failed resume is an untyped nil: claim closes what is an io.Closer.
	if got, err := ResumePrestarted(nil, []byte("nope")); got != nil || !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("bad state: %#v, %v", got, err)
	}
}

func TestPrestartNegativeCap(t *testing.T) {
	if _, err := Prestart(PrestartOptions{Languages: []Language{Python}, MaxOutputBytes: -1}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("negative cap: %v", err)
	}
}
