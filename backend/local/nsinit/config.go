package nsinit

import (
	"encoding/json"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/agent"
)

// File descriptors the host passes to the init stage (exec.Cmd.ExtraFiles order).
const (
	// FDSelf is the agent binary itself: the host execs /proc/self/fd/3 so that the binary's
	// directory need not be reachable by the sandbox's mapped uids.
	FDSelf = 3
	// FDConfig is the read end of the config pipe: the host writes Config as JSON once the
	// child is inside its cgroups, then closes it.
	FDConfig = 4
	// FDStatus is the write end of the status pipe: one JSON Status line, then closed.
	FDStatus = 5
	// FDCgroup (cgroup v2) is the directory the agent makes its per-exec cgroups in, the
	// sandbox cgroup's child "code", as a detached mount rooted there ("..": itself).
	FDCgroup = 6
)

// Root kinds.
const (
	RootHost = "host" // a minimal root assembled from the host's /usr, /lib, /bin and chosen /etc files
	RootDir  = "dir"  // a directory (or unpacked OCI image) as the read-only lower layer
)

// Sandbox paths the runtime owns.
const (
	AirlockDir  = "/.airlock"
	RunDir      = "/.airlock/run"
	AgentSocket = "/.airlock/run/agent.sock"
	RWDir       = "/.airlock/rw"
	CgroupDir   = "/.airlock/cgroup"
	FreezerDir  = "/.airlock/cgroup/freezer"
	MemoryDir   = "/.airlock/cgroup/memory"
	PidsDir     = "/.airlock/cgroup/pids"
	// CodePidsName is the cgroup all code lives in, held to the declared maxProcesses so that a
	// fork bomb leaves the agent its headroom: on v1 a pids child the spawner thread lives in,
	// on v2 the parent of the agent's per-exec cgroups.
	CodePidsName = "code"
)

// Config is everything the init stage needs; the host sends it as JSON on FDConfig.
type Config struct {
	// SessionDir is the host path of the session's state directory: SessionDir/run is bound
	// at /.airlock/run.
	SessionDir string `json:"sessionDir"`
	// RootMount is the host path of an empty directory the new root is mounted on, in this
	// sandbox's own mount namespace (so one directory serves every sandbox); empty means
	// SessionDir/root.
	RootMount string `json:"rootMount,omitempty"`
	Hostname  string `json:"hostname"`
	RootKind  string `json:"rootKind"`
	// RootSource is the host directory of a RootDir root.
	RootSource string `json:"rootSource,omitempty"`
	// EtcDir is the host directory a RootHost root gets as its /etc (read-only): the chosen
	// host files (backend/local/sessions.HostEtc) and the generated ones (GeneratedEtc), prepared by the host.
	EtcDir string `json:"etcDir,omitempty"`
	// Nameserver is the sandbox's only DNS server (its egress gateway), written to
	// /etc/resolv.conf (resolv.go); empty under egress deny, where there is none.
	Nameserver string `json:"nameserver,omitempty"`
	// DiskBytes sizes the tmpfs that holds the workdir and /tmp.
	DiskBytes int64  `json:"diskBytes"`
	Workdir   string `json:"workdir"`
	// Restore is a tar (a host path, readable by the sandbox's root) unpacked into the
	// writable tmpfs before anything runs: a snapshot's content, remapped by the host.
	Restore string `json:"restore,omitempty"`
	// CgroupVersion is 1 or 2: which hierarchies to mount for the agent's per-exec cgroups.
	CgroupVersion int `json:"cgroupVersion"`
	// Deadline is the end of the sandbox's life: init (PID 1) exits then and the kernel kills
	// every process in the pid namespace.
	Deadline time.Time `json:"deadline"`
	// Seccomp is the compiled BPF program (struct sock_filter array, native endianness).
	Seccomp []byte `json:"seccomp"`
	// Agent is the agent's configuration; the listen address and paths are filled in here.
	Agent agent.Config `json:"agent"`
	// Reexec: the host wrote init's id maps after its exec (rootless: only newuidmap and
	// newgidmap can), so init runs without capabilities; it execs itself again, as its user
	// namespace's root now, before anything else (reexec.go).
	Reexec bool `json:"reexec,omitempty"`
	// CgroupCodeDir (v2, rootless) is the host path of the code cgroup, which init makes
	// FDCgroup from (cloneCgroupFD): cloning a mount takes CAP_SYS_ADMIN over the mount
	// namespace, which a rootless host lacks and init has over its own. Empty: the host
	// passed FDCgroup ready.
	CgroupCodeDir string `json:"cgroupCodeDir,omitempty"`
}

// Status is what init reports on FDStatus: ready, or the error that stopped it.
type Status struct {
	Ready bool   `json:"ready,omitempty"`
	Error string `json:"error,omitempty"`
	// LandlockABI is the Landlock ABI version the spawner thread was restricted with (0: none).
	LandlockABI int `json:"landlockAbi,omitempty"`
	// Marks are init's own times, for the create's phases in the host's log (a ready
	// status's only).
	Marks *Marks `json:"marks,omitempty"`
}

// Marks are when init reached its main (the Go runtime started), had read its config, had
// built the root and had the agent serving: Clock readings.
type Marks struct {
	Main   int64 `json:"main"`
	Config int64 `json:"config"`
	Root   int64 `json:"root"`
	Ready  int64 `json:"ready"`
}

// Clock reads CLOCK_MONOTONIC in nanoseconds: one clock for the host and its sandboxes (a
// pid namespace has none of its own, and no time namespace is made).
func Clock() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

func (c *Config) check() error {
	switch c.RootKind {
	case RootHost:
		if c.EtcDir == "" || c.EtcDir[0] != '/' {
			return fmt.Errorf("etcDir %q must be an absolute path for a %q root", c.EtcDir, c.RootKind)
		}
	case RootDir:
		if c.RootSource == "" {
			return fmt.Errorf("rootSource is empty for a %q root", c.RootKind)
		}
	default:
		return fmt.Errorf("rootKind %q is not %q or %q", c.RootKind, RootHost, RootDir)
	}
	if c.RootMount != "" && c.RootMount[0] != '/' {
		return fmt.Errorf("rootMount %q must be an absolute path", c.RootMount)
	}
	if c.SessionDir == "" || c.Workdir == "" || c.Workdir[0] != '/' {
		return fmt.Errorf("sessionDir %q / workdir %q must be absolute paths", c.SessionDir, c.Workdir)
	}
	if c.DiskBytes <= 0 {
		return fmt.Errorf("diskBytes %d must be positive", c.DiskBytes)
	}
	if c.CgroupVersion != 1 && c.CgroupVersion != 2 {
		return fmt.Errorf("cgroupVersion %d is not 1 or 2", c.CgroupVersion)
	}
	if c.CgroupCodeDir != "" && (c.CgroupVersion != 2 || c.CgroupCodeDir[0] != '/') {
		return fmt.Errorf("cgroupCodeDir %q must be an absolute path, on cgroup v2 only", c.CgroupCodeDir)
	}
	if len(c.Seccomp) == 0 || len(c.Seccomp)%8 != 0 {
		return fmt.Errorf("seccomp program is %d bytes, want a non-empty multiple of 8", len(c.Seccomp))
	}
	if c.Deadline.IsZero() {
		return fmt.Errorf("deadline is not set")
	}
	return nil
}

// Encode is the wire form of c.
func (c *Config) Encode() ([]byte, error) { return json.Marshal(c) }
