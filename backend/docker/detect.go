package docker

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/sandbox"
)

// Engine choices for Options.Engine.
const (
	EngineAuto    = ""        // the Engine API if a socket answers, else docker → podman → nerdctl
	EngineAPI     = "api"     // the Docker Engine API only
	EngineDocker  = "docker"  // the docker CLI only
	EnginePodman  = "podman"  // the podman CLI only
	EngineNerdctl = "nerdctl" // the nerdctl CLI only
)

// DefaultHost is where the Engine API is looked for when DOCKER_HOST is unset.
const DefaultHost = "unix:///var/run/docker.sock"

// probeTimeout bounds each detection probe.
const probeTimeout = 15 * time.Second

// cliOrder is the order docker-compatible CLIs are tried in.
var cliOrder = []string{EngineDocker, EnginePodman, EngineNerdctl}

const installHint = "install one: apt-get install docker.io (and start dockerd, e.g. hack/dockerd.sh start), or apt-get install podman"

// reasonRootless is why a user other than root passes a rootless engine over.
const reasonRootless = "a rootless engine: its containers need subordinate ids for the code's uid; as a user other than root the docker backend needs a rootful engine's socket (with subordinate ids the local runtime runs here: docs/rootless.md)"

// detect finds the engine to use. host is the Engine API address ("" → $DOCKER_HOST →
// DefaultHost). asUser (a process other than root) passes rootless engines over. Every
// candidate that was looked at and why it was passed over is named in the error, which wraps
// sandbox.ErrUnsupported when nothing was found.
func detect(ctx context.Context, choice, host string, asUser bool) (engine, error) {
	switch choice {
	case EngineAuto, EngineAPI, EngineDocker, EnginePodman, EngineNerdctl:
	default:
		return nil, fmt.Errorf("%w: engine %q: allowed are \"\" (detect), %s, %s, %s, %s", sandbox.ErrInvalid, choice, EngineAPI, EngineDocker, EnginePodman, EngineNerdctl)
	}
	// The CLIs get only a host the caller chose: left alone, the docker CLI also honours
	// DOCKER_HOST from our environment and its own current context.
	cliHost := host
	if host == "" {
		host = os.Getenv("DOCKER_HOST")
	}
	if host == "" {
		host = DefaultHost
	}
	// usable is e unless asUser and e is rootless, with why not.
	usable := func(e engine, why string) (engine, string) {
		if e == nil || !asUser {
			return e, why
		}
		rootless, err := e.rootless(ctx)
		switch {
		case err != nil:
			why = "found, but whether it is rootless is not known: " + err.Error()
		case rootless:
			why = reasonRootless
		default:
			return e, ""
		}
		e.close()
		return nil, why
	}
	var tried []string
	if choice == EngineAuto || choice == EngineAPI {
		e, why := usable(tryAPI(ctx, host))
		if e != nil {
			return e, nil
		}
		tried = append(tried, "the Docker Engine API at "+host+" ("+why+")")
	}
	for _, name := range cliOrder {
		if choice != EngineAuto && choice != name {
			continue
		}
		e, why := usable(tryCLI(ctx, name, cliHost))
		if e != nil {
			return e, nil
		}
		tried = append(tried, name+" ("+why+")")
	}
	return nil, fmt.Errorf("%w: no container engine found: looked for %s; %s", sandbox.ErrUnsupported, strings.Join(tried, ", "), installHint)
}

// tryAPI returns the API engine at host, or why not.
func tryAPI(ctx context.Context, host string) (engine, string) {
	sock, ok := strings.CutPrefix(host, "unix://")
	if !ok {
		// The agent binary, its config and its socket are host paths bind-mounted into the
		// container: the engine must share this machine's filesystem.
		return nil, "not a unix:// socket: the docker backend bind-mounts host paths and needs an engine on this machine"
	}
	fi, err := os.Stat(sock)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, "no such socket"
	case err != nil:
		return nil, err.Error()
	case fi.Mode().Type() != fs.ModeSocket:
		return nil, "not a socket"
	}
	e, err := newAPIEngine(ctx, host)
	if err != nil {
		return nil, "does not answer: " + err.Error()
	}
	return e, ""
}

// tryCLI returns the CLI engine name if it is on PATH and its engine answers, or why not.
func tryCLI(ctx context.Context, name, host string) (engine, string) {
	p, err := exec.LookPath(name)
	if err != nil {
		return nil, "not on PATH"
	}
	if name == EngineDocker {
		h := host
		if h == "" {
			h = os.Getenv("DOCKER_HOST")
		}
		if h != "" && !strings.HasPrefix(h, "unix://") {
			return nil, "DOCKER_HOST " + h + " is not a unix:// socket: the docker backend bind-mounts host paths and needs an engine on this machine"
		}
	}
	e := &cliEngine{name: name, path: p, env: cliEnv(name, host)}
	if err := e.probe(ctx); err != nil {
		msg := err.Error()
		if i := strings.IndexByte(msg, '\n'); i >= 0 {
			msg = msg[:i]
		}
		return nil, fmt.Sprintf("%s found, but `%s info` failed: %s", p, name, msg)
	}
	return e, ""
}
