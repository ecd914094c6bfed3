package docker

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// engine is one way of talking to a container engine: the Engine API, or a docker-compatible CLI.
type engine interface {
	// describe names the engine for errors and logs ("Docker Engine API at unix:///...").
	describe() string
	// kind is "api", "docker", "podman" or "nerdctl".
	kind() string
	// imageInspect returns an image present in the engine; an error wrapping sandbox.ErrNotFound
	// when it is absent.
	imageInspect(ctx context.Context, ref string) (imageInfo, error)
	imagePull(ctx context.Context, ref string) error
	// imageLoad loads a docker-archive stream.
	imageLoad(ctx context.Context, r io.Reader) error
	// create creates (without starting) a container and returns its id.
	create(ctx context.Context, rs *runSpec) (string, error)
	// start starts a created container. output returns what the container has printed so far
	// (best effort, for error messages); release stops collecting it.
	start(ctx context.Context, id string) (output func() string, release func(), err error)
	// list returns the containers (in any state) carrying every one of the labels.
	list(ctx context.Context, labels map[string]string) ([]containerInfo, error)
	// remove force-removes a container; an absent container is not an error.
	remove(ctx context.Context, id string) error
	// networkInspect describes a network of the engine; an error wrapping sandbox.ErrNotFound
	// when there is none of that name.
	networkInspect(ctx context.Context, name string) (networkInfo, error)
	// rootless reports whether the engine runs its containers in a user namespace of a user
	// other than root (rootless docker, podman or nerdctl).
	rootless(ctx context.Context) (bool, error)
	close() error
}

// imageInfo is what the backend needs to know about an image.
type imageInfo struct {
	ID      string
	Env     []string
	Volumes []string // the image's VOLUME paths, sorted
}

// networkInfo is what the backend needs to know about a network.
type networkInfo struct {
	Name string
	// Internal networks have no route out of the engine's host (docker network create --internal).
	Internal bool
}

// containerInfo is what the backend needs to know about a container.
type containerInfo struct {
	ID     string
	Labels map[string]string
	// Status is the engine's state word: created, running, paused, restarting, removing,
	// exited, dead (podman also: configured, stopped).
	Status string
}

// bind is a host path mounted into the container.
type bind struct {
	Source, Target string
	ReadOnly       bool
}

// tmpfsMount is a tmpfs the engine mounts in the container; Options are the mount's
// (size=, mode=, uid=, exec ...), as docker's --tmpfs takes them.
type tmpfsMount struct {
	Target, Options string
}

// runSpec is one container to create, engine-neutral: the API and the CLIs both render it, and
// the hardening tests check both renderings.
type runSpec struct {
	Name       string
	Image      string
	Labels     map[string]string
	User       string
	Entrypoint []string
	Cmd        []string
	Hostname   string
	WorkingDir string
	Env        []string
	Binds      []bind
	Tmpfs      []tmpfsMount
	// Network is "none" (egress deny) or, for egress open, an engine network that reaches out:
	// there is no egress proxy in a container's network path to enforce anything between.
	Network     string
	MemoryBytes int64
	// MemorySwapBytes equal to MemoryBytes means no swap on top of the memory limit.
	MemorySwapBytes int64
	NanoCPUs        int64
	PidsLimit       int64
	ShmBytes        int64
	ReadOnlyRoot    bool
	CapDrop         []string
	CapAdd          []string
	SecurityOpt     []string
	AutoRemove      bool
}

// cliCreateArgs renders rs as `<cli> create` arguments for the docker-compatible CLI named by
// kind ("docker", "podman", "nerdctl").
func cliCreateArgs(kind string, rs *runSpec) ([]string, error) {
	if len(rs.Entrypoint) != 1 {
		// --entrypoint takes one executable; the rest goes in the command.
		return nil, fmt.Errorf("entrypoint %q: the CLI takes exactly one executable", rs.Entrypoint)
	}
	a := []string{"create", "--name", rs.Name}
	for _, k := range slices.Sorted(maps.Keys(rs.Labels)) {
		a = append(a, "--label", k+"="+rs.Labels[k])
	}
	a = append(a,
		"--user", rs.User,
		"--entrypoint", rs.Entrypoint[0],
		"--hostname", rs.Hostname,
		"--workdir", rs.WorkingDir,
	)
	for _, e := range rs.Env {
		a = append(a, "--env", e)
	}
	for _, b := range rs.Binds {
		for _, p := range []string{b.Source, b.Target} {
			if strings.ContainsAny(p, ":,") {
				return nil, fmt.Errorf("bind path %q contains ':' or ',', which the CLI's -v syntax cannot carry", p)
			}
		}
		v := b.Source + ":" + b.Target
		if b.ReadOnly {
			v += ":ro"
		}
		a = append(a, "--volume", v)
	}
	for _, m := range rs.Tmpfs {
		a = append(a, "--tmpfs", m.Target+":"+m.Options)
	}
	a = append(a,
		"--network", rs.Network,
		"--memory", strconv.FormatInt(rs.MemoryBytes, 10),
		"--memory-swap", strconv.FormatInt(rs.MemorySwapBytes, 10),
		"--cpus", formatCPUs(rs.NanoCPUs),
		"--pids-limit", strconv.FormatInt(rs.PidsLimit, 10),
		"--shm-size", strconv.FormatInt(rs.ShmBytes, 10),
	)
	if rs.ReadOnlyRoot {
		a = append(a, "--read-only")
		if kind == "podman" {
			// podman's --read-only also mounts writable tmpfs on /run, /tmp and /var/tmp by
			// default: writable space outside the disk limit.
			a = append(a, "--read-only-tmpfs=false")
		}
	}
	for _, c := range rs.CapDrop {
		a = append(a, "--cap-drop", c)
	}
	for _, c := range rs.CapAdd {
		a = append(a, "--cap-add", c)
	}
	for _, o := range rs.SecurityOpt {
		a = append(a, "--security-opt", o)
	}
	if rs.AutoRemove {
		a = append(a, "--rm")
	}
	a = append(a, rs.Image)
	a = append(a, rs.Cmd...)
	return a, nil
}

// tailBuffer keeps the last max bytes written to it; safe for concurrent use.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// formatCPUs renders nano-CPUs as the decimal --cpus takes ("0.25", "2").
func formatCPUs(nano int64) string {
	s := strconv.FormatFloat(float64(nano)/1e9, 'f', 9, 64)
	s = strings.TrimRight(s, "0")
	return strings.TrimSuffix(s, ".")
}
