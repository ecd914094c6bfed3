package docker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/sandbox"
)

// cliEngine drives a docker-compatible command line: docker, podman or nerdctl.
type cliEngine struct {
	name string // docker, podman, nerdctl
	path string // the resolved executable
	env  []string
}

func (e *cliEngine) describe() string { return e.name + " CLI (" + e.path + ")" }
func (e *cliEngine) kind() string     { return e.name }
func (e *cliEngine) close() error     { return nil }

// cliError is a failed command with what it printed.
type cliError struct {
	args   []string
	err    error
	stderr string
}

func (c *cliError) Error() string {
	msg := strings.TrimSpace(c.stderr)
	if len(msg) > 2048 {
		msg = msg[len(msg)-2048:]
	}
	return fmt.Sprintf("%s: %v: %s", strings.Join(c.args, " "), c.err, msg)
}

func (c *cliError) Unwrap() error { return c.err }

// notFound reports whether the CLI said the object does not exist (each CLI words it its own way).
func (c *cliError) notFound() bool {
	s := strings.ToLower(c.stderr)
	for _, w := range []string{"no such", "not found", "does not exist", "not known"} {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}

func (e *cliEngine) run(ctx context.Context, stdin io.Reader, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, e.path, args...)
	cmd.Env = e.env
	cmd.Stdin = stdin
	var out, errb bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &errb
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w: %s %s: %v", sandbox.ErrDeadlineExceeded, e.name, args[0], ctx.Err())
		}
		return nil, &cliError{args: append([]string{e.name}, args...), err: err, stderr: errb.String()}
	}
	return out.Bytes(), nil
}

// probe checks that the engine behind the CLI answers.
func (e *cliEngine) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	_, err := e.run(ctx, nil, "info")
	return err
}

// rootless: podman says so itself; nerdctl is rootless whenever its user is not root (its own
// rule); the docker CLI relays the engine's security options.
func (e *cliEngine) rootless(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	switch e.name {
	case EngineNerdctl:
		return os.Geteuid() != 0, nil
	case EnginePodman:
		out, err := e.run(ctx, nil, "info", "--format", "{{.Host.Security.Rootless}}")
		if err != nil {
			return false, err
		}
		return strings.TrimSpace(string(out)) == "true", nil
	}
	out, err := e.run(ctx, nil, "info", "--format", "{{json .SecurityOptions}}")
	if err != nil {
		return false, err
	}
	var opts []string
	if err := json.Unmarshal(bytes.TrimSpace(out), &opts); err != nil {
		return false, fmt.Errorf("docker info: security options %q: %v", out, err)
	}
	return hasRootlessOption(opts), nil
}

func (e *cliEngine) imageInspect(ctx context.Context, ref string) (imageInfo, error) {
	out, err := e.run(ctx, nil, "image", "inspect", ref)
	if err != nil {
		if ce := (*cliError)(nil); errors.As(err, &ce) && ce.notFound() {
			return imageInfo{}, fmt.Errorf("%w: image %s: %v", sandbox.ErrNotFound, ref, err)
		}
		return imageInfo{}, err
	}
	var imgs []struct {
		ID     string `json:"Id"`
		Config *struct {
			Env     []string            `json:"Env"`
			Volumes map[string]struct{} `json:"Volumes"`
		} `json:"Config"`
	}
	if err := json.Unmarshal(out, &imgs); err != nil {
		return imageInfo{}, fmt.Errorf("%s image inspect %s: %w", e.name, ref, err)
	}
	if len(imgs) != 1 {
		return imageInfo{}, fmt.Errorf("%w: image %s: %s image inspect returned %d images", sandbox.ErrNotFound, ref, e.name, len(imgs))
	}
	info := imageInfo{ID: imgs[0].ID}
	if c := imgs[0].Config; c != nil {
		info.Env = c.Env
		info.Volumes = slices.Sorted(maps.Keys(c.Volumes))
	}
	return info, nil
}

func (e *cliEngine) imagePull(ctx context.Context, ref string) error {
	_, err := e.run(ctx, nil, "pull", ref)
	if err != nil {
		return fmt.Errorf("%w: %v", sandbox.ErrUnreachable, err)
	}
	return nil
}

func (e *cliEngine) imageLoad(ctx context.Context, r io.Reader) error {
	_, err := e.run(ctx, r, "load")
	if err != nil {
		return fmt.Errorf("%w: %v", sandbox.ErrInvalid, err)
	}
	return nil
}

func (e *cliEngine) create(ctx context.Context, rs *runSpec) (string, error) {
	args, err := cliCreateArgs(e.name, rs)
	if err != nil {
		return "", fmt.Errorf("%w: %v", sandbox.ErrInvalid, err)
	}
	out, err := e.run(ctx, nil, args...)
	if err != nil {
		return "", err
	}
	// The id is the last line: some CLIs print pull progress or warnings before it.
	lines := strings.Fields(strings.TrimSpace(string(out)))
	if len(lines) == 0 {
		return "", fmt.Errorf("%s create printed no container id", e.name)
	}
	return lines[len(lines)-1], nil
}

func (e *cliEngine) start(ctx context.Context, id string) (func() string, func(), error) {
	if _, err := e.run(ctx, nil, "start", id); err != nil {
		return nil, nil, fmt.Errorf("%w%s", err, startHint(err))
	}
	// Best effort: an auto-removed container that has exited has no logs any more.
	output := func() string {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		cmd := exec.CommandContext(cctx, e.path, "logs", "--tail", "20", id)
		cmd.Env = e.env
		out, _ := cmd.CombinedOutput()
		return string(out)
	}
	return output, func() {}, nil
}

// startHint explains the start failures an engine's defaults cause on hosts like CI machines.
func startHint(err error) string {
	ce := (*cliError)(nil)
	if !errors.As(err, &ce) {
		return ""
	}
	switch {
	case strings.Contains(ce.stderr, "setrlimit") || strings.Contains(ce.stderr, "error setting rlimit"):
		return "\nhint: the engine's default ulimits exceed what this root may set (it lacks CAP_SYS_RESOURCE); " +
			"for podman set default_ulimits in containers.conf, e.g. [\"nofile=20000:20000\", \"nproc=32768:32768\"]"
	case strings.Contains(ce.stderr, "cgroups in hybrid mode not supported"):
		return "\nhint: crun refuses this host's hybrid cgroup layout; for podman set runtime = \"runc\" in containers.conf"
	}
	return ""
}

// cliContainer is the part of `inspect` the three CLIs print alike.
type cliContainer struct {
	ID    string `json:"Id"`
	State struct {
		Status string `json:"Status"`
	} `json:"State"`
	Config struct {
		Labels map[string]string `json:"Labels"`
	} `json:"Config"`
}

func (e *cliEngine) list(ctx context.Context, labels map[string]string) ([]containerInfo, error) {
	args := []string{"ps", "--all", "--no-trunc", "--quiet"}
	keys := slices.Sorted(maps.Keys(labels))
	for _, k := range keys {
		args = append(args, "--filter", "label="+k+"="+labels[k])
	}
	out, err := e.run(ctx, nil, args...)
	if err != nil {
		return nil, err
	}
	var res []containerInfo
	for _, id := range strings.Fields(string(out)) {
		c, err := e.inspect(ctx, id)
		if err != nil {
			if errors.Is(err, sandbox.ErrNotFound) {
				continue // removed between ps and inspect
			}
			return nil, err
		}
		// Not every CLI applies every filter (nerdctl applies label filters loosely): check.
		match := true
		for _, k := range keys {
			if c.Labels[k] != labels[k] {
				match = false
			}
		}
		if match {
			res = append(res, c)
		}
	}
	sort.Slice(res, func(i, j int) bool { return res[i].ID < res[j].ID })
	return res, nil
}

func (e *cliEngine) inspect(ctx context.Context, id string) (containerInfo, error) {
	out, err := e.run(ctx, nil, "container", "inspect", id)
	if err != nil {
		if ce := (*cliError)(nil); errors.As(err, &ce) && ce.notFound() {
			return containerInfo{}, fmt.Errorf("%w: container %s", sandbox.ErrNotFound, id)
		}
		return containerInfo{}, err
	}
	var cs []cliContainer
	if err := json.Unmarshal(out, &cs); err != nil {
		return containerInfo{}, fmt.Errorf("%s container inspect %s: %w", e.name, id, err)
	}
	if len(cs) != 1 {
		return containerInfo{}, fmt.Errorf("%w: container %s", sandbox.ErrNotFound, id)
	}
	return containerInfo{ID: cs[0].ID, Labels: cs[0].Config.Labels, Status: strings.ToLower(cs[0].State.Status)}, nil
}

func (e *cliEngine) remove(ctx context.Context, id string) error {
	_, err := e.run(ctx, nil, "rm", "--force", id)
	if err == nil {
		return nil
	}
	if ce := (*cliError)(nil); errors.As(err, &ce) && (ce.notFound() || removalInProgress(ce.stderr)) {
		return nil // gone, or its auto-remove is under way: the caller confirms absence
	}
	return err
}

// cliEnv is the environment the CLI runs with: ours, with DOCKER_HOST set when the caller
// chose a host for the docker CLI.
func cliEnv(name, host string) []string {
	env := os.Environ()
	if name == "docker" && host != "" {
		env = append(slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "DOCKER_HOST=") }), "DOCKER_HOST="+host)
	}
	return env
}

func (e *cliEngine) networkInspect(ctx context.Context, name string) (networkInfo, error) {
	out, err := e.run(ctx, nil, "network", "inspect", name)
	if err != nil {
		if ce := (*cliError)(nil); errors.As(err, &ce) && ce.notFound() {
			return networkInfo{}, fmt.Errorf("%w: network %s: %v", sandbox.ErrNotFound, name, err)
		}
		return networkInfo{}, err
	}
	// docker and nerdctl say "Name" and "Internal", podman "name" and "internal"; encoding/json
	// matches either.
	var nets []networkInfo
	if err := json.Unmarshal(out, &nets); err != nil {
		return networkInfo{}, fmt.Errorf("%s network inspect %s: %w", e.name, name, err)
	}
	if len(nets) != 1 {
		return networkInfo{}, fmt.Errorf("%w: network %s: %s network inspect returned %d networks", sandbox.ErrNotFound, name, e.name, len(nets))
	}
	return nets[0], nil
}
