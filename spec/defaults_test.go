package spec

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestApplyDefaultsFillsUnset(t *testing.T) {
	s := Sandbox{ID: "a", Image: Image{Host: true}}
	s.ApplyDefaults()
	want := Sandbox{
		ID:    "a",
		Image: Image{Host: true},
		Limits: Limits{
			CPU: "1", Memory: "512Mi", Disk: "1Gi", MaxProcesses: i64(256),
		},
		Egress:  Egress{Mode: EgressDeny},
		Session: Session{MaxLifetimeSeconds: i64(3600), IdleTimeoutSeconds: i64(600), Reconnect: ptr(true)},
		Workdir: "/workspace",
		Runtime: RuntimeNative,
	}
	if d := cmp.Diff(want, s); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}
	if errs := s.Validate(""); len(errs) != 0 {
		t.Fatalf("defaults are invalid: %v", errs)
	}
}

func TestApplyDefaultsKeepsSet(t *testing.T) {
	st := validStack()
	before := validStack()
	st.ApplyDefaults()
	// Only fields the valid stack leaves unset may change.
	before.Sandboxes[0].Egress = st.Sandboxes[0].Egress
	if d := cmp.Diff(before.Sandboxes[0], st.Sandboxes[0]); d != "" {
		t.Fatalf("set fields changed (-before +after):\n%s", d)
	}
	// Invalid set values are kept for validation to report, not replaced.
	bad := Sandbox{Limits: Limits{CPU: "x", MaxProcesses: i64(0)}, Egress: Egress{Mode: "wide"}, Runtime: "kata", Workdir: "rel"}
	bad.ApplyDefaults()
	if bad.Limits.CPU != "x" || *bad.Limits.MaxProcesses != 0 || bad.Egress.Mode != "wide" || bad.Runtime != "kata" || bad.Workdir != "rel" {
		t.Fatalf("invalid values replaced: %+v", bad)
	}
}

func TestApplyDefaultsIdleFollowsShortLifetime(t *testing.T) {
	s := Sandbox{ID: "a", Image: Image{Host: true}, Session: Session{MaxLifetimeSeconds: i64(30)}}
	s.ApplyDefaults()
	if *s.Session.IdleTimeoutSeconds != 30 {
		t.Fatalf("idle = %d, want 30", *s.Session.IdleTimeoutSeconds)
	}
	if errs := s.Validate(""); len(errs) != 0 {
		t.Fatal(errs)
	}
	// A bad lifetime must not make the defaulted idle timeout bad as well.
	s = Sandbox{Session: Session{MaxLifetimeSeconds: i64(-1)}}
	s.ApplyDefaults()
	if *s.Session.IdleTimeoutSeconds != DefaultIdleTimeoutSeconds {
		t.Fatalf("idle = %d", *s.Session.IdleTimeoutSeconds)
	}
}

func TestApplyDefaultsIdempotentAndUnshared(t *testing.T) {
	st := &Stack{APIVersion: APIVersion, Sandboxes: []Sandbox{{ID: "a", Image: Image{Host: true}}, {ID: "b", Image: Image{Host: true}}}}
	st.ApplyDefaults()
	once := *st
	once.Sandboxes = append([]Sandbox(nil), st.Sandboxes...)
	st.ApplyDefaults()
	if d := cmp.Diff(&once, st); d != "" {
		t.Fatalf("second ApplyDefaults changed (-once +twice):\n%s", d)
	}
	if st.Kind != StackKind || st.APIVersion != APIVersion {
		t.Fatalf("stack fields: %q %q", st.Kind, st.APIVersion)
	}
	*st.Sandboxes[0].Limits.MaxProcesses = 1
	if *st.Sandboxes[1].Limits.MaxProcesses != DefaultMaxProcesses {
		t.Fatal("defaults share pointers between sandboxes")
	}
	empty := &Stack{}
	empty.ApplyDefaults()
	if empty.APIVersion != "" {
		t.Fatal("apiVersion was defaulted")
	}
}

func TestSessionHelpers(t *testing.T) {
	var s Session
	if s.Lifetime() != 3600 || s.IdleTimeout() != 600 || !s.CanReconnect() {
		t.Fatalf("defaults: %d %d %v", s.Lifetime(), s.IdleTimeout(), s.CanReconnect())
	}
	s = Session{MaxLifetimeSeconds: i64(100), Reconnect: ptr(false)}
	if s.Lifetime() != 100 || s.IdleTimeout() != 100 || s.CanReconnect() {
		t.Fatalf("set: %d %d %v", s.Lifetime(), s.IdleTimeout(), s.CanReconnect())
	}
}
