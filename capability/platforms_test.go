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

// The facts the design documents and ../shared/notes/cloud-apis.md pin; each row is a promise
// a user may rely on.
func TestPublishedFacts(t *testing.T) {
	tests := []struct {
		p    Platform
		n    Name
		want bool
		why  string // substring of the reason when false
	}{
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
		{Docker, PublicOnlyEgress, false, "private and metadata addresses"},
		{Docker, EnforcedLimits, true, ""},
		{Docker, ImageHost, false, "local runtime"},
		{Docker, DockerRuntime, true, ""},
		// AWS Lambda MicroVMs (§1): our agent in the guest; tiers, not ceilings; a VPC egress
		// connector for deny, but link-local metadata outside every connector.
		{AWS, Files, true, ""},
		{AWS, ImageRef, true, ""},
		{AWS, ImageOCI, false, "registry"},
		{AWS, EnforcedLimits, false, "memory tiers"},
		{AWS, EgressDeny, true, ""},
		{AWS, PublicOnlyEgress, false, "169.254.169.254"},
		{AWS, DomainEgressRules, false, "no hostname allowlist"},
		{AWS, LiveEgress, false, "fixed when it is run"},
		{AWS, SessionLifetime, true, ""},
		{AWS, SuspendResume, true, ""},
		{AWS, Preview, false, "request headers"},
		{AWS, IdleTimeout, false, "inbound traffic"},
		{AWS, BackgroundProcesses, false, "process group"},
		{AWS, GVisor, false, "Firecracker"},
		// Azure Container Apps sandboxes (§2): per-sandbox egress policy with host rules, sizes
		// by cpu and memory, files on the data plane, exec without stdin.
		{Azure, Files, true, ""},
		{Azure, Env, true, ""},
		{Azure, EgressDeny, true, ""},
		{Azure, DomainEgressRules, true, ""},
		{Azure, LiveEgress, true, ""},
		{Azure, PublicOnlyEgress, false, "private and metadata"},
		{Azure, EnforcedLimits, true, ""},
		{Azure, DiskLimit, false, "tier"},
		{Azure, SessionLifetime, false, "wall-clock"},
		{Azure, Stdin, false, "executeShellCommand"},
		{Azure, ImageRef, true, ""},
		// Cloud Run's launcher (§3): the hosting container's image, no network by default, no
		// per-sandbox limits, nested gVisor.
		{GCP, ImageHost, true, ""},
		{GCP, ImageRef, false, "hosting container's image"},
		{GCP, EgressDeny, true, ""},
		{GCP, DomainEgressRules, false, "all or nothing"},
		{GCP, EnforcedLimits, false, "share their instance's cpu and memory"},
		{GCP, SessionLifetime, false, "no lifetime"},
		{GCP, Reconnect, false, "another instance"},
		{GCP, GVisor, true, ""},
		{GCP, Files, true, ""},
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
	want := map[Platform]Bounds{
		Local:      {MaxProcesses: LocalMaxProcesses},
		Docker:     {},
		Kubernetes: {},
		AWS:        {MaxLifetimeSeconds: 28800},
		Azure:      {MaxCPUMillis: 2000, MaxMemoryBytes: 4 << 30},
		GCP:        {},
	}
	for p, b := range want {
		s, err := For(p)
		if err != nil {
			t.Fatal(err)
		}
		if s.Bounds != b {
			t.Errorf("%s bounds = %+v, want %+v", p, s.Bounds, b)
		}
	}
}

// governs is the capability that holds each defaulted property's airlock default.
var governs = map[Property]Name{
	PropCPU: EnforcedLimits, PropMemory: EnforcedLimits, PropDisk: DiskLimit, PropMaxProcesses: ProcessLimit,
	PropEgressMode: EgressDeny, PropLifetime: SessionLifetime, PropIdleTimeout: IdleTimeout,
	PropReconnect: Reconnect, PropWorkdir: Workdir,
}

// A platform value stands in only for a default the platform cannot hold, and never for the
// egress mode's; on the platforms whose sets are designed here, every default that cannot be
// held has one (so an undeclared sandbox plans), except the egress deny every one of them holds.
func TestPlatformValues(t *testing.T) {
	if len(governs) != len(Properties) {
		t.Fatalf("governs lists %d properties, Properties %d", len(governs), len(Properties))
	}
	for _, p := range Platforms[1:] {
		s, err := For(p)
		if err != nil {
			t.Fatal(err)
		}
		for prop, v := range s.PlatformValues {
			n, known := governs[prop]
			switch {
			case !known:
				t.Errorf("%s: value for %q, which is not a defaulted property", p, prop)
			case !prop.Replaceable():
				t.Errorf("%s: value for %s, which no platform may replace", p, prop)
			case s.Has(n):
				t.Errorf("%s: value %q for %s, whose default the platform holds (%s)", p, v, prop, n)
			case v == "":
				t.Errorf("%s: empty value for %s", p, prop)
			}
		}
		for _, prop := range Properties {
			if n := governs[prop]; !s.Has(n) && prop.Replaceable() && s.PlatformValues[prop] == "" {
				t.Errorf("%s cannot hold the default %s (%s) and publishes no value for it", p, prop, n)
			}
		}
	}
	if s, _ := For(AWS); !strings.Contains(s.PlatformValues[PropCPU], "platform-sized (aws tier 2048 MiB") {
		t.Errorf("aws cpu platform value %q", s.PlatformValues[PropCPU])
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
