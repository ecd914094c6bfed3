package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/airlock-sandbox/airlock/sandbox"
)

// apiEngine talks to the Docker Engine API (dockerd, or anything serving its API) over a unix socket.
type apiEngine struct {
	host string
	c    *client.Client
}

func newAPIEngine(ctx context.Context, host string) (*apiEngine, error) {
	c, err := client.New(client.WithHost(host), client.WithAPIVersionNegotiation())
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	if _, err := c.Ping(pctx, client.PingOptions{NegotiateAPIVersion: true}); err != nil {
		c.Close()
		return nil, err
	}
	return &apiEngine{host: host, c: c}, nil
}

// rootless: a rootless dockerd lists "name=rootless" among its security options.
func (e *apiEngine) rootless(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	r, err := e.c.Info(ctx, client.InfoOptions{})
	if err != nil {
		return false, e.classify("info", err)
	}
	return hasRootlessOption(r.Info.SecurityOptions), nil
}

// hasRootlessOption reports whether an engine's security options ("name=seccomp,profile=...")
// name rootless.
func hasRootlessOption(opts []string) bool {
	for _, o := range opts {
		for _, kv := range strings.Split(o, ",") {
			if kv == "name=rootless" {
				return true
			}
		}
	}
	return false
}

func (e *apiEngine) describe() string { return "Docker Engine API at " + e.host }
func (e *apiEngine) kind() string     { return "api" }
func (e *apiEngine) close() error     { return e.c.Close() }

// classify maps an engine error to the sandbox error classes.
func (e *apiEngine) classify(what string, err error) error {
	switch {
	case err == nil:
		return nil
	case cerrdefs.IsNotFound(err):
		return fmt.Errorf("%w: %s: %v", sandbox.ErrNotFound, what, err)
	case client.IsErrConnectionFailed(err):
		return fmt.Errorf("%w: %s: %v", sandbox.ErrUnreachable, what, err)
	case cerrdefs.IsInvalidArgument(err):
		return fmt.Errorf("%w: %s: %v", sandbox.ErrInvalid, what, err)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: %s: %v", sandbox.ErrDeadlineExceeded, what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

func (e *apiEngine) imageInspect(ctx context.Context, ref string) (imageInfo, error) {
	r, err := e.c.ImageInspect(ctx, ref)
	if err != nil {
		return imageInfo{}, e.classify("image "+ref, err)
	}
	info := imageInfo{ID: r.ID}
	if r.Config != nil {
		info.Env = r.Config.Env
		info.Volumes = slices.Sorted(maps.Keys(r.Config.Volumes))
	}
	return info, nil
}

func (e *apiEngine) imagePull(ctx context.Context, ref string) error {
	resp, err := e.c.ImagePull(ctx, ref, client.ImagePullOptions{})
	if err != nil {
		return e.classify("pull "+ref, err)
	}
	defer resp.Close()
	// Errors of a pull arrive inside the progress stream.
	for msg, err := range resp.JSONMessages(ctx) {
		if err != nil {
			return e.classify("pull "+ref, err)
		}
		if msg.Error != nil {
			return fmt.Errorf("%w: pull %s: %s", sandbox.ErrUnreachable, ref, msg.Error.Message)
		}
	}
	return nil
}

func (e *apiEngine) imageLoad(ctx context.Context, r io.Reader) error {
	resp, err := e.c.ImageLoad(ctx, r, client.ImageLoadWithQuiet(true))
	if err != nil {
		return e.classify("load image", err)
	}
	defer resp.Close()
	// The load's outcome is in its JSON stream: {"stream": ...} or {"errorDetail": ...}.
	dec := json.NewDecoder(resp)
	for {
		var m struct {
			Error       string `json:"error"`
			ErrorDetail *struct {
				Message string `json:"message"`
			} `json:"errorDetail"`
		}
		if err := dec.Decode(&m); err == io.EOF {
			return nil
		} else if err != nil {
			return fmt.Errorf("load image: reading the engine's answer: %w", err)
		}
		if m.ErrorDetail != nil || m.Error != "" {
			msg := m.Error
			if m.ErrorDetail != nil && m.ErrorDetail.Message != "" {
				msg = m.ErrorDetail.Message
			}
			return fmt.Errorf("%w: load image: %s", sandbox.ErrInvalid, msg)
		}
	}
}

// apiConfigs renders rs as the Engine API's container and host configuration.
func apiConfigs(rs *runSpec) (*container.Config, *container.HostConfig) {
	cfg := &container.Config{
		Image:      rs.Image,
		Labels:     maps.Clone(rs.Labels),
		User:       rs.User,
		Entrypoint: slices.Clone(rs.Entrypoint),
		Cmd:        slices.Clone(rs.Cmd),
		Hostname:   rs.Hostname,
		WorkingDir: rs.WorkingDir,
		Env:        slices.Clone(rs.Env),
		// The image's VOLUMEs are refused before we get here; none may be added implicitly.
		Volumes: map[string]struct{}{},
	}
	pids := rs.PidsLimit
	hc := &container.HostConfig{
		NetworkMode:    container.NetworkMode(rs.Network),
		ReadonlyRootfs: rs.ReadOnlyRoot,
		CapDrop:        slices.Clone(rs.CapDrop),
		CapAdd:         slices.Clone(rs.CapAdd),
		SecurityOpt:    slices.Clone(rs.SecurityOpt),
		AutoRemove:     rs.AutoRemove,
		ShmSize:        rs.ShmBytes,
		Resources: container.Resources{
			Memory:     rs.MemoryBytes,
			MemorySwap: rs.MemorySwapBytes,
			NanoCPUs:   rs.NanoCPUs,
			PidsLimit:  &pids,
		},
	}
	for _, b := range rs.Binds {
		v := b.Source + ":" + b.Target
		if b.ReadOnly {
			v += ":ro"
		}
		hc.Binds = append(hc.Binds, v)
	}
	for _, m := range rs.Tmpfs {
		if hc.Tmpfs == nil {
			hc.Tmpfs = map[string]string{}
		}
		hc.Tmpfs[m.Target] = m.Options
	}
	return cfg, hc
}

func (e *apiEngine) create(ctx context.Context, rs *runSpec) (string, error) {
	cfg, hc := apiConfigs(rs)
	r, err := e.c.ContainerCreate(ctx, client.ContainerCreateOptions{Name: rs.Name, Config: cfg, HostConfig: hc})
	if err != nil {
		return "", e.classify("create container "+rs.Name, err)
	}
	return r.ID, nil
}

func (e *apiEngine) start(ctx context.Context, id string) (func() string, func(), error) {
	// Attached before the start: an auto-removed container takes its logs along when it exits,
	// so what a failing agent printed is only ever seen this way.
	out := &tailBuffer{max: 4 << 10}
	att, err := e.c.ContainerAttach(ctx, id, client.ContainerAttachOptions{Stream: true, Stdout: true, Stderr: true})
	if err != nil {
		return nil, nil, e.classify("attach container "+id, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = stdcopy.StdCopy(out, out, att.Reader)
	}()
	release := func() {
		att.Close()
		<-done
	}
	if _, err := e.c.ContainerStart(ctx, id, client.ContainerStartOptions{}); err != nil {
		release()
		return nil, nil, fmt.Errorf("%w%s", e.classify("start container "+id, err), logTail(out.String()))
	}
	return out.String, release, nil
}

func (e *apiEngine) list(ctx context.Context, labels map[string]string) ([]containerInfo, error) {
	f := client.Filters{}
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		f = f.Add("label", k+"="+labels[k])
	}
	r, err := e.c.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return nil, e.classify("list containers", err)
	}
	out := make([]containerInfo, 0, len(r.Items))
	for _, c := range r.Items {
		out = append(out, containerInfo{ID: c.ID, Labels: c.Labels, Status: string(c.State)})
	}
	return out, nil
}

func (e *apiEngine) remove(ctx context.Context, id string) error {
	_, err := e.c.ContainerRemove(ctx, id, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
	switch {
	case err == nil, cerrdefs.IsNotFound(err):
		return nil
	case cerrdefs.IsConflict(err) && removalInProgress(err.Error()):
		// The auto-remove of an exited container is under way; the caller confirms absence.
		return nil
	}
	return e.classify("remove container "+id, err)
}

// removalInProgress reports whether an engine's refusal to remove a container (msg: the API's
// 409 message, the CLI's stderr) says it is removing it already: "removal of container … is
// already in progress". The Engine API gives every conflict the same status and the moby client
// the same errdefs class (a name in use, a running container, this), and the CLIs only text,
// with no code of its own: the message is the only signal, read here alone.
func removalInProgress(msg string) bool { return strings.Contains(msg, "already in progress") }

func (e *apiEngine) networkInspect(ctx context.Context, name string) (networkInfo, error) {
	r, err := e.c.NetworkInspect(ctx, name, client.NetworkInspectOptions{})
	if err != nil {
		return networkInfo{}, e.classify("network "+name, err)
	}
	return networkInfo{Name: r.Network.Name, Internal: r.Network.Internal}, nil
}
