package mcp_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/mcp"
	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// sizingBackend is a platform that sizes its sandboxes itself (no cpu, memory or process
// ceiling; its own values for them) and whose Create checks what it is given against that set,
// as every backend's does.
type sizingBackend struct {
	deadBackend
	created []spec.Sandbox
	// noLife: the platform holds no lifetime, idle timeout or labels either.
	noLife bool
}

func (b *sizingBackend) Platform() capability.Platform { return capability.AWS }
func (b *sizingBackend) Capabilities(ctx context.Context) capability.Set {
	s := b.deadBackend.Capabilities(ctx)
	s.Platform = capability.AWS
	for _, n := range []capability.Name{capability.EnforcedLimits, capability.ProcessLimit} {
		s.Entries[n] = capability.Status{Reason: "the platform sizes its sandboxes"}
	}
	s.PlatformValues = map[capability.Property]string{
		capability.PropCPU:          "platform-sized (tier cpu)",
		capability.PropMemory:       "platform-sized (tier 2048 MiB)",
		capability.PropMaxProcesses: "unbounded",
	}
	if b.noLife {
		for _, n := range []capability.Name{capability.SessionLifetime, capability.IdleTimeout, capability.Labels} {
			s.Entries[n] = capability.Status{Reason: "the platform has none"}
		}
		s.PlatformValues[capability.PropLifetime] = "until deleted"
		s.PlatformValues[capability.PropIdleTimeout] = "none"
	}
	return s
}
func (b *sizingBackend) Create(ctx context.Context, d spec.Sandbox) (*sandbox.Session, error) {
	if err := plan.CheckSandbox(d, b.Capabilities(ctx)); err != nil {
		return nil, err
	}
	b.created = append(b.created, d)
	return &sandbox.Session{ID: fmt.Sprintf("s-%d", len(b.created)), SandboxID: d.ID, Spec: d}, nil
}
func (b *sizingBackend) Connect(context.Context, string) (sandbox.Agent, error) {
	return closeOnlyAgent{}, nil
}

// closeOnlyAgent is an agent that is only closed (the test never execs).
type closeOnlyAgent struct{ sandbox.Agent }

func (closeOnlyAgent) Close() error { return nil }

// TestCreateTakesPlatformValues: sandbox_create with no limits on a platform that publishes its
// own values creates the sandbox with them left to the platform and says which; a limit the
// caller gives is still refused, naming the field and the capability.
func TestCreateTakesPlatformValues(t *testing.T) {
	b := &sizingBackend{}
	s := mcp.New(b, mcp.Options{Logger: quiet})
	defer s.Close(context.Background())
	cs := connect(t, s)

	r := call(t, cs, "sandbox_create", map[string]any{})
	if r.IsError {
		t.Fatalf("sandbox_create with no limits: %s", text(r))
	}
	if len(b.created) != 1 {
		t.Fatalf("created %d", len(b.created))
	}
	if l := b.created[0].Limits; l.CPU != "" || l.Memory != "" || l.MaxProcesses != nil || l.Disk != spec.DefaultDisk {
		t.Errorf("limits given to Create %+v: want cpu, memory and processes left to the platform, disk at airlock's default", l)
	}
	info := structured[struct {
		Memory       string `json:"memory"`
		CPU          string `json:"cpu"`
		MaxProcesses int64  `json:"max_processes"`
	}](t, r)
	if info.Memory != "platform-sized (tier 2048 MiB)" || info.CPU != "platform-sized (tier cpu)" || info.MaxProcesses != 0 {
		t.Errorf("reported %+v, want the platform's values", info)
	}

	if got := b.created[0]; got.Session.MaxLifetimeSeconds == nil || got.Labels["run.airlock.dev/purpose"] != "mcp-session" {
		t.Errorf("what the platform holds was not asked for: %+v", got)
	}

	// Where the platform holds no lifetime, idle timeout or labels, those this server chose are
	// left to it; a lifetime the caller gives is refused by name.
	b.noLife = true
	r = call(t, cs, "sandbox_create", map[string]any{})
	if r.IsError || len(b.created) != 2 {
		t.Fatalf("sandbox_create where the platform has no lifetime: %s", text(r))
	}
	if got := b.created[1]; got.Session.MaxLifetimeSeconds != nil || got.Session.IdleTimeoutSeconds != nil || len(got.Labels) != 0 {
		t.Errorf("given to Create %+v: want lifetime, idle timeout and labels left to the platform", got)
	}
	if info := structured[struct {
		ExpiresAt string `json:"expires_at"`
	}](t, r); info.ExpiresAt != "" || !strings.Contains(text(r), "lives until deleted") {
		t.Errorf("expiry %q, text %s: want the platform's", info.ExpiresAt, text(r))
	}
	r = call(t, cs, "sandbox_create", map[string]any{"lifetime_seconds": 60})
	if !r.IsError || !strings.Contains(text(r), "session.maxLifetimeSeconds") || !strings.Contains(text(r), "sessionLifetime") {
		t.Errorf("a declared lifetime the platform cannot hold: %s", text(r))
	}
	b.noLife = false

	r = call(t, cs, "sandbox_create", map[string]any{"memory": "256Mi"})
	if !r.IsError || !strings.Contains(text(r), "limits.memory") || !strings.Contains(text(r), "enforcedLimits") {
		t.Errorf("a declared memory ceiling the platform cannot hold: %s", text(r))
	}
	if len(b.created) != 2 {
		t.Errorf("a refused sandbox_create reached Create")
	}
}
