package kubernetes

import "github.com/airlock-sandbox/airlock/capability"

// unsupported is what a cluster with the airlock operator does not enforce, and why. The
// operator runs pods with our agent, NetworkPolicy for deny and public-only egress, airlock's
// egress proxy in the pod's network path for hostname allowlists (allowDomains), resource
// limits (the disk a memory-backed emptyDir of limits.disk, in memory limits.memory + limits.disk)
// and activeDeadlineSeconds; the agent holds the idle timeout (clock from the claim) and
// the process limit (RLIMIT_NPROC, a code uid per pod).
var unsupported = map[capability.Name]string{
	capability.Preview:       "the preview proxy is designed for the local runtime only (issue 6)",
	capability.SuspendResume: "pods cannot be paused",
	capability.Snapshot:      "snapshots are designed for the local runtime only (issue 6)",
	capability.GVisor:        "the process limit is held in a pod by RLIMIT_NPROC, which the gVisor sentry does not enforce (google/gvisor#169)",
	capability.ImageHost:     "a root assembled from the host's /usr needs the local runtime",
	capability.ImageDir:      "a directory root filesystem needs the local runtime",
	capability.ImageOCI:      "a cluster cannot read a local OCI layout or tarball; push it to a registry the cluster pulls from",
	capability.DockerRuntime: "pods run under the cluster's container runtime",
	// docs/kubernetes.md, kill scope: cgroupfs is read-only in a container.
	capability.BackgroundProcesses: "in a pod the agent has no cgroup it can write, so it kills an exec or a background process by its process group: a process that calls setsid escapes the kill and runs on until the session ends",
	capability.Stats:               "the broker does not report a pod's usage",
	capability.LiveEgress:          "a pod's NetworkPolicy is not changed while it runs",
}

// Published is the set this backend publishes: the operator's, the same for every cluster.
func Published() capability.Set {
	s := capability.Set{Platform: capability.Kubernetes, Entries: make(map[capability.Name]capability.Status, len(capability.Names))}
	for _, n := range capability.Names {
		if why, no := unsupported[n]; no {
			s.Entries[n] = capability.Status{Reason: why}
		} else {
			s.Entries[n] = capability.Status{Supported: true}
		}
	}
	s.Notes = map[capability.Property]string{capability.PropMemory: MemoryNote}
	return s
}

// MemoryNote is how a pod holds limits.memory (plan prints it): the sandbox's writable places
// are one memory-backed emptyDir, so the container's memory limit is raised by limits.disk to
// carry it.
const MemoryNote = "the writable places (workdir, /tmp) are one tmpfs of limits.disk, charged to the pod's memory: " +
	"the container's memory limit is limits.memory + limits.disk, so code that writes no files may use up to that much memory. " +
	"A write past limits.disk fails with ENOSPC"
