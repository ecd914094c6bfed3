package aws_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	awsb "github.com/airlock-sandbox/airlock/backend/aws"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// TestReconnectFromAnotherProcess: a backend that did not create a MicroVM (another process,
// the same state dir) finds it, learns its sandbox id from its agent, and drives it; a backend
// with another state dir (another master secret) reaches the MicroVM but its tokens are refused.
func TestReconnectFromAnotherProcess(t *testing.T) {
	w := newWorld(t)
	sess, err := w.backend(t).Create(t.Context(), testDecl("recon"))
	if err != nil {
		t.Fatal(err)
	}
	other := w.backend(t)
	defer other.Terminate(t.Context(), sess.ID)
	got, err := other.Get(t.Context(), sess.ID)
	if err != nil || got.SandboxID != "recon" || got.State != sandbox.StateRunning {
		t.Fatalf("Get from another backend = %+v, %v", got, err)
	}
	list, err := other.List(t.Context())
	if err != nil || !slices.ContainsFunc(list, func(s *sandbox.Session) bool { return s.ID == sess.ID }) {
		t.Errorf("List from another backend = %v, %v; want %s", list, err, sess.ID)
	}
	a, err := other.Connect(t.Context(), sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var out strings.Builder
	if res, err := a.Exec(t.Context(), sandbox.ExecRequest{Shell: "echo again", Timeout: 30 * time.Second}, &out, nil); err != nil || out.String() != "again\n" || res.ExitCode != 0 {
		t.Errorf("exec from another backend: %q %+v %v", out.String(), res, err)
	}

	stranger := w.backend(t, func(c *awsb.Config) { c.StateDir = t.TempDir() })
	b, err := stranger.Connect(t.Context(), sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.Exec(t.Context(), sandbox.ExecRequest{Shell: "echo no", Timeout: 30 * time.Second}, &out, nil); err == nil {
		t.Errorf("exec with another master secret's token succeeded")
	}
}
