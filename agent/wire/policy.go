package wire

import (
	"maps"
	"slices"
	"strings"
	"time"
)

// Policy is the run policy every agent keeps, whichever backend started it: the environment
// commands start with, the paths the files API refuses, the longest deadline, the output cap a
// request that sets none gets, and the idle timeout. A runtime makes it with NewPolicy, the one
// place these are decided; the agent's configuration carries it (its JSON fields inline).
type Policy struct {
	// Env is every command's base environment; a request's env is laid over it.
	Env map[string]string `json:"env,omitempty"`
	// DenyPaths are absolute sandbox paths the files API refuses, with everything below them.
	DenyPaths []string `json:"denyPaths,omitempty"`
	// MaxTimeout is the longest deadline a command may ask for.
	MaxTimeout time.Duration `json:"maxTimeout"`
	// DefaultOutputCap caps each stream of a command whose request sets no cap.
	DefaultOutputCap int64 `json:"defaultOutputCap"`
	// IdleTimeout ends the agent once nothing has been active for this long (0: none).
	IdleTimeout time.Duration `json:"idleTimeout,omitempty"`
}

// DefaultOutputCap is each stream's output cap where a request sets none, on every agent.
const DefaultOutputCap = 16 << 20

// DefaultPath is commands' PATH unless the image or the declaration sets one.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// kernelPaths are the kernel's filesystems: the files API refuses them in every sandbox.
var kernelPaths = []string{"/dev", "/proc", "/sys"}

// PolicyFor is what a runtime knows of one sandbox that its policy depends on.
type PolicyFor struct {
	// Workdir is the code's working directory, its HOME.
	Workdir string
	// User, when set, is USER: the name of the user code runs as, where the runtime gives it
	// one (a passwd entry); empty where the uid has no name.
	User string
	// ImageEnv is the image's environment (KEY=VALUE), over the defaults.
	ImageEnv []string
	// Env is the declaration's environment, over the image's.
	Env map[string]string
	// Lifetime is the sandbox's lifetime: no command's deadline may be longer.
	Lifetime time.Duration
	// IdleTimeout is the declared idle timeout (0: none); one not shorter than the lifetime
	// can never end the sandbox first and is left out.
	IdleTimeout time.Duration
	// RuntimePaths are the runtime's own paths in the sandbox (the agent's directory, its
	// configuration, files the engine mounts from its own storage): refused by the files API,
	// as the kernel's filesystems are.
	RuntimePaths []string
}

// NewPolicy is the policy of the sandbox p describes.
func NewPolicy(p PolicyFor) Policy {
	env := map[string]string{"PATH": DefaultPath, "HOME": p.Workdir, "LANG": "C.UTF-8"}
	if p.User != "" {
		env["USER"] = p.User
	}
	for _, kv := range p.ImageEnv {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			env[k] = v
		}
	}
	maps.Copy(env, p.Env)
	pol := Policy{
		Env:              env,
		DenyPaths:        slices.Concat(p.RuntimePaths, kernelPaths),
		MaxTimeout:       p.Lifetime,
		DefaultOutputCap: DefaultOutputCap,
	}
	if p.IdleTimeout > 0 && p.IdleTimeout < p.Lifetime {
		pol.IdleTimeout = p.IdleTimeout
	}
	return pol
}
