package runcode

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/sandbox"
)

// TestPrestartedStateRoundTrip: what another process resumes is what Prestart left.
func TestPrestartedStateRoundTrip(t *testing.T) {
	pre := &prestarted{maxOutput: 16 << 20, procs: map[Language]*waiting{
		Python: {id: "p1", readySeq: 3},
		Node:   {id: "p2", readySeq: 1},
	}}
	data, err := PrestartedState(pre)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ResumePrestarted(nil, data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, pre) {
		t.Fatalf("resumed %+v, want %+v", got, pre)
	}
}

func TestResumePrestartedRefusals(t *testing.T) {
	for _, tt := range []struct{ state, want string }{
		{`nope`, "prestart state"},
		{`{"maxOutput":0,"procs":{"python":{"id":"p"}}}`, "no output cap"},
		{`{"maxOutput":5,"procs":{}}`, "no interpreter"},
		{`{"maxOutput":5,"procs":{"bash":{"id":"p"}}}`, `language "bash"`},
		{`{"maxOutput":5,"procs":{"python":{"id":""}}}`, `process ""`},
	} {
		_, err := ResumePrestarted(nil, []byte(tt.state))
		if !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: got %v, want ErrInvalid naming %q", tt.state, err, tt.want)
		}
	}
	if _, err := PrestartedState("x"); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("state of a string: %v", err)
	}
}

// TestPrestartedUsable: a waiting interpreter serves runs whose output cap fits its own.
func TestPrestartedUsable(t *testing.T) {
	pre := &prestarted{maxOutput: 2 << 20}
	for _, tt := range []struct {
		cap  int64
		want bool
	}{{0, true}, {1, true}, {2 << 20, true}, {2<<20 + 1, false}} {
		if got := pre.usable(Options{MaxOutputBytes: tt.cap}); got != tt.want {
			t.Errorf("cap %d: usable %v, want %v", tt.cap, got, tt.want)
		}
	}
	if (&prestarted{maxOutput: DefaultOutputBytes / 2}).usable(Options{}) {
		t.Error("a run with the default cap used an interpreter started with half of it")
	}
	if _, err := Prestart(PrestartOptions{Languages: []Language{Python}, MaxOutputBytes: -1}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("negative cap: %v", err)
	}
}
