package jsonhttp

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

func TestBody(t *testing.T) {
	if b, err := Body("/v1/x", nil); b != nil || err != nil {
		t.Errorf("Body(nil) = %v, %v; want no body", b, err)
	}
	b, err := Body("/v1/x", map[string]int{"a": 1})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := io.ReadAll(b); string(got) != `{"a":1}` {
		t.Errorf("Body = %s", got)
	}
	if _, err := Body("/v1/x", make(chan int)); !errors.Is(err, sbtypes.ErrInvalid) || !strings.Contains(err.Error(), "/v1/x") {
		t.Errorf("Body of a channel: %v, want ErrInvalid naming the path", err)
	}
}

// closeCounter is a body that records its close.
type closeCounter struct {
	io.Reader
	closed bool
}

func (c *closeCounter) Close() error { c.closed = true; return nil }

// TestAnswer: a decoded answer fills out; a body nobody wants is drained; an answer that does not
// decode is an unknown outcome for a mutating call and an unreachable server for any other;
// the body is closed in every case.
func TestAnswer(t *testing.T) {
	type out struct {
		A int `json:"a"`
	}
	for _, tc := range []struct {
		name     string
		body     string
		want     bool // decode into out
		mutating bool
		class    error
	}{
		{"decoded", `{"a":7}`, true, false, nil},
		{"drained", `{"a":7}`, false, true, nil},
		{"garbled read", `{"a":`, true, false, sbtypes.ErrUnreachable},
		{"garbled write", `{"a":`, true, true, sbtypes.ErrOutcomeUnknown},
	} {
		body := &closeCounter{Reader: strings.NewReader(tc.body)}
		var o out
		var target any
		if tc.want {
			target = &o
		}
		err := Answer(&http.Response{Body: body}, target, "POST", "/v1/x", tc.mutating)
		switch {
		case tc.class == nil && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.class != nil && !errors.Is(err, tc.class):
			t.Errorf("%s: %v, want %v", tc.name, err, tc.class)
		case tc.class == nil && tc.want && o.A != 7:
			t.Errorf("%s: decoded %+v", tc.name, o)
		}
		if rest, _ := io.ReadAll(body); len(rest) != 0 && tc.class == nil {
			t.Errorf("%s: %q left unread", tc.name, rest)
		}
		if !body.closed {
			t.Errorf("%s: body not closed", tc.name)
		}
	}
}
