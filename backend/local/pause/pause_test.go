package pause

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/backend/local/sessions"
	"github.com/airlock-sandbox/airlock/sandbox"
)

func TestParseFrozenEvent(t *testing.T) {
	tests := []struct {
		in   string
		want bool
		bad  bool
	}{
		{"populated 1\nfrozen 0\n", false, false},
		{"populated 1\nfrozen 1\n", true, false},
		{"frozen 1", true, false},
		{"populated 0\n", false, true},
		{"frozen yes\n", false, true},
	}
	for _, tt := range tests {
		got, err := parseFrozenEvent(strings.NewReader(tt.in))
		if (err != nil) != tt.bad || got != tt.want {
			t.Errorf("parseFrozenEvent(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.bad)
		}
	}
}

// TestAgentRefusesWhilePaused: every call of a paused sandbox's agent is refused with
// ErrConflict naming the session, before it reaches the agent (the client here has none).
func TestAgentRefusesWhilePaused(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "cgroup.freeze"), []byte("1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a := NewAgent(nil, sessions.Freezer{Version: 2, Dir: dir}, "s-0123456789abcdef")
	ctx := context.Background()
	calls := map[string]func() error{
		"Health":        func() error { _, err := a.Health(ctx); return err },
		"Shutdown":      func() error { return a.Shutdown(ctx) },
		"Exec":          func() error { _, err := a.Exec(ctx, sandbox.ExecRequest{}, io.Discard, io.Discard); return err },
		"ExecStream":    func() error { _, err := a.ExecStream(ctx, sandbox.ExecRequest{}); return err },
		"ReadFile":      func() error { _, err := a.ReadFile(ctx, "/x", 0, -1); return err },
		"WriteFile":     func() error { return a.WriteFile(ctx, "/x", strings.NewReader(""), 0o644) },
		"Mkdir":         func() error { return a.Mkdir(ctx, "/x", 0o755) },
		"List":          func() error { _, err := a.List(ctx, "/"); return err },
		"Stat":          func() error { _, err := a.Stat(ctx, "/"); return err },
		"Remove":        func() error { return a.Remove(ctx, "/x", false) },
		"Rename":        func() error { return a.Rename(ctx, "/x", "/y") },
		"StartProcess":  func() error { _, err := a.StartProcess(ctx, client.ProcessRequest{}); return err },
		"Processes":     func() error { _, err := a.Processes(ctx); return err },
		"Process":       func() error { _, err := a.Process(ctx, "p"); return err },
		"RemoveProcess": func() error { return a.RemoveProcess(ctx, "p") },
		"Attach":        func() error { _, err := a.Attach(ctx, "p", false); return err },
		"WriteStdin":    func() error { return a.WriteStdin(ctx, "p", strings.NewReader(""), true) },
		"Handoff":       func() error { _, err := a.Handoff(ctx, "p", client.HandoffRequest{}); return err },
		"Signal":        func() error { return a.Signal(ctx, "p", "TERM") },
		"Wait":          func() error { _, err := a.Wait(ctx, "p"); return err },
		"Resize":        func() error { return a.Resize(ctx, "p", 24, 80) },
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, sandbox.ErrConflict) || !strings.Contains(err.Error(), "s-0123456789abcdef is paused") {
			t.Errorf("%s while paused: %v, want ErrConflict naming the session", name, err)
		}
	}
}
