package mcp

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// countingBackend counts creates and creates nothing.
type countingBackend struct {
	sandbox.Backend
	creates int
}

func (c *countingBackend) Platform() capability.Platform { return capability.Local }
func (c *countingBackend) Capabilities(context.Context) capability.Set {
	s := capability.Set{Platform: capability.Local, Entries: map[capability.Name]capability.Status{}}
	for _, n := range capability.Names {
		s.Entries[n] = capability.Status{Supported: true}
	}
	return s
}
func (c *countingBackend) Create(context.Context, spec.Sandbox) (*sandbox.Session, error) {
	c.creates++
	return nil, errors.New("no sandboxes here")
}

// TestRunCodeSlots: with every run_code slot taken, a call waits instead of creating a
// sandbox, and gives up with its context.
func TestRunCodeSlots(t *testing.T) {
	b := &countingBackend{}
	s := New(b, Options{MaxConcurrentRuns: 2, Logger: slog.New(slog.DiscardHandler)})
	defer s.Close(context.Background())
	s.runs <- struct{}{}
	s.runs <- struct{}{}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, _, err := s.runCode(ctx, runCodeInput{Language: "python", Code: "print(1)"})
	if err == nil || !strings.Contains(err.Error(), "free run_code slot (2 run at once)") || !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want a wait for a slot that ended with the context", err)
	}
	if b.creates != 0 {
		t.Fatalf("%d sandboxes asked for with every slot taken", b.creates)
	}
	<-s.runs
	if _, _, err := s.runCode(t.Context(), runCodeInput{Language: "python", Code: "print(1)"}); err == nil || b.creates != 1 {
		t.Fatalf("with a slot free: err %v, creates %d", err, b.creates)
	}
}
