package docker

import "github.com/airlock-sandbox/airlock/capability"

// unsupported is what this backend does not enforce, and why. Everything else it does:
// files, reconnect, env, stdin, pty, background processes and workdir through our agent;
// egress deny (--network none); cpu and memory ceilings (memory-swap equal to memory); the
// pids limit; the disk limit (a read-only root, and one tmpfs of the declared size, mounted on
// the host and bound at the workdir and /tmp); the session lifetime and idle timeout (the
// agent is the container's PID 1 and ends at its deadline or when idle: the kernel kills
// everything else in the container with it, and the engine removes it); labels; images by
// reference, OCI layout or tarball; and the docker runtime itself.
var unsupported = map[capability.Name]string{
	capability.Preview:           "the docker backend has no preview proxy",
	capability.SuspendResume:     "the docker backend does not pause containers",
	capability.Snapshot:          "the docker backend has no snapshots",
	capability.Stats:             "the docker backend does not read a container's usage",
	capability.LiveEgress:        "the docker backend cannot change a container's network while it runs",
	capability.DomainEgressRules: "the docker backend has no egress proxy in the container's network path",
	capability.PublicOnlyEgress:  "the docker backend offers only --network none: a bridge would also reach private and metadata addresses",
	capability.GVisor:            "the docker backend runs the engine's default OCI runtime; use the local runtime with runsc",
	capability.ImageHost:         "a root assembled from the host's /usr needs the local runtime",
	capability.ImageDir:          "a directory root filesystem needs the local runtime",
}

// reasonNoFreezer is why background processes are not held on a host without a v1 freezer
// hierarchy: the agent then kills by process group.
const reasonNoFreezer = "this host has no cgroup v1 freezer hierarchy, so the agent kills an exec or a background process by its process group: a process that calls setsid escapes the kill and runs on until the session ends"

// reasonUserFreezer is why background processes are not held for a user other than root: the
// backend cannot make a session's freezer cgroup in the host's hierarchy.
const reasonUserFreezer = "as a user other than root the docker backend cannot make each session's freezer cgroup, so the agent kills an exec or a background process by its process group: a process that calls setsid escapes the kill and runs on until the session ends"

// reasonUserDisk is why a declared disk limit is not held for a user other than root, and
// userDisk what an undeclared one is instead (capability.Set.PlatformValues).
const (
	reasonUserDisk = "as a user other than root the docker backend cannot mount the one tmpfs of the declared size that the workdir and /tmp share: the engine mounts a tmpfs at each"
	userDisk       = "within the memory limit (the workdir and /tmp are each a tmpfs the engine mounts, held in the sandbox's memory)"
)

// capabilities is the set a backend publishes. freezer is whether the host gives each session
// a v1 freezer cgroup (the agent's kill scope); without one what a kill reaches is weakened.
// asUser is a backend run by a user other than root, which mounts nothing on the host.
func capabilities(freezer, asUser bool) capability.Set {
	s := capability.Set{Platform: capability.Docker, Entries: make(map[capability.Name]capability.Status, len(capability.Names))}
	for _, n := range capability.Names {
		if why, no := unsupported[n]; no {
			s.Entries[n] = capability.Status{Reason: why}
		} else {
			s.Entries[n] = capability.Status{Supported: true}
		}
	}
	switch {
	case asUser:
		s.Entries[capability.BackgroundProcesses] = capability.Status{Reason: reasonUserFreezer}
	case !freezer:
		s.Entries[capability.BackgroundProcesses] = capability.Status{Reason: reasonNoFreezer}
	}
	if asUser {
		s.Entries[capability.DiskLimit] = capability.Status{Reason: reasonUserDisk}
		s.PlatformValues = map[capability.Property]string{capability.PropDisk: userDisk}
	}
	return s
}
