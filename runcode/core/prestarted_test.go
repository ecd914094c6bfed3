package core

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

// TestPrestartedStateRoundTrip: what another process resumes is what Prestart left.
func TestPrestartedStateRoundTrip(t *testing.T) {
	pre := NewPrestarted(nil, 16<<20, map[Language]Waiting{
		Python: {ID: "p1", ReadySeq: 3},
		Node:   {ID: "p2", ReadySeq: 1},
	})
	want := &Prestarted{maxOutput: 16 << 20, procs: map[Language]*waiting{
		Python: {id: "p1", readySeq: 3},
		Node:   {id: "p2", readySeq: 1},
	}}
	if !reflect.DeepEqual(pre, want) {
		t.Fatalf("NewPrestarted gave %+v, want %+v", pre, want)
	}
	data, err := pre.State()
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

// TestPrestartedStateFormat: the state is read by another airlock process, maybe another
// build of it: its encoding stays what it was.
func TestPrestartedStateFormat(t *testing.T) {
	data, err := NewPrestarted(nil, 5, map[Language]Waiting{Python: {ID: "p1", ReadySeq: 3}}).State()
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"maxOutput":5,"procs":{"python":{"id":"p1","readySeq":3}}}`; string(data) != want {
		t.Fatalf("state %s, want %s", data, want)
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
		if !errors.Is(err, sbtypes.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: got %v, want ErrInvalid naming %q", tt.state, err, tt.want)
		}
	}
}

// TestPrestartedUsable: a waiting interpreter serves runs whose output cap fits its own.
func TestPrestartedUsable(t *testing.T) {
	pre := &Prestarted{maxOutput: 2 << 20}
	for _, tt := range []struct {
		cap  int64
		want bool
	}{{0, true}, {1, true}, {2 << 20, true}, {2<<20 + 1, false}} {
		if got := pre.usable(Options{MaxOutputBytes: tt.cap}); got != tt.want {
			t.Errorf("cap %d: usable %v, want %v", tt.cap, got, tt.want)
		}
	}
	if (&Prestarted{maxOutput: DefaultOutputBytes / 2}).usable(Options{}) {
		t.Error("a run with the default cap used an interpreter started with half of it")
	}
}
