package gcp

import "github.com/airlock-sandbox/airlock/capability"

// reasonKillScope is why background processes are not held: inside a launcher sandbox our
// agent has no cgroup it can write, so it kills by process group.
const reasonKillScope = "inside a Cloud Run sandbox the agent has no cgroup it can write, so it kills an exec or a background process by its process group: a process that calls setsid escapes the kill and runs on until the sandbox is deleted"

// Published is the set this backend enforces, wherever the launcher runs: capability's gcp
// design (the launcher's facts) with what running our agent inside changes. Exec, stdin, pty,
// env, workdir and files are the agent's (files without the launcher's 128 KiB argument
// ceiling); egress deny is the launcher's default and open its --allow-egress; the root is
// the hosting image (image: host); every launcher sandbox is gVisor.
func Published() capability.Set {
	s, err := capability.For(capability.GCP)
	if err != nil {
		panic(err) // gcp is a platform capability knows
	}
	s.Entries[capability.BackgroundProcesses] = capability.Status{Reason: reasonKillScope}
	return s
}
