package local

import (
	"errors"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/sandbox"
)

// TestIdleTimeoutEndsSandbox: a sandbox nobody talks to ends at its idle timeout and leaves
// nothing behind, while a running exec counts as activity and keeps it alive past the timeout.
func TestIdleTimeoutEndsSandbox(t *testing.T) {
	b := newTestBackend(t)
	ctx := t.Context()
	d := hostDecl("idle")
	idle := int64(1)
	d.Session.IdleTimeoutSeconds = &idle
	s, err := b.Create(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	initPID := b.sessionInitPID(s.ID)
	a, err := b.Connect(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	// Three idle timeouts long: the exec is activity, so the sandbox must outlive it.
	if out, _, res := run(t, a, "sleep 3; echo still-here"); res.ExitCode != 0 || out != "still-here\n" {
		t.Fatalf("an exec longer than the idle timeout: %q %+v", out, res)
	}
	// Then silence: the sandbox ends by itself (bounded wait; this is whether, not how fast).
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := b.Get(ctx, s.ID)
		if errors.Is(err, sandbox.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox still there 30s after its 1s idle timeout (Get: %v)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	assertGone(t, b, s.ID, initPID)
}
