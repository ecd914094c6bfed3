package capability

import (
	"errors"
	"strings"
	"testing"
)

func TestForEveryPlatformIsComplete(t *testing.T) {
	for _, p := range Platforms {
		t.Run(string(p), func(t *testing.T) {
			s, err := For(p)
			if err != nil {
				t.Fatal(err)
			}
			if s.Platform != p {
				t.Errorf("Platform = %q", s.Platform)
			}
			checkComplete(t, s)
		})
	}
}

func TestForUnknownPlatform(t *testing.T) {
	for _, p := range []Platform{"", "LOCAL", "openstack", "k8s"} {
		_, err := For(p)
		if !errors.Is(err, ErrUnknownPlatform) {
			t.Errorf("For(%q) err = %v, want ErrUnknownPlatform", p, err)
			continue
		}
		for _, allowed := range Platforms {
			if !strings.Contains(err.Error(), string(allowed)) {
				t.Errorf("For(%q) error %q does not name %s", p, err, allowed)
			}
		}
		if _, err := ParsePlatform(string(p)); !errors.Is(err, ErrUnknownPlatform) {
			t.Errorf("ParsePlatform(%q) err = %v", p, err)
		}
	}
	for _, p := range Platforms {
		if got, err := ParsePlatform(string(p)); err != nil || got != p {
			t.Errorf("ParsePlatform(%q) = %q, %v", p, got, err)
		}
	}
}

// The facts the design documents pin; each row is a promise a user may rely on.
func TestPublishedFacts(t *testing.T) {
	tests := []struct {
		p    Platform
		n    Name
		want bool
		why  string // substring of the reason when false
	}{
		{Azure, Files, false, "no file transfer"},
		{Azure, Env, false, "not a process environment"},
		{Azure, SessionLifetime, true, ""},
		{Kubernetes, DomainEgressRules, false, "egress proxy in the pod's network path"},
		{Kubernetes, EgressDeny, true, ""},
		{Kubernetes, PublicOnlyEgress, true, ""},
		{Kubernetes, ProcessLimit, true, ""},
		{Kubernetes, IdleTimeout, true, ""},
		{Kubernetes, GVisor, false, "RLIMIT_NPROC"},
		{Kubernetes, SuspendResume, false, "pods cannot be paused"},
		{Kubernetes, ImageRef, true, ""},
		{Kubernetes, ImageOCI, false, "registry"},
		{Docker, EgressDeny, true, ""},
		{Docker, PublicOnlyEgress, false, "private addresses"},
		{Docker, EnforcedLimits, true, ""},
		{Docker, ImageHost, false, "local runtime"},
		{Docker, DockerRuntime, true, ""},
		{AWS, Files, true, ""},
		{AWS, EnforcedLimits, false, "platform's"},
		{GCP, GVisor, false, "its own isolation boundary"},
	}
	for _, tt := range tests {
		s, err := For(tt.p)
		if err != nil {
			t.Fatal(err)
		}
		st := s.Entries[tt.n]
		if st.Supported != tt.want || !strings.Contains(st.Reason, tt.why) {
			t.Errorf("%s %s = %+v, want supported %v with reason containing %q", tt.p, tt.n, st, tt.want, tt.why)
		}
	}
}

func TestBounds(t *testing.T) {
	if s, _ := For(Local); s.Bounds.MaxProcesses != LocalMaxProcesses {
		t.Errorf("local MaxProcesses bound = %d", s.Bounds.MaxProcesses)
	}
	want := map[Platform]int64{Local: 0, Docker: 0, Kubernetes: 0, AWS: 8 * 3600, Azure: 4 * 3600, GCP: 24 * 3600}
	for p, lifetime := range want {
		s, err := For(p)
		if err != nil {
			t.Fatal(err)
		}
		if s.Bounds.MaxLifetimeSeconds != lifetime {
			t.Errorf("%s MaxLifetimeSeconds = %d, want %d", p, s.Bounds.MaxLifetimeSeconds, lifetime)
		}
	}
}

// Every capability is a wire name: unique, and Names lists each constant once.
func TestNamesUnique(t *testing.T) {
	seen := map[Name]bool{}
	for _, n := range Names {
		if seen[n] {
			t.Errorf("%s listed twice", n)
		}
		seen[n] = true
	}
}
