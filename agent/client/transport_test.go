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
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

// connServer is a test agent that counts the connections it accepted.
type connServer struct {
	srv   *httptest.Server
	conns atomic.Int32
}

func newConnServer(t *testing.T, h http.HandlerFunc) (*connServer, *Client) {
	t.Helper()
	cs := &connServer{srv: httptest.NewUnstartedServer(h)}
	cs.srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			cs.conns.Add(1)
		}
	}
	cs.srv.Start()
	t.Cleanup(cs.srv.Close)
	c := New("tcp:"+strings.TrimPrefix(cs.srv.URL, "http://"), func() string { return "tok" })
	t.Cleanup(func() { c.Close() })
	return cs, c
}

// TestTransportKeepsConnections: calls one after another share one connection, whatever the
// call (JSON, an exec's frame stream, a file body in memory or streamed, an answer with no
// body); a connection the agent closed while it was
// idle is not used again; calls in flight at once each have their own.
func TestTransportKeepsConnections(t *testing.T) {
	release := make(chan struct{})
	cs, c := newConnServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/exec":
			_, _ = io.Copy(io.Discard, r.Body)
			frames(w, wire.AppendOutput(nil, wire.FrameStdout, 1, []byte("o")), exitFrame(wire.Exit{ExitCode: 3}))
		case "/v1/files":
			if r.Method == http.MethodGet {
				_, _ = w.Write([]byte("file body"))
				return
			}
			_, _ = io.Copy(io.Discard, r.Body)
		case "/v1/processes/p/stdin":
			_, _ = io.Copy(io.Discard, r.Body)
			w.WriteHeader(http.StatusNoContent)
		case "/v1/processes/slow/wait":
			<-release
			_ = jsonTo(w, wire.Exit{ExitCode: 1})
		default:
			_ = jsonTo(w, sbtypes.Health{SandboxID: "sbx"})
		}
	})
	ctx := context.Background()
	calls := []struct {
		name string
		call func() error
	}{
		{"health", func() error {
			h, err := c.Health(ctx)
			if err == nil && h.SandboxID != "sbx" {
				err = errors.New("wrong answer " + h.SandboxID)
			}
			return err
		}},
		{"exec", func() error {
			var out strings.Builder
			res, err := c.Exec(ctx, sbtypes.ExecRequest{Argv: []string{"x"}, Timeout: time.Second}, &out, nil)
			if err == nil && (res.ExitCode != 3 || out.String() != "o") {
				err = errors.New("wrong result")
			}
			return err
		}},
		{"write file", func() error { return c.WriteFile(ctx, "/f", strings.NewReader("data"), 0) }},
		// A body not in memory is written by its own goroutine while the answer is read.
		{"write file streamed", func() error {
			return c.WriteFile(ctx, "/f", io.MultiReader(strings.NewReader("da"), strings.NewReader("ta")), 0)
		}},
		// 204: no body, which the caller closes without reading.
		{"stdin", func() error { return c.WriteStdin(ctx, "p", strings.NewReader("x"), true) }},
		{"read file", func() error {
			rc, err := c.ReadFile(ctx, "/f", 0, 0)
			if err != nil {
				return err
			}
			defer rc.Close()
			b, err := io.ReadAll(rc)
			if err == nil && string(b) != "file body" {
				err = errors.New("wrong body " + string(b))
			}
			return err
		}},
	}
	for round := range 3 {
		for _, tc := range calls {
			if err := tc.call(); err != nil {
				t.Fatalf("round %d %s: %v", round, tc.name, err)
			}
		}
	}
	if n := cs.conns.Load(); n != 1 {
		t.Errorf("%d connections for calls made one after another, want 1", n)
	}

	// The agent drops its idle connections (as its idle limit does): the next call dials.
	cs.srv.CloseClientConnections()
	if _, err := c.Health(ctx); err != nil {
		t.Fatalf("after the agent closed the idle connection: %v", err)
	}
	if n := cs.conns.Load(); n != 2 {
		t.Errorf("%d connections, want 2 (one new after the close)", n)
	}

	// A call in flight holds its connection: a second call at the same time gets another.
	waited := make(chan error, 1)
	go func() {
		_, err := c.Wait(ctx, "slow")
		waited <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); cs.conns.Load() < 3 && time.Now().Before(deadline); {
		if _, err := c.Health(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	if n := cs.conns.Load(); n != 3 {
		t.Errorf("%d connections, want 3 (one more for the call in flight)", n)
	}
}

func jsonTo(w http.ResponseWriter, v any) error {
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(v)
}

// TestTransportAbandonedAnswers: a connection whose answer was not read to its end (a stream
// closed early, a context cancelled mid-stream) is closed, never handed to the next call, and a
// cancelled context ends a read that is waiting for the agent.
func TestTransportAbandonedAnswers(t *testing.T) {
	var mu sync.Mutex
	var gone []string // answers whose connection the client closed under them
	unblock := make(chan struct{})
	t.Cleanup(func() { close(unblock) })
	cs, c := newConnServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/exec" {
			_ = jsonTo(w, sbtypes.Health{SandboxID: "sbx"})
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", wire.ContentTypeFrames)
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(wire.AppendOutput(nil, wire.FrameStdout, 1, []byte("first")))
		http.NewResponseController(w).Flush()
		select {
		case <-r.Context().Done():
			mu.Lock()
			gone = append(gone, r.URL.Path)
			mu.Unlock()
		case <-unblock:
		}
	})
	ctx := context.Background()
	req := sbtypes.ExecRequest{Argv: []string{"x"}, Timeout: time.Minute}

	// Closed after the first frame.
	s, err := c.ExecStream(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := s.Next(); err != nil || ev.Output == nil || string(ev.Output.Data) != "first" {
		t.Fatalf("first event %+v %v", ev, err)
	}
	s.Close()

	// Cancelled while waiting for the next frame.
	cctx, cancel := context.WithCancel(ctx)
	s, err = c.ExecStream(cctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Next(); err != nil {
		t.Fatal(err)
	}
	next := make(chan error, 1)
	go func() {
		_, err := s.Next()
		next <- err
	}()
	cancel()
	select {
	case err := <-next:
		if !errors.Is(err, sbtypes.ErrOutcomeUnknown) {
			t.Errorf("read after cancel: %v, want ErrOutcomeUnknown", err)
		}
	case <-time.After(time.Minute): // a hang guard
		t.Fatal("a cancelled context did not end the read")
	}

	// Both answers' connections were closed under them; the next call works on a new one.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		mu.Lock()
		n := len(gone)
		mu.Unlock()
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent saw %d of 2 abandoned answers' connections close", n)
		}
	}
	if _, err := c.Health(ctx); err != nil {
		t.Fatal(err)
	}
	if n := cs.conns.Load(); n != 3 {
		t.Errorf("%d connections, want 3 (each abandoned answer's connection closed)", n)
	}
}

// TestTransportFullDuplex: a request body that is a stream (an exec's stdin) is written while
// the answer is read, so output of the first line arrives before stdin has ended.
func TestTransportFullDuplex(t *testing.T) {
	_, c := newConnServer(t, func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).EnableFullDuplex()
		w.Header().Set("Content-Type", wire.ContentTypeFrames)
		w.WriteHeader(http.StatusOK)
		buf := make([]byte, 64)
		var seq uint64
		for {
			n, err := r.Body.Read(buf)
			if n > 0 {
				seq++
				_, _ = w.Write(wire.AppendOutput(nil, wire.FrameStdout, seq, buf[:n]))
				http.NewResponseController(w).Flush()
			}
			if err != nil {
				break
			}
		}
		_, _ = w.Write(exitFrame(wire.Exit{}))
	})
	pr, pw := io.Pipe()
	defer pw.Close()
	s, err := c.ExecStream(context.Background(), sbtypes.ExecRequest{Argv: []string{"cat"}, Timeout: time.Minute, Stdin: pr})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// The agent echoes what it reads; the JSON header comes first, then the stdin line.
	if _, err := pw.Write([]byte("line one\n")); err != nil {
		t.Fatal(err)
	}
	var got strings.Builder
	for !strings.Contains(got.String(), "line one\n") {
		ev, err := s.Next()
		if err != nil || ev.Output == nil {
			t.Fatalf("before stdin ended: %+v %v (so far %q)", ev, err, got.String())
		}
		got.Write(ev.Output.Data)
	}
	pw.Close()
	for {
		ev, err := s.Next()
		if err != nil {
			t.Fatal(err)
		}
		if ev.Result != nil {
			break
		}
	}
}
