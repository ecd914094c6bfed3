package docker

import "github.com/airlock-sandbox/airlock/capability"

// unsupported is what this backend does not enforce, and why. Everything else it does:
// files, reconnect, env, stdin, pty, background processes and workdir through our agent;
// egress deny (--network none); cpu and memory ceilings (memory-swap equal to memory); the
// pids limit; the disk limit (a read-only root, and one tmpfs of the declared size, mounted on
// the host and bound at the workdir and /tmp); labels; images by reference, OCI layout or
// tarball; and the docker runtime itself.
var unsupported = map[capability.Name]string{
	capability.Preview:           "the docker backend has no preview proxy",
	capability.SuspendResume:     "the docker backend does not pause containers",
	capability.Snapshot:          "the docker backend has no snapshots",
	capability.DomainEgressRules: "the docker backend has no egress proxy in the container's network path",
	capability.PublicOnlyEgress:  "the docker backend offers only --network none: a bridge would also reach private and metadata addresses",
	capability.SessionLifetime:   "the docker backend has no lifetime enforcer: a container lives until it is terminated",
	capability.IdleTimeout:       "the docker backend has no idle reaper",
	capability.GVisor:            "the docker backend runs the engine's default OCI runtime; use the local runtime with runsc",
	capability.ImageHost:         "a root assembled from the host's /usr needs the local runtime",
	capability.ImageDir:          "a directory root filesystem needs the local runtime",
}

// capabilities is the set this backend publishes: what it actually does, independent of the
// engine (the API and the three CLIs are given the same container).
func capabilities() capability.Set {
	s := capability.Set{Platform: capability.Docker, Entries: make(map[capability.Name]capability.Status, len(capability.Names))}
	for _, n := range capability.Names {
		if why, no := unsupported[n]; no {
			s.Entries[n] = capability.Status{Reason: why}
		} else {
			s.Entries[n] = capability.Status{Supported: true}
		}
	}
	return s
}
