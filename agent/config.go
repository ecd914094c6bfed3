// Package agent is the in-sandbox agent: exec, background processes and files behind capability tokens.
package agent

import (
	"fmt"
	"os"
	"path"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
	"github.com/airlock-sandbox/airlock/token"
)

// Version is the agent's build version, reported by health; set with -ldflags -X.
var Version = "dev"

// Config is what the runtime hands the agent (as JSON: durations are nanoseconds).
type Config struct {
	SandboxID  string `json:"sandboxId"`
	SessionID  string `json:"sessionId"`
	Generation uint64 `json:"generation"`
	// KeyRing is the token.KeyRing text form: public keys only; the agent never holds a private key.
	KeyRing string `json:"keyRing"`
	// Listen is "unix:/path/agent.sock" or "tcp:host:port".
	Listen string `json:"listen"`
	// SocketUID, when not 0, is given the unix socket (mode 0600 either way): the uid of a
	// runtime that is not the agent's own (a user's docker backend with a rootful engine).
	SocketUID int `json:"socketUid,omitempty"`
	// FilesRoot is the directory the files API is confined to ("/" inside a sandbox).
	FilesRoot string `json:"filesRoot"`
	Workdir   string `json:"workdir,omitempty"`
	// Policy is the run policy (environment, refused paths, deadlines, output cap, idle
	// timeout), made by wire.NewPolicy for every backend; its fields are inline in the JSON.
	wire.Policy
	// CodeUID and CodeGID are the credentials commands run with. 0/0 means "do not change" and
	// is accepted only with AllowRootCode (tests without root).
	CodeUID       uint32 `json:"codeUid"`
	CodeGID       uint32 `json:"codeGid"`
	AllowRootCode bool   `json:"allowRootCode,omitempty"`
	// CgroupV1Freezer is a v1 freezer cgroup directory the agent creates per-exec children in.
	CgroupV1Freezer string `json:"cgroupV1Freezer,omitempty"`
	// CgroupV1Memory is the v1 memory cgroup whose memory.oom_control oom_kill counter is read.
	CgroupV1Memory string `json:"cgroupV1Memory,omitempty"`
	// CgroupV2 is a delegated cgroup v2 directory the agent creates per-exec children in.
	CgroupV2 string `json:"cgroupV2,omitempty"`
	// MemoryBytes is the sandbox's memory limit (limits.memory) where its files live in memory
	// (tmpfs) and the agent cannot read its cgroup's usage (v2: its cgroup fd is rooted below
	// the limit): an upload is refused before the files would take it (copyIntoMemory).
	MemoryBytes int64 `json:"memoryBytes,omitempty"`
	// ShutdownOnManage enables POST /v1/shutdown (manage class): the agent stops and Serve returns.
	ShutdownOnManage bool `json:"shutdownOnManage,omitempty"`
	// Policy.IdleTimeout ends the agent (Serve returns ErrIdle) once nothing has been active
	// for that long: no authenticated request in flight (exec streams and attaches included),
	// no background process running. Health does not count.
	//
	// IdleFromFirstCall counts idle time from the first authenticated call instead of from the
	// start (a pool pod waits unclaimed; see limits.go).
	IdleFromFirstCall bool `json:"idleFromFirstCall,omitempty"`
	// Deadline ends the agent (Serve returns ErrLifetime) at this time: the session's
	// lifetime, where the agent is the sandbox's PID 1 and nothing else holds it (the docker
	// backend). Zero means none.
	Deadline time.Time `json:"deadline,omitzero"`
	// SpareThreads are OS threads the agent starts at once and keeps idle, where its own threads
	// count against the same process limit as the code (a container's pids limit): code that
	// forks up to the limit must not leave the Go runtime unable to start the thread it needs
	// for a blocking call, which is fatal. Go reuses idle threads before it creates one. 0: none.
	SpareThreads int `json:"spareThreads,omitempty"`
	// MaxProcesses sets RLIMIT_NPROC on the agent, inherited by every command (see limits.go). 0: none.
	MaxProcesses int64 `json:"maxProcesses,omitempty"`
}

// Hooks let the embedding runtime act at points only the agent controls.
type Hooks struct {
	// PrepareSpawnThread runs once on the OS thread every command is forked from (locked with
	// runtime.LockOSThread). Filters installed there (no_new_privs, seccomp, landlock) are per
	// thread and inherited by children, so the agent's other threads stay unfiltered.
	PrepareSpawnThread func() error
	// Ready is called once the listener is open.
	Ready func(addr string)
}

// Limits that are not configuration.
const (
	maxArgs          = 4096
	maxEnv           = 4096
	maxRequestHeader = 1 << 20 // exec request JSON
	ringBufferBytes  = 1 << 20 // background process output kept for attach, at least
	maxProcesses     = 256     // background processes retained (running + exited)
)

// validateEnvName refuses names a process environment cannot carry unambiguously.
func validateEnvName(field, name string) error {
	if !sbtypes.IsEnvName(name) {
		return fmt.Errorf("%w: %s: environment variable name %q must match %s", sbtypes.ErrInvalid, field, name, sbtypes.EnvNamePattern)
	}
	return nil
}

func validateEnvValue(field, name, value string) error {
	if strings.IndexByte(value, 0) >= 0 {
		return fmt.Errorf("%w: %s: value of %q contains a NUL byte", sbtypes.ErrInvalid, field, name)
	}
	return nil
}

// check validates cfg and returns the parsed key ring.
func (cfg *Config) check() (*token.KeyRing, error) {
	bad := func(field, format string, a ...any) error {
		return fmt.Errorf("%w: agent config %s: %s", sbtypes.ErrInvalid, field, fmt.Sprintf(format, a...))
	}
	if cfg.SandboxID == "" {
		return nil, bad("sandboxId", "is empty")
	}
	if cfg.SessionID == "" {
		return nil, bad("sessionId", "is empty")
	}
	ring, err := token.ParseKeyRing([]byte(cfg.KeyRing))
	if err != nil {
		return nil, bad("keyRing", "%v", err)
	}
	if _, _, err := splitListen(cfg.Listen); err != nil {
		return nil, err
	}
	if cfg.FilesRoot == "" || !path.IsAbs(cfg.FilesRoot) {
		return nil, bad("filesRoot", "%q is not an absolute path", cfg.FilesRoot)
	}
	for i, d := range cfg.DenyPaths {
		if !path.IsAbs(d) || path.Clean(d) != d || d == "/" {
			return nil, bad(fmt.Sprintf("denyPaths[%d]", i), "%q must be a clean absolute path other than /", d)
		}
	}
	if cfg.Workdir != "" && !path.IsAbs(cfg.Workdir) {
		return nil, bad("workdir", "%q is not an absolute path", cfg.Workdir)
	}
	for k, v := range cfg.Env {
		if err := validateEnvName("agent config env", k); err != nil {
			return nil, err
		}
		if err := validateEnvValue("agent config env", k, v); err != nil {
			return nil, err
		}
	}
	if cfg.CodeUID == 0 || cfg.CodeGID == 0 {
		if !cfg.AllowRootCode {
			return nil, bad("codeUid/codeGid", "%d/%d: commands must run as a non-root uid and gid (allowRootCode is false)", cfg.CodeUID, cfg.CodeGID)
		}
	}
	if !cfg.AllowRootCode && cfg.CodeUID == uint32(os.Geteuid()) {
		return nil, bad("codeUid", "%d is the agent's own uid: code could signal or ptrace the agent", cfg.CodeUID)
	}
	if cfg.SocketUID < 0 || (cfg.SocketUID != 0 && uint32(cfg.SocketUID) == cfg.CodeUID) {
		return nil, bad("socketUid", "%d: the socket's owner may not be the code's uid (%d) or negative", cfg.SocketUID, cfg.CodeUID)
	}
	if cfg.CgroupV2 != "" && !path.IsAbs(cfg.CgroupV2) {
		return nil, bad("cgroupV2", "%q is not an absolute path", cfg.CgroupV2)
	}
	if cfg.CgroupV1Freezer != "" && !path.IsAbs(cfg.CgroupV1Freezer) {
		return nil, bad("cgroupV1Freezer", "%q is not an absolute path", cfg.CgroupV1Freezer)
	}
	if cfg.CgroupV1Memory != "" && !path.IsAbs(cfg.CgroupV1Memory) {
		return nil, bad("cgroupV1Memory", "%q is not an absolute path", cfg.CgroupV1Memory)
	}
	if cfg.CgroupV2 != "" && cfg.CgroupV1Freezer != "" {
		return nil, bad("cgroupV2", "and cgroupV1Freezer are both set; set the one this sandbox's exec cgroups live in")
	}
	if cfg.MaxTimeout <= 0 {
		return nil, bad("maxTimeout", "%v must be positive", cfg.MaxTimeout)
	}
	if cfg.IdleTimeout < 0 {
		return nil, bad("idleTimeout", "%v is negative (0 means none)", cfg.IdleTimeout)
	}
	if cfg.DefaultOutputCap <= 0 {
		return nil, bad("defaultOutputCap", "%d must be positive", cfg.DefaultOutputCap)
	}
	return ring, nil
}

// splitListen parses "unix:/path" or "tcp:host:port".
func splitListen(l string) (network, addr string, err error) {
	network, addr, ok := strings.Cut(l, ":")
	if !ok || addr == "" || (network != "unix" && network != "tcp") {
		return "", "", fmt.Errorf("%w: agent config listen: %q is not unix:/path or tcp:host:port", sbtypes.ErrInvalid, l)
	}
	if network == "unix" && !path.IsAbs(addr) {
		return "", "", fmt.Errorf("%w: agent config listen: unix socket path %q is not absolute", sbtypes.ErrInvalid, addr)
	}
	return network, addr, nil
}
