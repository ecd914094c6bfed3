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

// ErrBackendSet is wrapped by For for a platform whose set its backend publishes (docker,
// kubernetes): platform.Published reads it there, so that there is one copy, the backend's.
var ErrBackendSet = errors.New("the set is its backend's")

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
// the clouds' are what our backends for them are designed to enforce (DESIGN.md and the
// issues), because their hosts are not this machine. Every false carries its reason. The docker
// and kubernetes sets are their backends' own (backend/docker, backend/kubernetes, read through
// platform.Published): For refuses them with ErrBackendSet.
func For(p Platform) (Set, error) {
	switch p {
	case Local:
		return ProbeHost().Set(), nil
	case Docker, Kubernetes:
		return Set{}, fmt.Errorf("%w: the %s set is published by backend/%s (platform.Published)", ErrBackendSet, p, p)
	}
	d, ok := designs()[p]
	if !ok {
		return Set{}, unknownPlatform(p)
	}
	return d.set(p), nil
}

// design is a platform's published set: reasons for what it does not enforce (every name not
// listed is supported), its bounds, and what an undeclared property becomes there where the
// platform cannot hold airlock's default.
type design struct {
	unsupported map[Name]string
	bounds      Bounds
	values      map[Property]string
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
	if len(d.values) > 0 {
		s.PlatformValues = make(map[Property]string, len(d.values))
		for k, v := range d.values {
			s.PlatformValues[k] = v
		}
	}
	return s
}

// Ceilings of the cloud platforms as our backends use them.
const (
	// AWSMaxLifetimeSeconds: RunMicrovm's maximumDurationInSeconds is 1 to 28800.
	AWSMaxLifetimeSeconds = 8 * 3600
	// Azure's largest documented sandbox tier (L): 2 cores, 4 GB.
	AzureMaxCPUMillis   = 2000
	AzureMaxMemoryBytes = 4 << 30
)

// AWSDefaultTier is the MicroVM memory tier an undeclared size gets (notes/cloud-apis.md §1.4):
// a 2048 MiB baseline that bursts to 8 GiB and 4 vCPU, with an 8 GiB disk.
const AWSDefaultTier = "aws tier 2048 MiB"

// Reasons shared by several platforms.
const (
	reasonNoHostRoot  = "a root assembled from the host's /usr needs the local runtime"
	reasonNoDirRoot   = "a directory root filesystem needs the local runtime"
	reasonDockerLocal = "runtime docker is a local choice (the docker backend)"
)

// designs is built at first use: its maps are only read for a platform other than this
// host's, and every start of the CLI would pay for them at init.
//
// The cloud sets are what backend/aws, backend/azure and backend/gcp publish, from the services'
// facts in ../shared/notes/cloud-apis.md; each backend's tests hold its set equal to these, so
// plan can read them without opening a backend.
var designs = sync.OnceValue(func() map[Platform]design {
	return map[Platform]design{
		// AWS Lambda MicroVMs (issue 21): backend/aws publishes this set (its Create checks it;
		// a test keeps the two equal). A MicroVM per sandbox, booted from an image built from the
		// declared reference with our agent as its guest service, reached through the MicroVM's
		// authenticated endpoint: exec, files, env, stdin, pty and workdir are the agent's.
		// Reconnect by GetMicrovm; suspend/resume are the service's. Egress deny is a VPC egress
		// connector whose security group lets nothing out; the binding runs MicroVMs without an
		// execution role, so the instance metadata service (169.254.169.254, which no connector
		// governs) holds no credentials.
		AWS: {unsupported: map[Name]string{
			Preview:             "a MicroVM's endpoint takes its credential only as request headers (X-aws-proxy-auth from CreateMicrovmAuthToken), which a browser opening a preview URL cannot send",
			Snapshot:            "Lambda MicroVMs have no snapshot of a running MicroVM that can start another (their snapshots are the image's)",
			Stats:               "the MicroVM API reports no resource usage of a running MicroVM",
			LiveEgress:          "a MicroVM's network connectors are fixed when it is run: neither suspend nor resume changes them",
			DomainEgressRules:   "a Lambda network connector has no hostname allowlist, and the binding puts no egress proxy in the MicroVM's path",
			PublicOnlyEgress:    "without a connector a MicroVM also reaches the instance metadata service at 169.254.169.254, which no connector governs",
			EnforcedLimits:      "MicroVM sizes are memory tiers (baselines 512 MiB to 8 GiB, bursting to 4x with 1 to 16 vCPU), not ceilings: a declared cpu or memory ceiling cannot be held",
			ProcessLimit:        "a MicroVM has no per-sandbox process limit",
			DiskLimit:           "a MicroVM's disk is its tier's (8 GiB up to the 2048 MiB tier), not a declared size",
			IdleTimeout:         "a MicroVM's idle policy counts only inbound traffic through its endpoint (a long command with no input is idle to it) and suspends rather than ends; the binding turns it off",
			BackgroundProcesses: "in a MicroVM the agent has no cgroup it can write, so it kills an exec or a background process by its process group: a process that calls setsid escapes the kill and runs on until the session ends",
			GVisor:              "a MicroVM is a Firecracker VM: the platform's boundary, not gVisor",
			Labels:              "RunMicrovm takes no labels or tags",
			ImageHost:           reasonNoHostRoot,
			ImageDir:            reasonNoDirRoot,
			ImageOCI:            "a MicroVM image is built from a Dockerfile: push a local OCI layout or tarball to a registry and declare its reference",
			DockerRuntime:       reasonDockerLocal,
		}, bounds: Bounds{MaxLifetimeSeconds: AWSMaxLifetimeSeconds},
			values: map[Property]string{
				PropCPU:          "platform-sized (" + AWSDefaultTier + ": bursts to 4 vCPU)",
				PropMemory:       "platform-sized (" + AWSDefaultTier + ": 2048 MiB baseline, bursts to 8 GiB)",
				PropDisk:         "platform-sized (" + AWSDefaultTier + ": 8 GiB)",
				PropMaxProcesses: "unbounded within the MicroVM (aws has no process limit)",
				PropIdleTimeout:  "none (the MicroVM lives until its lifetime ends or it is terminated)",
			}},

		// Azure Container Apps sandboxes (issue 22, backend/azure publishes this set): a
		// hardware-isolated sandbox per declaration in a sandbox group, started from a disk image
		// of the group, sized by free-form cpu and memory within the tiers (XS to L), with a
		// per-sandbox egress policy (defaultAction Deny, host rules) that is replaced while it
		// runs, env at create. Commands run through executeShellCommand under a wrapper that
		// holds the deadline (kills the command's process group), a working directory per
		// command; files through the data plane's file operations and coreutils in the image.
		Azure: {unsupported: map[Name]string{
			Preview:             "the data plane's port operations are not known on the wire, so the azure backend publishes no ports",
			SuspendResume:       "the data plane's suspend operation is not known on the wire (only auto-suspend on idle and resume are)",
			Snapshot:            "the data plane's snapshot operations are not known on the wire",
			Stats:               "the data plane reports no resource usage of a sandbox",
			PublicOnlyEgress:    "Azure's egress policy is not known to refuse private and metadata addresses while allowing the public internet",
			ProcessLimit:        "an Azure sandbox has no process limit",
			DiskLimit:           "an Azure sandbox's disk is its tier's (20 GB, 40 GB at tier L), not a declared size",
			SessionLifetime:     "the data plane has no known per-sandbox wall-clock ceiling (only auto-suspend and auto-delete policies)",
			IdleTimeout:         "the data plane suspends an idle sandbox rather than ending it",
			Stdin:               "executeShellCommand takes a command, not a stdin stream",
			PTY:                 "executeShellCommand has no terminal",
			BackgroundProcesses: "executeShellCommand runs one command to completion; its deadline kills the command's process group, so a process that calls setsid escapes it until the sandbox is terminated",
			GVisor:              "an Azure sandbox is a hardware-isolated microVM: the platform's boundary, not gVisor",
			ImageHost:           reasonNoHostRoot,
			ImageDir:            reasonNoDirRoot,
			ImageOCI:            "an Azure sandbox starts from a disk image of its sandbox group: declare the disk image by name (image: ubuntu)",
			DockerRuntime:       reasonDockerLocal,
		}, bounds: Bounds{MaxCPUMillis: AzureMaxCPUMillis, MaxMemoryBytes: AzureMaxMemoryBytes},
			values: map[Property]string{
				PropDisk:         "platform-sized (azure tier disk: 20 GB, 40 GB at tier L)",
				PropMaxProcesses: "unbounded within the sandbox (azure has no process limit)",
				PropLifetime:     "unbounded (until terminated, or the sandbox group's auto-delete policy)",
				PropIdleTimeout:  "the sandbox group's auto-suspend policy (an idle sandbox is suspended, not ended)",
			}},

		// Cloud Run sandboxes (issue 23): nested gVisor sandboxes started by the launcher CLI
		// inside the Cloud Run instance of the workload that hosts them (Sandbox.HostedBy), with
		// our agent inside (backend/gcp publishes this set, and its Create checks it). The root
		// is the hosting container's own image, read-only (image: host); no network unless
		// --allow-egress (deny holds, open is the flag); no per-sandbox cpu, memory, disk or
		// process limit, no lifetime, no list. Labels are the binding's: it keeps them with the
		// session it holds (the launcher takes none). Background processes hold without a
		// cgroup: the agent kills an exec's whole tree through its subreaper (agent/reaper.go).
		GCP: {unsupported: map[Name]string{
			Reconnect:         "sandbox ids live in one Cloud Run instance and the launcher cannot list them: a caller routed to another instance cannot reattach",
			Preview:           "a Cloud Run sandbox has no ingress or endpoint of its own",
			SuspendResume:     "the launcher cannot pause a sandbox",
			Snapshot:          "the launcher's fork is not durable: it lives and dies with its instance",
			Stats:             "the launcher reports no resource usage of a sandbox",
			LiveEgress:        "--allow-egress is fixed when the launcher creates a sandbox",
			DomainEgressRules: "the launcher's network is all or nothing (--allow-egress): it has no hostname allowlist",
			PublicOnlyEgress:  "--allow-egress is not documented to keep private and metadata addresses out",
			EnforcedLimits:    "Cloud Run sandboxes share their instance's cpu and memory: the launcher has no per-sandbox ceiling",
			ProcessLimit:      "the launcher has no pids limit, and the gVisor sentry does not enforce RLIMIT_NPROC (google/gvisor#169)",
			DiskLimit:         "a sandbox writes only /tmp, in the instance's memory, with no size of its own",
			SessionLifetime:   "the launcher has no lifetime: a sandbox lives until it is deleted or its instance ends",
			IdleTimeout:       "the launcher has no idle timeout",
			ImageRef:          "a Cloud Run sandbox's root is its hosting container's image: declare image: host and put what it needs in the workload's image",
			ImageOCI:          "a Cloud Run sandbox's root is its hosting container's image: declare image: host",
			ImageDir:          "a Cloud Run sandbox's root is its hosting container's image: declare image: host",
			DockerRuntime:     reasonDockerLocal,
		}, values: map[Property]string{
			PropCPU:          "platform-sized (the hosting Cloud Run instance's cpu, shared with the workload and its other sandboxes)",
			PropMemory:       "platform-sized (the hosting Cloud Run instance's memory, shared with the workload and its other sandboxes)",
			PropDisk:         "platform-sized (/tmp only, in the hosting instance's memory)",
			PropMaxProcesses: "unbounded within the sandbox (the launcher has no process limit)",
			PropLifetime:     "until deleted, at most the hosting Cloud Run instance's life",
			PropIdleTimeout:  "none (the launcher has no idle timeout)",
			PropReconnect:    "from the same Cloud Run instance only",
		}},
	}
})
