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
	pre := NewPrestarted(nil, map[Language]string{Python: "p1", Node: "p2"})
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
// build of it: its encoding is fixed, and a state written before the run's caps went with its
// code (an output cap, the ready marker's frame) still resumes.
func TestPrestartedStateFormat(t *testing.T) {
	data, err := NewPrestarted(nil, map[Language]string{Python: "p1"}).State()
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"procs":{"python":{"id":"p1"}}}`; string(data) != want {
		t.Fatalf("state %s, want %s", data, want)
	}
	old, err := ResumePrestarted(nil, []byte(`{"maxOutput":5,"procs":{"python":{"id":"p1","readySeq":3}}}`))
	if err != nil || !reflect.DeepEqual(old.procs, map[Language]string{Python: "p1"}) {
		t.Fatalf("an older build's state: %+v %v", old, err)
	}
}

func TestResumePrestartedRefusals(t *testing.T) {
	for _, tt := range []struct{ state, want string }{
		{`nope`, "prestart state"},
		{`{"procs":{}}`, "no interpreter"},
		{`{"procs":{"bash":{"id":"p"}}}`, `language "bash"`},
		{`{"procs":{"python":{"id":""}}}`, `process ""`},
	} {
		_, err := ResumePrestarted(nil, []byte(tt.state))
		if !errors.Is(err, sbtypes.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: got %v, want ErrInvalid naming %q", tt.state, err, tt.want)
		}
	}
}
