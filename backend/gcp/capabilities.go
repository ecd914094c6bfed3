package gcp

import "github.com/airlock-sandbox/airlock/capability"

// Published is the set this backend enforces wherever the launcher runs, and the one its
// Create checks: capability's gcp design, which is this binding's (the launcher's facts with
// our agent inside). Exec, stdin, pty, env, workdir and files are the agent's (files without
// the launcher's 128 KiB argument ceiling); egress deny is the launcher's default and open
// its --allow-egress; the root is the hosting image (image: host); every launcher sandbox is
// gVisor. Background processes are held although the agent has no cgroup to kill through:
// each exec runs below a subreaper that kills everything it started (agent/reaper.go), and
// Create refuses an agent that reports a weaker kill scope (waitAgent).
func Published() capability.Set {
	s, err := capability.For(capability.GCP)
	if err != nil {
		panic(err) // gcp is a platform capability knows
	}
	return s
}
