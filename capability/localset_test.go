package capability

import (
	"strings"
	"testing"
)

// capableHost is a root Linux host with everything the local runtime uses.
func capableHost() HostProbe {
	w := func(dir string) CgroupController { return CgroupController{Version: 1, Dir: dir, Writable: true} }
	return HostProbe{
		OS: "linux", Kernel: "6.1.0", UID: 0, Root: true, CapSysAdmin: true, CapNetAdmin: true,
		Cgroup: CgroupFacts{
			Version: "v1",
			Kernel:  map[string]bool{"cpu": true, "memory": true, "pids": true, "freezer": true},
			Controllers: map[string]CgroupController{
				"cpu": w("/sys/fs/cgroup/cpu"), "memory": w("/sys/fs/cgroup/memory"),
				"pids": w("/sys/fs/cgroup/pids"), "freezer": w("/sys/fs/cgroup/freezer"),
			},
			CPUQuota: true, MemorySwap: true, Freezer: true,
		},
		Seccomp:     SeccompFacts{Supported: true, Filter: true},
		LandlockABI: 6,
		UserNS:      UserNSFacts{Max: 1000},
		Tmpfs:       true,
		NFTables:    Feature{Available: true, Source: "netlink"},
		Veth:        Feature{Available: true, Source: "builtin"},
		Runsc:       "/usr/local/bin/runsc",
		DockerCLI:   "/usr/bin/docker",
	}
}

// capableLocal is what a capable host allows the local runtime: everything but runtime docker,
// which is not the local runtime's (what the runtime itself does is backend/local's to say).
var capableLocal = map[Name]bool{
	Files: true, Reconnect: true, Preview: true, SuspendResume: true, Snapshot: true, Stats: true, LiveEgress: true,
	DomainEgressRules: true, EgressDeny: true, PublicOnlyEgress: true,
	EnforcedLimits: true, ProcessLimit: true, DiskLimit: true,
	SessionLifetime: true, IdleTimeout: true,
	Env: true, Stdin: true, PTY: true, BackgroundProcesses: true,
	GVisor: true, Labels: true, Workdir: true,
	ImageHost: true, ImageOCI: true, ImageRef: true, ImageDir: true, DockerRuntime: false,
}

func TestLocalSetOnCapableHost(t *testing.T) {
	s := capableHost().Set()
	if s.Platform != Local {
		t.Errorf("Platform = %q", s.Platform)
	}
	checkComplete(t, s)
	for n, want := range capableLocal {
		if got := s.Has(n); got != want {
			t.Errorf("%s = %v, want %v (reason %q)", n, got, want, s.Entries[n].Reason)
		}
	}
}

func TestLocalSetFromHostFacts(t *testing.T) {
	f, tr := false, true
	tests := []struct {
		name   string
		mutate func(h *HostProbe)
		// every capability in off is false with a reason containing why; all others as on a
		// capable host.
		off []Name
		why string
	}{
		{"memory controller not mounted", func(h *HostProbe) { delete(h.Cgroup.Controllers, "memory") },
			[]Name{EnforcedLimits}, "cgroup memory controller not mounted"},
		{"memory controller disabled at boot", func(h *HostProbe) {
			delete(h.Cgroup.Controllers, "memory")
			h.Cgroup.Kernel["memory"] = false
		}, []Name{EnforcedLimits}, "disabled at boot"},
		{"memory controller not in the kernel", func(h *HostProbe) {
			delete(h.Cgroup.Controllers, "memory")
			delete(h.Cgroup.Kernel, "memory")
		}, []Name{EnforcedLimits}, "not built into the kernel"},
		{"cpu controller not enabled in cgroup2", func(h *HostProbe) {
			h.Cgroup.Version = "v2"
			delete(h.Cgroup.Controllers, "cpu")
		}, []Name{EnforcedLimits}, "cgroup cpu controller is not enabled in cgroup2"},
		{"no CFS bandwidth", func(h *HostProbe) { h.Cgroup.CPUQuota = false },
			[]Name{EnforcedLimits}, "cpu.cfs_quota_us"},
		{"swap on without memsw", func(h *HostProbe) { h.SwapOn, h.Cgroup.MemorySwap = true, false },
			[]Name{EnforcedLimits}, "memory+swap accounting is off"},
		{"memory cgroup read-only", func(h *HostProbe) {
			c := h.Cgroup.Controllers["memory"]
			c.Writable, c.WriteError = false, "read-only file system"
			h.Cgroup.Controllers["memory"] = c
		}, []Name{EnforcedLimits}, "not writable by uid 0 (read-only file system)"},
		{"pids controller not mounted", func(h *HostProbe) { delete(h.Cgroup.Controllers, "pids") },
			[]Name{ProcessLimit}, "cgroup pids controller not mounted"},
		{"no cgroups at all", func(h *HostProbe) {
			h.Cgroup = CgroupFacts{Version: "none"}
		}, []Name{EnforcedLimits, ProcessLimit, SuspendResume, Snapshot, Stats}, "no cgroup filesystem is mounted"},
		{"no tmpfs", func(h *HostProbe) { h.Tmpfs = false }, []Name{DiskLimit}, "no tmpfs"},
		{"runsc absent", func(h *HostProbe) { h.Runsc = "" }, []Name{GVisor}, "runsc not found on PATH"},
		{"no docker cli", func(h *HostProbe) { h.DockerCLI = "" }, nil, ""},
		{"no freezer", func(h *HostProbe) { h.Cgroup.Freezer = false }, []Name{SuspendResume, Snapshot}, "no cgroup freezer"},
		{"swap on with memsw is fine", func(h *HostProbe) { h.SwapOn = true }, nil, ""},
		{"no landlock is fine", func(h *HostProbe) { h.LandlockABI = 0 }, nil, ""},
		{"not root, unprivileged userns allowed, cgroup delegated", func(h *HostProbe) {
			h.UID, h.Root, h.CapSysAdmin, h.CapNetAdmin = 1000, false, false, false
		}, []Name{PublicOnlyEgress, DomainEgressRules, LiveEgress}, "needs root with CAP_NET_ADMIN"},
		{"root without CAP_NET_ADMIN", func(h *HostProbe) { h.CapNetAdmin = false }, []Name{PublicOnlyEgress, DomainEgressRules, LiveEgress}, "needs root with CAP_NET_ADMIN"},

		// The floor: no sandbox at all, so every capability is false with the same reason.
		{"not linux", func(h *HostProbe) { h.OS = "darwin" }, Names, "needs Linux; this host runs darwin"},
		{"missing pid namespace", func(h *HostProbe) { h.MissingNamespaces = []string{"pid"} }, Names, "lacks pid namespaces"},
		{"user namespaces off", func(h *HostProbe) { h.UserNS.Max = 0 }, Names, "max_user_namespaces = 0"},
		{"unprivileged and debian knob off", func(h *HostProbe) {
			h.Root, h.UID, h.CapSysAdmin = false, 1000, false
			h.UserNS.UnprivilegedClone = &f
		}, Names, "kernel.unprivileged_userns_clone = 0"},
		{"unprivileged and apparmor restriction", func(h *HostProbe) {
			h.Root, h.UID, h.CapSysAdmin = false, 1000, false
			h.UserNS.AppArmorRestrict = &tr
		}, Names, "apparmor_restrict_unprivileged_userns = 1"},
		{"root without CAP_SYS_ADMIN and unprivileged userns off", func(h *HostProbe) {
			h.CapSysAdmin = false
			h.UserNS.UnprivilegedClone = &f
		}, Names, "not root with CAP_SYS_ADMIN"},
		{"no seccomp filter", func(h *HostProbe) { h.Seccomp.Filter = false }, Names, "no seccomp filter mode"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := capableHost()
			tt.mutate(&h)
			s := h.Set()
			checkComplete(t, s)
			off := map[Name]bool{}
			for _, n := range tt.off {
				off[n] = true
				st := s.Entries[n]
				if st.Supported {
					t.Errorf("%s supported, want false because %s", n, tt.why)
				} else if !strings.Contains(st.Reason, tt.why) {
					t.Errorf("%s reason %q, want it to contain %q", n, st.Reason, tt.why)
				}
			}
			for n, want := range capableLocal {
				if off[n] {
					continue
				}
				if got := s.Has(n); got != want {
					t.Errorf("%s = %v, want %v as on a capable host (reason %q)", n, got, want, s.Entries[n].Reason)
				}
			}
		})
	}
}

// The egress reasons name what the host lacks; a capable host has both egress capabilities.
func TestLocalEgressReasons(t *testing.T) {
	if s := capableHost().Set(); !s.Has(PublicOnlyEgress) || !s.Has(DomainEgressRules) {
		t.Errorf("capable host: publicOnlyEgress %+v, domainEgressRules %+v", s.Entries[PublicOnlyEgress], s.Entries[DomainEgressRules])
	}
	tests := []struct {
		name   string
		mutate func(h *HostProbe)
		why    string
	}{
		{"not root", func(h *HostProbe) { h.Root, h.UID, h.CapSysAdmin, h.CapNetAdmin = false, 1000, false, false }, "needs root with CAP_NET_ADMIN"},
		{"no veth", func(h *HostProbe) { h.Veth = Feature{Source: "absent", Detail: "CONFIG_VETH is not set"} }, "no veth support in the kernel (CONFIG_VETH is not set)"},
		{"no nf_tables", func(h *HostProbe) { h.NFTables = Feature{Source: "netlink", Detail: "protocol not supported"} }, "no nf_tables in the kernel"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := capableHost()
			tt.mutate(&h)
			s := h.Set()
			for _, n := range []Name{PublicOnlyEgress, DomainEgressRules} {
				if s.Has(n) || !strings.Contains(s.Entries[n].Reason, tt.why) {
					t.Errorf("%s = %+v, want false with reason containing %q", n, s.Entries[n], tt.why)
				}
			}
			if !s.Has(EgressDeny) {
				t.Errorf("egressDeny false (%q): a network namespace with only loopback needs none of this", s.Entries[EgressDeny].Reason)
			}
		})
	}
}

// checkComplete asserts the set has every name, a reason for every false and none for a true.
func checkComplete(t *testing.T, s Set) {
	t.Helper()
	if len(s.Entries) != len(Names) {
		t.Errorf("%s set has %d entries, want %d", s.Platform, len(s.Entries), len(Names))
	}
	for _, n := range Names {
		st, ok := s.Entries[n]
		switch {
		case !ok:
			t.Errorf("%s set has no entry for %s", s.Platform, n)
		case !st.Supported && st.Reason == "":
			t.Errorf("%s: %s is false without a reason", s.Platform, n)
		case st.Supported && st.Reason != "":
			t.Errorf("%s: %s is true with a reason %q", s.Platform, n, st.Reason)
		}
	}
}
