package local

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// TestCreatePhases: a create's debug line carries its phases, init's own among them (from its
// ready status), each not negative (init's marks fall between the host's), and adding up to
// the total.
func TestCreatePhases(t *testing.T) {
	testutil.RequireRoot(t)
	var logs bytes.Buffer
	state := testStateDir(t)
	b, err := New(context.Background(), Options{StateDir: state, AgentPath: agentBin, ImageCacheDir: filepath.Join(state, "images"),
		Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	s, err := b.Create(t.Context(), hostDecl("phases"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Terminate(context.Background(), s.ID)
	var line struct {
		Msg    string                   `json:"msg"`
		Phases map[string]time.Duration `json:"phases"`
	}
	found := false
	for _, raw := range bytes.Split(logs.Bytes(), []byte("\n")) {
		if json.Unmarshal(raw, &line) == nil && line.Msg == "sandbox created" {
			found = true
			break
		}
	}
	if !found {
		t.Fatalf("no \"sandbox created\" line in:\n%s", logs.String())
	}
	var sum time.Duration
	for _, k := range []string{"prepare", "start", "config", "root", "serve", "ready"} {
		d, ok := line.Phases[k]
		if !ok || d < 0 {
			t.Errorf("phase %s: %v (present %v), want a duration not negative; phases %v", k, d, ok, line.Phases)
		}
		sum += d
	}
	if total := line.Phases["total"]; total <= 0 || sum != total {
		t.Errorf("phases add up to %v, total %v", sum, total)
	}
}
