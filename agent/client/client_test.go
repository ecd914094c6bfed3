package client

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fake serves one canned answer for every request and records the last exec request.
func fake(t *testing.T, h http.HandlerFunc) *Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c := New("tcp:"+strings.TrimPrefix(srv.URL, "http://"), func() string { return "tok" })
	t.Cleanup(func() { c.Close() })
	return c
}

func frames(w http.ResponseWriter, parts ...[]byte) {
	w.Header().Set("Content-Type", wire.ContentTypeFrames)
	w.WriteHeader(http.StatusOK)
	for _, p := range parts {
		_, _ = w.Write(p)
	}
}

func exitFrame(ex wire.Exit) []byte {
	b, _ := json.Marshal(ex)
	return append([]byte{wire.FrameExit, 0, 0, 0, byte(len(b))}, b...)
}

func TestExecOutcomeUnknownWithoutTerminal(t *testing.T) {
	tests := map[string][][]byte{
		"empty stream":           nil,
		"output then end":        {wire.AppendOutput(nil, wire.FrameStdout, 1, []byte("partial"))},
		"cut inside a frame":     {wire.AppendOutput(nil, wire.FrameStdout, 1, []byte("partial"))[:7]},
		"sequence goes backward": {wire.AppendOutput(nil, wire.FrameStdout, 2, []byte("a")), wire.AppendOutput(nil, wire.FrameStderr, 2, []byte("b")), exitFrame(wire.Exit{})},
		"garbage":                {[]byte("HTTP/1.1 200 OK\r\n")},
	}
	for name, parts := range tests {
		t.Run(name, func(t *testing.T) {
			c := fake(t, func(w http.ResponseWriter, r *http.Request) { frames(w, parts...) })
			var out strings.Builder
			res, err := c.Exec(context.Background(), sbtypes.ExecRequest{Argv: []string{"x"}, Timeout: time.Second}, &out, nil)
			if !errors.Is(err, sbtypes.ErrOutcomeUnknown) {
				t.Errorf("got %+v, %v; want ErrOutcomeUnknown", res, err)
			}
		})
	}
}

func TestExecTerminalFrames(t *testing.T) {
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		var req wire.ExecRequest
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil || req.TimeoutMs != 2 || r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, "bad request", 400)
			return
		}
		frames(w,
			wire.AppendOutput(nil, wire.FrameStdout, 1, []byte("o")),
			wire.AppendOutput(nil, wire.FrameStderr, 2, []byte("e")),
			exitFrame(wire.Exit{ExitCode: 7, Truncated: true, DurationMs: 5}))
	})
	var out, errb strings.Builder
	// 1.5ms rounds up to 2: a deadline is never shortened.
	res, err := c.Exec(context.Background(), sbtypes.ExecRequest{Argv: []string{"x"}, Timeout: 1500 * time.Microsecond}, &out, &errb)
	if err != nil || res.ExitCode != 7 || !res.Truncated || res.Duration != 5*time.Millisecond || out.String() != "o" || errb.String() != "e" {
		t.Errorf("got %+v %v %q %q", res, err, out.String(), errb.String())
	}
}

func TestErrorFrameAndBodies(t *testing.T) {
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/exec":
			b, _ := json.Marshal(wire.Error{Code: "outcome_unknown", Message: "cgroup stuck"})
			frames(w, append([]byte{wire.FrameError, 0, 0, 0, byte(len(b))}, b...))
		case "/v1/files/stat":
			w.WriteHeader(http.StatusForbidden)
			_ = json.NewEncoder(w).Encode(wire.Error{Code: "forbidden", Reason: "expired", Message: "token: expired"})
		default:
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		}
	})
	ctx := context.Background()
	_, err := c.Exec(ctx, sbtypes.ExecRequest{Argv: []string{"x"}, Timeout: time.Second}, nil, nil)
	if !errors.Is(err, sbtypes.ErrOutcomeUnknown) {
		t.Errorf("error frame: %v", err)
	}
	_, err = c.Stat(ctx, "/x")
	var ce *Error
	if !errors.Is(err, sbtypes.ErrForbidden) || !errors.As(err, &ce) || ce.Reason != "expired" || ce.Status != 403 {
		t.Errorf("403 body: %v", err)
	}
	if err := c.Mkdir(ctx, "/x", 0); !errors.Is(err, sbtypes.ErrInvalid) {
		t.Errorf("plain 405: %v", err)
	}
}

func TestTransportErrors(t *testing.T) {
	ctx := context.Background()
	c := New("unix:/nonexistent/agent.sock", nil)
	defer c.Close()
	if _, err := c.Health(ctx); !errors.Is(err, sbtypes.ErrUnreachable) {
		t.Errorf("dial failure: %v, want ErrUnreachable", err)
	}
	if err := c.Remove(ctx, "/x", false); !errors.Is(err, sbtypes.ErrUnreachable) {
		t.Errorf("dial failure on a mutating call: %v, want ErrUnreachable (nothing was sent)", err)
	}
	if _, err := New("ftp://x", nil).Health(ctx); !errors.Is(err, sbtypes.ErrInvalid) {
		t.Errorf("bad address: %v", err)
	}
	// The connection drops after the request was sent: a mutating call's outcome is unknown.
	drop := fake(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		hj, _ := w.(http.Hijacker)
		conn, _, _ := hj.Hijack()
		conn.Close()
	})
	if err := drop.Remove(ctx, "/x", false); !errors.Is(err, sbtypes.ErrOutcomeUnknown) {
		t.Errorf("dropped mutating call: %v, want ErrOutcomeUnknown", err)
	}
	if _, err := drop.Exec(ctx, sbtypes.ExecRequest{Argv: []string{"x"}, Timeout: time.Second}, nil, nil); !errors.Is(err, sbtypes.ErrOutcomeUnknown) {
		t.Errorf("dropped exec: %v, want ErrOutcomeUnknown", err)
	}
	if _, err := drop.Exec(ctx, sbtypes.ExecRequest{Argv: []string{"x"}}, nil, nil); !errors.Is(err, sbtypes.ErrInvalid) {
		t.Errorf("no timeout: %v, want ErrInvalid before sending", err)
	}
}

// TestNewDial: every connection of a NewDial client is the dial function's, kept alive
// across calls (one dial for several), and a failing dial is the call's error.
func TestNewDial(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(sbtypes.Health{ProtocolVersion: 1, SandboxID: "sb"})
	}))
	defer srv.Close()
	dials := 0
	c := NewDial(func(ctx context.Context) (net.Conn, error) {
		dials++
		var d net.Dialer
		return d.DialContext(ctx, "tcp", strings.TrimPrefix(srv.URL, "http://"))
	}, func() string { return "tok" })
	defer c.Close()
	for range 3 {
		if h, err := c.Health(t.Context()); err != nil || h.SandboxID != "sb" {
			t.Fatalf("Health: %+v %v", h, err)
		}
	}
	if dials != 1 {
		t.Errorf("%d dials for 3 calls, want 1 kept-alive connection", dials)
	}
	c2 := NewDial(func(context.Context) (net.Conn, error) { return nil, errors.New("no launcher") }, func() string { return "tok" })
	if _, err := c2.Health(t.Context()); err == nil || !strings.Contains(err.Error(), "no launcher") {
		t.Errorf("Health through a failing dial: %v", err)
	}
}
