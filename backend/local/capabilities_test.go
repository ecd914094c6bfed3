package local

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
// a host refusal is never overturned (bar runsc off PATH when Options.RunscPath names one).
func TestCombineCapabilities(t *testing.T) {
	noFreezer := capability.Status{Reason: "no cgroup freezer (v1 freezer controller or v2 cgroup.freeze), which pauses a sandbox"}
	noNet := capability.Status{Reason: "egress filtering needs root with CAP_NET_ADMIN (a veth and nftables rules in the host network namespace)"}
	host := setOf(yes, map[capability.Name]capability.Status{
		capability.EnforcedLimits:    {Reason: "cgroup memory controller not mounted"},
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
		name     string
		runsc    string
		want     map[capability.Name]capability.Status
		maxProcs int64
	}{
		{name: "v1", maxProcs: 1000, want: map[capability.Name]capability.Status{
			capability.Reconnect:         yes,                                       // both
			capability.Files:             backend.Entries[capability.Files],         // backend refuses
			capability.EnforcedLimits:    host.Entries[capability.EnforcedLimits],   // host fact
			capability.Preview:           yes,                                       // both
			capability.DomainEgressRules: noNet,                                     // host fact
			capability.SuspendResume:     noFreezer,                                 // host fact
			capability.PublicOnlyEgress:  noNet,                                     // host fact
			capability.GVisor:            host.Entries[capability.GVisor],           // no runsc anywhere
			capability.IdleTimeout:       host.Entries[capability.IdleTimeout],      // both refuse: the host's reason
			capability.DockerRuntime:     backend.Entries[capability.DockerRuntime], // backend refuses
		}},
		{name: "runsc option", runsc: "/opt/runsc", maxProcs: 1000, want: map[capability.Name]capability.Status{
			capability.GVisor: yes, // the backend found the one Options.RunscPath names
		}},
	} {
		got := combineCapabilities(host, backend, tc.runsc)
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

// TestHostFactsOnly: the host probe gives only host facts: on a host with every fact in place
// it refuses nothing but runtime docker (not the local runtime's at all), and the backend's
// live set is supported only where the probe agrees.
func TestHostFactsOnly(t *testing.T) {
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
	for n, st := range full.Set().Entries {
		if !st.Supported && n != capability.DockerRuntime {
			t.Errorf("a host with every fact refuses %s: %q", n, st.Reason)
		}
		if strings.Contains(st.Reason, "not built") || strings.Contains(st.Reason, "issue") {
			t.Errorf("%s: the host probe speaks of the runtime, not the host: %q", n, st.Reason)
		}
	}
	set := capability.ProbeHost().Set()
	b := newTestBackend(t)
	for n, st := range b.Capabilities(t.Context()).Entries {
		if !st.Supported && st.Reason == "" {
			t.Errorf("%s refused without a reason", n)
		}
		if st.Supported && !set.Entries[n].Supported && !(n == capability.GVisor && set.Entries[n].Reason == runscOffPath) {
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

// TestCachedHostSet: a probe is reused only when fresh and made under the same boot, user, PATH,
// cgroup version and runsc option; anything else probes again and writes the new result back.
func TestCachedHostSet(t *testing.T) {
	dir := t.TempDir()
	key := hostKey{BootID: "boot-1", UID: 0, Path: "/usr/bin"}
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	probes := 0
	probe := func(reason string) func() capability.Set {
		return func() capability.Set {
			probes++
			return setOf(capability.Status{Reason: reason}, nil)
		}
	}
	got := cachedHostSet(dir, now, key, hostProbeTTL, probe("first"))
	if probes != 1 || got.Entries[capability.Files].Reason != "first" {
		t.Fatalf("first call: %d probes, %+v", probes, got.Entries[capability.Files])
	}
	for _, tc := range []struct {
		name   string
		at     time.Time
		key    hostKey
		maxAge time.Duration // 0: hostProbeTTL
		probes int           // total after this call
		reason string        // of the set returned
	}{
		{"fresh, same key", now.Add(hostProbeTTL - time.Second), key, 0, 1, "first"},
		{"expired", now.Add(hostProbeTTL), key, 0, 2, "second"},
		{"fresh again after the rewrite", now.Add(hostProbeTTL + time.Second), key, 0, 2, "second"},
		{"another boot", now.Add(hostProbeTTL + time.Second), hostKey{BootID: "boot-2", Path: "/usr/bin"}, 0, 3, "third"},
		{"another PATH", now.Add(hostProbeTTL + time.Second), hostKey{BootID: "boot-2", Path: "/opt/bin:/usr/bin"}, 0, 4, "fourth"},
		{"another user", now.Add(hostProbeTTL + time.Second), hostKey{BootID: "boot-2", UID: 1000, Path: "/opt/bin:/usr/bin"}, 0, 5, "fifth"},
		{"written in the future", now, hostKey{BootID: "boot-2", UID: 1000, Path: "/opt/bin:/usr/bin"}, 0, 6, "sixth"},
		{"another cgroup version", now, hostKey{BootID: "boot-2", UID: 1000, Path: "/opt/bin:/usr/bin", CgroupVersion: 2}, 0, 7, "seventh"},
		{"another runsc option", now, hostKey{BootID: "boot-2", UID: 1000, Path: "/opt/bin:/usr/bin", CgroupVersion: 2, RunscOption: "/x/runsc"}, 0, 8, "eighth"},
		{"no boot id: never cached", now, hostKey{}, 0, 9, "ninth"},
		{"no boot id again", now, hostKey{}, 0, 10, "tenth"},
		// A one-shot process takes an older one (its follower probes anew past the TTL).
		{"a new key", now, key, 0, 11, "eleventh"},
		{"expired, for a one-shot", now.Add(oneShotProbeMaxAge - time.Second), key, oneShotProbeMaxAge, 11, "eleventh"},
		{"expired, for its follower", now.Add(oneShotProbeMaxAge - time.Second), key, 0, 12, "twelfth"},
		{"too old even for a one-shot", now.Add(2*oneShotProbeMaxAge - time.Second), key, oneShotProbeMaxAge, 13, "thirteenth"},
	} {
		maxAge := tc.maxAge
		if maxAge == 0 {
			maxAge = hostProbeTTL
		}
		got := cachedHostSet(dir, tc.at, tc.key, maxAge, probe([]string{"", "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth", "eleventh", "twelfth", "thirteenth"}[probes+1]))
		if probes != tc.probes || got.Entries[capability.Files].Reason != tc.reason {
			t.Errorf("%s: %d probes and %q, want %d and %q", tc.name, probes, got.Entries[capability.Files].Reason, tc.probes, tc.reason)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, hostProbeFile), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := cachedHostSet(dir, now, key, hostProbeTTL, probe("after corruption")); probes != 14 || got.Entries[capability.Files].Reason != "after corruption" {
		t.Errorf("a corrupt cache was used: %d probes, %q", probes, got.Entries[capability.Files].Reason)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*.tmp")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}
