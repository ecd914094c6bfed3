package aws

import "github.com/airlock-sandbox/airlock/capability"

// unsupported is what a Lambda MicroVM, as this binding runs it, does not enforce, and why.
// Everything else it does: files, env, stdin, pty and the workdir through our agent (the
// image's guest service); reconnect through GetMicrovm and the endpoint; suspend and resume
// (SuspendMicrovm, ResumeMicrovm); egress deny through a VPC egress connector (refused when none
// is configured: see Backend.Capabilities); the lifetime (maximumDurationInSeconds, at most
// 28800 s); images by reference (the reference the configured MicroVM image was built from).
var unsupported = map[capability.Name]string{
	capability.Preview:           "a MicroVM's endpoint takes its credential only as request headers (X-aws-proxy-auth from CreateMicrovmAuthToken), which a browser opening a preview URL cannot send",
	capability.Snapshot:          "Lambda MicroVMs have no snapshot of a running MicroVM that can start another (their snapshots are the image's)",
	capability.Stats:             "the MicroVM API reports no resource usage of a running MicroVM",
	capability.LiveEgress:        "a MicroVM's network connectors are fixed when it is run: neither suspend nor resume changes them",
	capability.DomainEgressRules: "a Lambda network connector has no hostname allowlist, and the binding puts no egress proxy in the MicroVM's path",
	capability.PublicOnlyEgress:  "without a connector a MicroVM also reaches the instance metadata service at 169.254.169.254, which no connector governs",
	capability.EnforcedLimits:    "MicroVM sizes are memory tiers (baselines 512 MiB to 8 GiB, bursting to 4x with 1 to 16 vCPU), not ceilings: a declared cpu or memory ceiling cannot be held",
	capability.ProcessLimit:      "a MicroVM has no per-sandbox process limit",
	capability.DiskLimit:         "a MicroVM's disk is its tier's (8 GiB up to the 2048 MiB tier), not a declared size",
	capability.IdleTimeout:       "a MicroVM's idle policy counts only inbound traffic through its endpoint (a long command with no input is idle to it) and suspends rather than ends; the binding turns it off",
	// The agent runs in the guest with the image's default capability set (no CAP_SYS_ADMIN,
	// notes/cloud-apis.md §1.6), so it has no cgroup it can write.
	capability.BackgroundProcesses: "in a MicroVM the agent has no cgroup it can write, so it kills an exec or a background process by its process group: a process that calls setsid escapes the kill and runs on until the session ends",
	capability.GVisor:              "a MicroVM is a Firecracker VM: the platform's boundary, not gVisor",
	capability.Labels:              "RunMicrovm takes no labels or tags",
	capability.ImageHost:           "a root assembled from the host's /usr needs the local runtime",
	capability.ImageDir:            "a directory root filesystem needs the local runtime",
	capability.ImageOCI:            "a MicroVM image is built from a Dockerfile: push a local OCI layout or tarball to a registry and declare its reference",
	capability.DockerRuntime:       "runtime docker is a local choice (the docker backend)",
}

// reasonNoConnector is why egress deny is not held by a backend configured without a connector.
const reasonNoConnector = "no VPC egress connector is configured (aws.egressConnector): without one a MicroVM reaches the internet"

// DefaultTier is the memory tier an undeclared size gets.
const DefaultTier = capability.AWSDefaultTier

// platformValues are what undeclared properties become on a MicroVM.
var platformValues = map[capability.Property]string{
	capability.PropCPU:          "platform-sized (" + DefaultTier + ": bursts to 4 vCPU)",
	capability.PropMemory:       "platform-sized (" + DefaultTier + ": 2048 MiB baseline, bursts to 8 GiB)",
	capability.PropDisk:         "platform-sized (" + DefaultTier + ": 8 GiB)",
	capability.PropMaxProcesses: "unbounded within the MicroVM (aws has no process limit)",
	capability.PropIdleTimeout:  "none (the MicroVM lives until its lifetime ends or it is terminated)",
}

// Published is the set this backend publishes (plan and 'airlock capabilities --platform aws'
// without a configured backend): a binding with an egress connector configured.
func Published() capability.Set { return capabilities(true) }

func capabilities(connector bool) capability.Set {
	s := capability.Set{Platform: capability.AWS, Entries: make(map[capability.Name]capability.Status, len(capability.Names)),
		Bounds: capability.Bounds{MaxLifetimeSeconds: capability.AWSMaxLifetimeSeconds}}
	for _, n := range capability.Names {
		if why, no := unsupported[n]; no {
			s.Entries[n] = capability.Status{Reason: why}
		} else {
			s.Entries[n] = capability.Status{Supported: true}
		}
	}
	if !connector {
		s.Entries[capability.EgressDeny] = capability.Status{Reason: reasonNoConnector}
	}
	s.PlatformValues = make(map[capability.Property]string, len(platformValues))
	for k, v := range platformValues {
		s.PlatformValues[k] = v
	}
	return s
}
