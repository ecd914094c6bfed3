package capability

import (
	"fmt"
	"strings"
)

// reasonLocalNoDocker is the one refusal that is not a host fact: the local runtime runs
// sandboxes itself, whatever engine the host has.
const reasonLocalNoDocker = "the local runtime runs sandboxes itself; runtime docker is the docker platform's"

// LocalMaxProcesses is the local backend's own ceiling on maxProcesses: a sandbox's user
// namespace maps 65536 ids.
const LocalMaxProcesses = 65536

// Set maps the host's facts to the local capability set: a capability is false only when the
// host lacks what the local runtime needs for it, and every false names the missing fact.
// What the runtime itself does is backend/local's to say: its Capabilities is this set joined
// with its own, the one truth plan, 'airlock capabilities' and Create read.
func (h HostProbe) Set() Set {
	s := Set{Platform: Local, Entries: make(map[Name]Status, len(Names)), Bounds: Bounds{MaxProcesses: LocalMaxProcesses}}
	if why := h.floorReason(); why != "" {
		// Without its namespaces and syscall filter the runtime makes no sandbox at all.
		for _, n := range Names {
			s.Entries[n] = Status{Reason: why}
		}
		return s
	}
	put := func(n Name, reason string) { s.Entries[n] = Status{Supported: reason == "", Reason: reason} }

	// Done by the agent and the runtime itself on any host that passes the floor.
	for _, n := range []Name{Files, Stdin, PTY, BackgroundProcesses, Env, Workdir, Labels,
		Reconnect, SessionLifetime, IdleTimeout, ImageHost, ImageDir, ImageOCI, ImageRef} {
		put(n, "")
	}
	// The floor includes the network namespace: a sandbox with only loopback.
	put(EgressDeny, "")

	// backend/local wires the egress gateway (veth, nftables, resolver, proxy) where this holds.
	netReason := h.egressHostReason()
	put(PublicOnlyEgress, netReason)
	put(DomainEgressRules, netReason)
	put(LiveEgress, netReason)

	limits := firstReason(
		h.Cgroup.controllerReason("cpu", h.UID),
		h.cpuQuotaReason(),
		h.Cgroup.controllerReason("memory", h.UID),
		h.swapReason(),
	)
	put(EnforcedLimits, limits)
	put(ProcessLimit, h.Cgroup.controllerReason("pids", h.UID))
	if h.Tmpfs {
		put(DiskLimit, "")
		s.Notes = map[Property]string{PropMemory: LocalMemoryNote}
	} else {
		put(DiskLimit, "the kernel has no tmpfs, which bounds a sandbox's writable layer")
	}

	if h.Runsc != "" {
		put(GVisor, "")
	} else {
		put(GVisor, "runsc not found on PATH")
	}
	put(DockerRuntime, reasonLocalNoDocker)

	// The preview proxy listens on the host's loopback: nothing the floor lacks.
	put(Preview, "")
	freezer := ""
	switch {
	case h.Cgroup.Freezer:
	case h.Cgroup.Version == "none":
		freezer = "no cgroup filesystem is mounted"
	default:
		freezer = "no cgroup freezer (v1 freezer controller or v2 cgroup.freeze), which pauses a sandbox"
	}
	put(SuspendResume, freezer)
	// A snapshot is captured with the sandbox frozen.
	put(Snapshot, freezer)
	if h.Cgroup.Version == "none" {
		put(Stats, "no cgroup filesystem is mounted, which counts a sandbox's usage")
	} else {
		put(Stats, "")
	}
	return s
}

// floorReason says why the local runtime cannot make any sandbox here, "" when it can.
func (h HostProbe) floorReason() string {
	switch {
	case h.OS != "linux":
		return "the local runtime needs Linux; this host runs " + h.OS
	case len(h.MissingNamespaces) > 0:
		return "the kernel lacks " + strings.Join(h.MissingNamespaces, ", ") + " namespaces, which every local sandbox needs"
	case h.UserNS.Max == 0:
		return "user namespaces are disabled (user.max_user_namespaces = 0)"
	case !(h.Root && h.CapSysAdmin) && !h.UserNS.Unprivileged():
		knob := "user.max_user_namespaces"
		if h.UserNS.UnprivilegedClone != nil && !*h.UserNS.UnprivilegedClone {
			knob = "kernel.unprivileged_userns_clone = 0"
		} else if h.UserNS.AppArmorRestrict != nil && *h.UserNS.AppArmorRestrict {
			knob = "kernel.apparmor_restrict_unprivileged_userns = 1"
		}
		return "not root with CAP_SYS_ADMIN, and unprivileged user namespaces are disabled (" + knob + ")"
	case !h.Seccomp.Filter:
		return "the kernel has no seccomp filter mode (no /proc/sys/kernel/seccomp/actions_avail), so the sandbox's syscall filter cannot be installed"
	}
	return ""
}

// egressHostReason says why this host cannot filter a sandbox's egress, "" when it can.
func (h HostProbe) egressHostReason() string {
	switch {
	case !(h.Root && h.CapNetAdmin):
		return "egress filtering needs root with CAP_NET_ADMIN (a veth and nftables rules in the host network namespace)"
	case !h.Veth.Available:
		return "no veth support in the kernel (" + h.Veth.Detail + ")"
	case !h.NFTables.Available:
		return "no nf_tables in the kernel (" + h.NFTables.Detail + ")"
	}
	return ""
}

func (h HostProbe) cpuQuotaReason() string {
	if h.Cgroup.CPUQuota {
		return ""
	}
	if h.Cgroup.Version == "v2" {
		return "no CFS bandwidth control (cpu.max) to hold a cpu ceiling"
	}
	return "no CFS bandwidth control (cpu.cfs_quota_us) to hold a cpu ceiling"
}

func (h HostProbe) swapReason() string {
	if h.SwapOn && !h.Cgroup.MemorySwap {
		return "swap is on but memory+swap accounting is off, so a memory ceiling would not bound swap"
	}
	return ""
}

// controllerReason says why controller c cannot hold a limit, "" when it can.
func (cg CgroupFacts) controllerReason(c string, uid int) string {
	ctl, ok := cg.Controllers[c]
	if !ok {
		if cg.Kernel != nil {
			if enabled, known := cg.Kernel[c]; !known {
				return "cgroup " + c + " controller is not built into the kernel"
			} else if !enabled {
				return "cgroup " + c + " controller is disabled at boot (cgroup_disable=)"
			}
		}
		switch cg.Version {
		case "none":
			return "no cgroup filesystem is mounted"
		case "v2":
			return "cgroup " + c + " controller is not enabled in cgroup2 (not in cgroup.controllers)"
		}
		return "cgroup " + c + " controller not mounted"
	}
	if !ctl.Writable {
		why := ctl.WriteError
		if why == "" {
			why = "not checked"
		}
		return fmt.Sprintf("cgroup %s directory %s is not writable by uid %d (%s)", c, ctl.Dir, uid, why)
	}
	return ""
}

func firstReason(reasons ...string) string {
	for _, r := range reasons {
		if r != "" {
			return r
		}
	}
	return ""
}

// LocalMemoryNote is how the local runtime holds limits.memory (plan prints it): its writable
// layer is tmpfs, whose pages are memory charged to the sandbox, so files and processes share
// limits.memory; the code, never the agent, is what the OOM killer takes when they fill it.
const LocalMemoryNote = "the writable layer (limits.disk) is tmpfs, in memory: files written count against limits.memory. " +
	"A write past limits.disk fails with ENOSPC; one that fills the memory first gets its writer OOM-killed (exit 137), never the agent; " +
	"an upload that would is refused (413)"
