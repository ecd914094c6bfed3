package local

import (
	"testing"

	"github.com/airlock-sandbox/airlock/capability"
)

func setOf(def capability.Status, entries map[capability.Name]capability.Status) capability.Set {
	s := capability.Set{Platform: capability.Local, Entries: map[capability.Name]capability.Status{}}
	for _, n := range capability.Names {
		s.Entries[n] = def
	}
	for n, st := range entries {
		s.Entries[n] = st
	}
	return s
}

var yes = capability.Status{Supported: true}

// TestCombineCapabilities: a capability holds only when the host and the backend both say so;
// a host refusal naming a host fact is never overturned, only the probe's own "not built yet".
func TestCombineCapabilities(t *testing.T) {
	noFreezer := capability.Status{Reason: "no cgroup freezer (v1 freezer controller or v2 cgroup.freeze), and pause/resume is not built yet (issue 6)"}
	noNet := capability.Status{Reason: "egress filtering needs root with CAP_NET_ADMIN (a veth and nftables rules in the host network namespace)"}
	host := setOf(yes, map[capability.Name]capability.Status{
		capability.EnforcedLimits:    {Reason: "cgroup memory controller not mounted"},
		capability.Preview:           {Reason: "the preview proxy is not built yet (issue 6)"},
		capability.SuspendResume:     noFreezer,
		capability.PublicOnlyEgress:  noNet,
		capability.DomainEgressRules: noNet,
		capability.GVisor:            {Reason: "runsc not found on PATH"},
		capability.IdleTimeout:       {Reason: "the local backend does not enforce idle timeouts yet (issue 3)"},
	})
	host.Bounds.MaxProcesses = 1000
	backend := setOf(yes, map[capability.Name]capability.Status{
		capability.Files:         {Reason: "backend says no"},
		capability.IdleTimeout:   {Reason: "not enforced by the local backend yet"},
		capability.DockerRuntime: {Reason: "use the docker platform"},
	})
	backend.Bounds.MaxProcesses = idRange

	for _, tc := range []struct {
		name      string
		runsc     string
		want      map[capability.Name]capability.Status
		maxProcs  int64
		cgVersion int
	}{
		{name: "v1", cgVersion: 1, maxProcs: 1000, want: map[capability.Name]capability.Status{
			capability.Reconnect:         yes,                                       // both
			capability.Files:             backend.Entries[capability.Files],         // backend refuses
			capability.EnforcedLimits:    host.Entries[capability.EnforcedLimits],   // host fact
			capability.Preview:           yes,                                       // probe's "not built": the backend built it
			capability.DomainEgressRules: noNet,                                     // host fact
			capability.SuspendResume:     noFreezer,                                 // a host fact joined to "not built": kept
			capability.PublicOnlyEgress:  noNet,                                     // host fact
			capability.GVisor:            host.Entries[capability.GVisor],           // no runsc anywhere
			capability.IdleTimeout:       host.Entries[capability.IdleTimeout],      // both refuse: the host's reason
			capability.DockerRuntime:     backend.Entries[capability.DockerRuntime], // backend refuses
		}},
		{name: "runsc option", cgVersion: 1, runsc: "/opt/runsc", maxProcs: 1000, want: map[capability.Name]capability.Status{
			capability.GVisor: yes, // the backend found the one Options.RunscPath names
		}},
		{name: "v2", cgVersion: 2, maxProcs: 1000, want: map[capability.Name]capability.Status{
			capability.Reconnect: {Reason: reasonV2NotWired},
			capability.Files:     {Reason: reasonV2NotWired},
		}},
	} {
		got := combineCapabilities(host, backend, tc.cgVersion, tc.runsc)
		for n, want := range tc.want {
			if got.Entries[n] != want {
				t.Errorf("%s: %s = %+v, want %+v", tc.name, n, got.Entries[n], want)
			}
		}
		if len(got.Entries) != len(capability.Names) {
			t.Errorf("%s: %d entries, want every capability (%d)", tc.name, len(got.Entries), len(capability.Names))
		}
		if got.Bounds.MaxProcesses != tc.maxProcs {
			t.Errorf("%s: maxProcesses bound %d, want the smaller %d", tc.name, got.Bounds.MaxProcesses, tc.maxProcs)
		}
	}
}

// TestHostNotBuiltReasons pins the probe's "not built" reasons this backend overrides: on a
// host with every fact in place, each is what capability.HostProbe.Set still gives for some
// capability. When the probe stops giving one, this fails and the override goes.
func TestHostNotBuiltReasons(t *testing.T) {
	ctl := func(dir string) capability.CgroupController {
		return capability.CgroupController{Version: 1, Dir: dir, Writable: true}
	}
	full := capability.HostProbe{
		OS: "linux", Root: true, CapSysAdmin: true, CapNetAdmin: true,
		Cgroup: capability.CgroupFacts{Version: "v1", CPUQuota: true, MemorySwap: true, Freezer: true,
			Controllers: map[string]capability.CgroupController{"cpu": ctl("/sys/fs/cgroup/cpu"),
				"memory": ctl("/sys/fs/cgroup/memory"), "pids": ctl("/sys/fs/cgroup/pids")}},
		Seccomp: capability.SeccompFacts{Supported: true, Filter: true},
		UserNS:  capability.UserNSFacts{Max: 1000}, Tmpfs: true,
		NFTables: capability.Feature{Available: true}, Veth: capability.Feature{Available: true},
		Runsc: "/usr/bin/runsc", DockerCLI: "/usr/bin/docker",
	}
	given := map[string]bool{}
	for _, st := range full.Set().Entries {
		given[st.Reason] = true
	}
	for _, r := range hostNotBuilt {
		if !given[r] {
			t.Errorf("the host probe no longer says %q: remove it from hostNotBuilt", r)
		}
	}
	// And the live set: supported only where the probe agrees, bar those reasons.
	set := capability.ProbeHost().Set()
	b := newTestBackend(t)
	for n, st := range b.Capabilities(t.Context()).Entries {
		if !st.Supported && st.Reason == "" {
			t.Errorf("%s refused without a reason", n)
		}
		if st.Supported && !set.Entries[n].Supported && !contains(hostNotBuilt, set.Entries[n].Reason) &&
			!(n == capability.GVisor && set.Entries[n].Reason == runscOffPath) {
			t.Errorf("%s published as supported although the host probe refuses it: %q", n, set.Entries[n].Reason)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
