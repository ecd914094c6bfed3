package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/server/api"
	"github.com/airlock-sandbox/airlock/spec"
)

// The SDK against a real daemon is tested in server/e2e_test.go; these tests pin what the
// client alone decides: how answers, broken streams and transport failures become errors.

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func fakeDaemon(t *testing.T, h http.HandlerFunc) *Client {
	t.Helper()
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	c, err := New(Options{BaseURL: ts.URL, APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestEveryClassSurvivesTheWire(t *testing.T) {
	classes := []error{sandbox.ErrInvalid, sandbox.ErrUnauthenticated, sandbox.ErrForbidden, sandbox.ErrNotFound,
		sandbox.ErrConflict, sandbox.ErrTooLarge, sandbox.ErrRefused, sandbox.ErrUnsupported,
		sandbox.ErrDeadlineExceeded, sandbox.ErrUnreachable, sandbox.ErrOutcomeUnknown}
	var current error
	c := fakeDaemon(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer k" {
			t.Errorf("credential %q", r.Header.Get("Authorization"))
		}
		code, status := api.CodeOf(current)
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(api.Error{Code: code, Reason: "why", Message: "it failed", RequestID: "rid"})
	})
	for _, class := range classes {
		current = class
		_, err := c.Get(context.Background(), "s-1")
		var ce *Error
		if !errors.Is(err, class) || !errors.As(err, &ce) || ce.Reason != "why" || ce.RequestID != "rid" {
			t.Errorf("%v: got %v", class, err)
		}
		for _, other := range classes {
			if other != class && errors.Is(err, other) {
				t.Errorf("%v also matches %v", class, other)
			}
		}
	}
}

func TestProblemsBecomeRefusalsAndFieldErrors(t *testing.T) {
	code := "refused"
	c := fakeDaemon(t, func(w http.ResponseWriter, r *http.Request) {
		_, status := api.CodeOf(api.ClassOf(code))
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(api.Error{Code: code, Message: "no", Problems: []api.Problem{
			{Field: "previewPorts", Capability: capability.Preview, Rule: plan.RuleCapability, Message: "no preview"},
			{Field: "runtime", Capability: capability.GVisor, Rule: plan.RuleCapability, Message: "no runsc"},
		}})
	})
	_, err := c.Create(context.Background(), spec.Sandbox{ID: "x"})
	var r *plan.Refusal
	if !errors.Is(err, sandbox.ErrRefused) || !errors.As(err, &r) || r.Capability != capability.Preview {
		t.Fatalf("refused: %v", err)
	}
	code = "invalid"
	_, err = c.Create(context.Background(), spec.Sandbox{ID: "x"})
	var fe *spec.FieldError
	if !errors.Is(err, sandbox.ErrInvalid) || !errors.As(err, &fe) || fe.Path != "previewPorts" || errors.As(err, &r) {
		t.Fatalf("invalid: %v", err)
	}
}

func TestAnswersWithoutAnErrorBody(t *testing.T) {
	status := http.StatusBadGateway
	c := fakeDaemon(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(status)
		io.WriteString(w, "<html>proxy says no</html>")
	})
	_, err := c.Get(context.Background(), "s-1")
	if !errors.Is(err, sandbox.ErrUnreachable) || !strings.Contains(err.Error(), "proxy says no") {
		t.Fatalf("502 from a proxy: %v", err)
	}
	status = http.StatusMethodNotAllowed
	if _, err := c.Get(context.Background(), "s-1"); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("405: %v", err)
	}
}

func TestExecStreams(t *testing.T) {
	var lines []string
	c := fakeDaemon(t, func(w http.ResponseWriter, r *http.Request) {
		var hdr api.ExecRequest
		dec := json.NewDecoder(r.Body)
		if err := dec.Decode(&hdr); err != nil || hdr.TimeoutMs != 1001 || !hdr.Stdin {
			t.Errorf("exec header %+v %v", hdr, err)
		}
		rest, _ := io.ReadAll(io.MultiReader(dec.Buffered(), r.Body))
		if string(rest) != "\nstdin bytes" {
			t.Errorf("stdin part %q", rest)
		}
		w.Header().Set("Content-Type", api.ContentTypeNDJSON)
		for _, l := range lines {
			io.WriteString(w, l+"\n")
		}
	})
	sb := c.Sandbox("s-1")
	run := func() (string, string, sandbox.ExecResult, error) {
		var o, e bytes.Buffer
		res, err := sb.Exec(context.Background(), sandbox.ExecRequest{Argv: []string{"x"}, Timeout: 1000_500_000, Stdin: strings.NewReader("stdin bytes")}, &o, &e)
		return o.String(), e.String(), res, err
	}
	out := func(seq int, stream, data string) string {
		b, _ := json.Marshal(api.Event{Seq: uint64(seq), Stream: sandbox.Stream(stream), Data: []byte(data)})
		return string(b)
	}
	lines = []string{out(1, "stdout", "a"), out(2, "stderr", "b"), out(3, "stdout", "c"), `{"exit":{"exitCode":4,"duration":5}}`}
	if o, e, res, err := run(); err != nil || o != "ac" || e != "b" || res.ExitCode != 4 {
		t.Fatalf("complete stream: %q %q %+v %v", o, e, res, err)
	}
	lines = []string{out(1, "stdout", "a")}
	if _, _, _, err := run(); !errors.Is(err, sandbox.ErrOutcomeUnknown) {
		t.Fatalf("stream without a terminal event: %v", err)
	}
	lines = []string{out(2, "stdout", "a"), out(1, "stdout", "b")}
	if _, _, _, err := run(); !errors.Is(err, sandbox.ErrOutcomeUnknown) {
		t.Fatalf("sequence going back: %v", err)
	}
	lines = []string{`not json`}
	if _, _, _, err := run(); !errors.Is(err, sandbox.ErrOutcomeUnknown) {
		t.Fatalf("garbage line: %v", err)
	}
	lines = []string{out(1, "stdout", "a"), `{"error":{"code":"unreachable","message":"agent went away"}}`}
	if o, _, _, err := run(); !errors.Is(err, sandbox.ErrUnreachable) || o != "a" {
		t.Fatalf("terminal error event: %q %v", o, err)
	}
}

func TestOptions(t *testing.T) {
	for _, o := range []Options{
		{APIKey: "a", Token: "b"},
		{Socket: "/x", BaseURL: "http://h"},
		{BaseURL: "ftp://h"},
		{BaseURL: "http://"},
	} {
		if _, err := New(o); !errors.Is(err, sandbox.ErrInvalid) {
			t.Errorf("%+v: %v", o, err)
		}
	}
	c, err := Dial("/nonexistent/airlock.sock")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Health(context.Background()); !errors.Is(err, sandbox.ErrUnreachable) {
		t.Fatalf("no daemon: %v", err)
	}
	if err := c.Sandbox("s-1").Terminate(context.Background()); !errors.Is(err, sandbox.ErrUnreachable) {
		t.Fatalf("a mutating call that never connected is unreachable, not unknown: %v", err)
	}
}
