package capability

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// ErrUnknownPlatform is wrapped by For and ParsePlatform for a platform with no backend.
var ErrUnknownPlatform = errors.New("unknown platform")

// ParsePlatform returns the platform named s, or an error wrapping ErrUnknownPlatform that
// names the allowed platforms.
func ParsePlatform(s string) (Platform, error) {
	p := Platform(s)
	if slices.Contains(Platforms, p) {
		return p, nil
	}
	return "", unknownPlatform(p)
}

func unknownPlatform(p Platform) error {
	names := make([]string, len(Platforms))
	for i, q := range Platforms {
		names[i] = string(q)
	}
	return fmt.Errorf("%w %q: allowed platforms are %s", ErrUnknownPlatform, string(p), strings.Join(names, ", "))
}

// For returns what platform p enforces. The local set is probed from this host (ProbeHost);
// the others are what our backends for them are designed to enforce (DESIGN.md and the
// issues), because their hosts are not this machine. Every false carries its reason.
func For(p Platform) (Set, error) {
	if p == Local {
		return ProbeHost().Set(), nil
	}
	d, ok := designs()[p]
	if !ok {
		return Set{}, unknownPlatform(p)
	}
	return d.set(p), nil
}

// design is a platform's published set: reasons for what it does not enforce; every name
// not listed is supported.
type design struct {
	unsupported map[Name]string
	bounds      Bounds
}

func (d design) set(p Platform) Set {
	s := Set{Platform: p, Entries: make(map[Name]Status, len(Names)), Bounds: d.bounds}
	for _, n := range Names {
		if why, no := d.unsupported[n]; no {
			s.Entries[n] = Status{Reason: why}
		} else {
			s.Entries[n] = Status{Supported: true}
		}
	}
	return s
}

// Lifetime ceilings of the cloud platforms as our backends use them (the longest session each
// platform's sandbox service lets us keep).
const (
	AWSMaxLifetimeSeconds   = 8 * 3600
	AzureMaxLifetimeSeconds = 4 * 3600
	GCPMaxLifetimeSeconds   = 24 * 3600
)

// Reasons shared by several platforms.
const (
	reasonPreviewLocalOnly  = "the preview proxy is designed for the local runtime only (issue 6)"
	reasonPauseLocalOnly    = "pause/resume is designed for the local runtime only (issue 6)"
	reasonSnapshotLocalOnly = "snapshots are designed for the local runtime only (issue 6)"
	reasonNoHostRoot        = "a root assembled from the host's /usr needs the local runtime"
	reasonNoDirRoot         = "a directory root filesystem needs the local runtime"
	reasonDockerLocal       = "runtime docker is a local choice (the docker backend)"
)

// cloud returns the reasons a cloud platform's design gives for everything that only our
// runtime or a cluster enforces.
func cloud(p string) map[Name]string {
	notDesigned := func(what string) string {
		return "the " + p + " backend's design has no " + what
	}
	return map[Name]string{
		Preview:           reasonPreviewLocalOnly,
		SuspendResume:     reasonPauseLocalOnly,
		Snapshot:          reasonSnapshotLocalOnly,
		DomainEgressRules: notDesigned("egress proxy in the sandbox's network path"),
		EgressDeny:        notDesigned("egress policy: network access is the platform's default"),
		PublicOnlyEgress:  notDesigned("egress policy that keeps private and metadata addresses out"),
		EnforcedLimits:    "sandbox sizes are the platform's, not the declared cpu and memory ceilings",
		ProcessLimit:      notDesigned("process limit"),
		DiskLimit:         notDesigned("disk limit"),
		IdleTimeout:       notDesigned("idle reaper"),
		GVisor:            "the platform chooses its own isolation boundary, not gVisor",
		Labels:            notDesigned("per-sandbox labels"),
		ImageHost:         reasonNoHostRoot,
		ImageDir:          reasonNoDirRoot,
		ImageOCI:          notDesigned("way to load a local OCI layout or tarball"),
		ImageRef:          notDesigned("way to run a declared image: the platform provides the image"),
		DockerRuntime:     reasonDockerLocal,
	}
}

func with(base map[Name]string, extra map[Name]string) map[Name]string {
	for k, v := range extra {
		base[k] = v
	}
	return base
}

// designs is built at first use: its maps are only read for a platform other than this
// host's, and every start of the CLI would pay for them at init.
var designs = sync.OnceValue(func() map[Platform]design {
	return map[Platform]design{
		// backend/docker (issue 5): docker/podman/nerdctl run --rm, --network none unless allowed,
		// memory/cpu/pids limits, read-only root, our agent bind-mounted as the entrypoint; the
		// workdir and /tmp share one host tmpfs of the disk size (so diskLimit holds).
		Docker: {unsupported: map[Name]string{
			Preview:           reasonPreviewLocalOnly,
			SuspendResume:     reasonPauseLocalOnly,
			Snapshot:          reasonSnapshotLocalOnly,
			DomainEgressRules: "the docker backend has no egress proxy in the container's network path",
			PublicOnlyEgress:  "the docker backend offers --network none or a bridge, and a bridge also reaches private addresses",
			Stats:             "the docker backend does not read a container's usage",
			LiveEgress:        "the docker backend cannot change a container's network while it runs",
			GVisor:            "the docker backend does not choose the engine's OCI runtime; use the local runtime with runsc",
			ImageHost:         reasonNoHostRoot,
			ImageDir:          reasonNoDirRoot,
		}},
		// backend/kubernetes + operator (issue 7): pods with our agent, NetworkPolicy for deny and
		// public-only, resource limits, activeDeadlineSeconds; the agent holds the idle timeout
		// (clock from the claim) and the process limit (RLIMIT_NPROC, a code uid per pod).
		Kubernetes: {unsupported: map[Name]string{
			Preview:           reasonPreviewLocalOnly,
			SuspendResume:     "pods cannot be paused",
			Snapshot:          reasonSnapshotLocalOnly,
			DomainEgressRules: "hostname allowlists need the egress proxy in the pod's network path, and the chart deploys none",
			GVisor:            "the process limit is held in a pod by RLIMIT_NPROC, which the gVisor sentry does not enforce (google/gvisor#169)",
			ImageHost:         reasonNoHostRoot,
			ImageDir:          reasonNoDirRoot,
			ImageOCI:          "a cluster cannot read a local OCI layout or tarball; push it to a registry the cluster pulls from",
			DockerRuntime:     "pods run under the cluster's container runtime",
		}},
		// A cloud microVM with our agent as the guest service.
		AWS: {unsupported: cloud("aws"), bounds: Bounds{MaxLifetimeSeconds: AWSMaxLifetimeSeconds}},
		// Azure's session data plane runs code but not our agent, and moves no files.
		Azure: {unsupported: with(cloud("azure"), map[Name]string{
			Files:               "Azure's session data plane has no file transfer",
			Stdin:               "Azure's session data plane takes code, not a stdin stream",
			PTY:                 "Azure's session data plane has no terminal",
			BackgroundProcesses: "Azure's session data plane runs one execution at a time, to completion",
			Env:                 "Azure's session data plane takes code, not a process environment",
			Workdir:             "Azure's session data plane has no working directory setting",
		}), bounds: Bounds{MaxLifetimeSeconds: AzureMaxLifetimeSeconds}},
		// A GCP sandbox lives inside a hosting workload (Sandbox.HostedBy) and runs our agent.
		GCP: {unsupported: cloud("gcp"), bounds: Bounds{MaxLifetimeSeconds: GCPMaxLifetimeSeconds}},
	}
})
