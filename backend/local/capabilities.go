package local

import (
	"slices"
	"sync"

	"github.com/airlock-sandbox/airlock/capability"
)

// The published set is one: the host's facts (capability.ProbeHost().Set(): namespaces,
// seccomp, cgroup controllers, cpu quota, swap accounting, tmpfs, veth and nftables, runsc)
// combined with what this backend enforces (probeCapabilities). A capability holds only when
// both say so; the host's reason wins when both refuse, since it is the one to act on.
//
// The one exception is a refusal that is not a host fact at all: the probe's own verdict that
// the local backend has not built a feature yet (hostNotBuilt). The backend knows what it has
// built, so there its answer stands. Any refusal naming a host fact is kept.

// hostNotBuilt are the reasons capability.HostProbe.Set gives for features it believes the
// local backend lacks, whatever the host. TestHostNotBuiltReasons pins them: when the probe
// stops giving one, it goes from here too.
var hostNotBuilt = []string{
	"runsc is on PATH but the local backend does not drive it yet (issue 3)",
	"the preview proxy is not built yet (issue 6)",
	"snapshots are not built yet (issue 6)",
	"the docker runtime is not built yet (issue 5)",
}

// reasonV2NotWired is why the native runtime makes no sandbox on a cgroup v2 host (Create).
const reasonV2NotWired = "the native runtime on a cgroup v2 host is not wired yet (the agent's clone3 into exec cgroups conflicts with the seccomp profile)"

// runscOffPath is the probe's refusal when runsc is not on PATH: Options.RunscPath may name
// one elsewhere, which the backend has checked itself.
const runscOffPath = "runsc not found on PATH"

// combineCapabilities is the published set: host facts and backend enforcement together.
// cgroupVersion is the backend's cgroup driver's; runscOption is Options.RunscPath.
func combineCapabilities(host, backend capability.Set, cgroupVersion int, runscOption string) capability.Set {
	out := capability.Set{Platform: capability.Local, Entries: make(map[capability.Name]capability.Status, len(capability.Names))}
	for _, n := range capability.Names {
		h, okH := host.Entries[n]
		b, okB := backend.Entries[n]
		if !okB {
			b = capability.Status{Reason: "not implemented by the local backend"}
		}
		if !okH {
			h = capability.Status{Reason: "the host probe does not know it"}
		}
		switch {
		case cgroupVersion == 2:
			out.Entries[n] = capability.Status{Reason: reasonV2NotWired}
		case h.Supported && b.Supported:
			out.Entries[n] = capability.Status{Supported: true}
		case !h.Supported && !slices.Contains(hostNotBuilt, h.Reason) &&
			!(n == capability.GVisor && h.Reason == runscOffPath && runscOption != ""):
			out.Entries[n] = h
		case !b.Supported:
			out.Entries[n] = b
		default:
			out.Entries[n] = capability.Status{Supported: true}
		}
	}
	out.Bounds = backend.Bounds
	if m := host.Bounds.MaxProcesses; m > 0 && (out.Bounds.MaxProcesses == 0 || m < out.Bounds.MaxProcesses) {
		out.Bounds.MaxProcesses = m
	}
	return out
}

// capabilitySet starts probing the host (a few milliseconds of /proc, /sys and netlink reads)
// in the background and returns the published set once both halves are known: a process that
// never asks (terminate, list) never waits for it.
func (b *Backend) capabilitySet() func() capability.Set {
	probed := make(chan capability.Set, 1)
	go func() { probed <- capability.ProbeHost().Set() }()
	cg, runsc := b.cg, b.opts.RunscPath
	return sync.OnceValue(func() capability.Set {
		return combineCapabilities(<-probed, probeCapabilities(cg, runsc), cg.version(), runsc)
	})
}
