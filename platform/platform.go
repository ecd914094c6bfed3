// Package platform is the one place a sandbox backend is chosen and constructed: --platform, $AIRLOCK_PLATFORM, the config file, or auto.
package platform

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/airlock-sandbox/airlock/backend/docker"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// Auto is the platform setting that picks one: the local runtime where this host can run it,
// else a docker-compatible engine.
const Auto = "auto"

// Backend is a backend Open constructed; Close releases it (sandboxes live on).
type Backend interface {
	sandbox.Backend
	Close() error
}

// Config says which platform to open and how to reach it. Settings fills it from the flag,
// the environment and the config file; commands add what only they know (Local, Logger).
type Config struct {
	// Platform is Auto (also when empty), or a capability.Platform name.
	Platform string
	// From names where Platform came from ("--platform", "$AIRLOCK_PLATFORM", the config file's
	// path, or "the default"), for messages.
	From       string
	Local      LocalConfig
	Docker     DockerConfig
	Kubernetes KubernetesConfig
	AWS        AWSConfig
	Azure      AzureConfig
	Gcp        GcpConfig
	Logger     *slog.Logger
}

// LocalConfig places the local runtime.
type LocalConfig struct {
	StateDir, CgroupParent string
	// OneShot is local.Options': the command starts a process that does the state dir's upkeep.
	OneShot bool
	// ImageProgress reports image unpacking (nil: silent).
	ImageProgress func(done, total int64)
}

// DockerConfig chooses the container engine (backend/docker's Options).
type DockerConfig struct {
	// Engine is "" (detect: the Engine API, else docker → podman → nerdctl), api, docker,
	// podman or nerdctl.
	Engine string `json:"engine,omitempty"`
	// Host is the Engine API address (default $DOCKER_HOST, else docker.DefaultHost).
	Host string `json:"host,omitempty"`
	// StateDir is the docker backend's state directory (default docker.DefaultStateDir).
	StateDir string `json:"stateDir,omitempty"`
	// OpenNetwork is the engine network a sandbox with egress open joins (default the
	// engine's own: bridge, or podman's podman).
	OpenNetwork string `json:"openNetwork,omitempty"`
}

// Choice is the platform Open constructed, and why.
type Choice struct {
	Platform capability.Platform
	// Auto is set when the platform setting was Auto.
	Auto bool
	// Engine names a docker backend's engine ("podman CLI (/usr/bin/podman)").
	Engine string
	// Why says where the choice came from and, for Auto, what was passed over and why.
	Why string
	// PassedOver is why Auto did not take the local runtime ("" when it did, or was not Auto).
	PassedOver string
}

// Notice is the line a command prints on stderr once when Auto fell back from the local
// runtime, else "".
func (c Choice) Notice() string {
	if !c.Auto || c.PassedOver == "" {
		return ""
	}
	return fmt.Sprintf("airlock: the local runtime cannot run here (%s); using %s (%s)", c.PassedOver, c.Platform, c.Engine)
}

// Parse returns the platform a setting names: Auto ("" too) or a capability.Platform. The
// error names the allowed values and where the setting came from.
func Parse(s, from string) (string, error) {
	if s == "" || s == Auto {
		return Auto, nil
	}
	if _, err := capability.ParsePlatform(s); err != nil {
		names := []string{Auto}
		for _, p := range capability.Platforms {
			names = append(names, string(p))
		}
		return "", fmt.Errorf("%w: platform %q (from %s): allowed are %s", sandbox.ErrInvalid, s, from, strings.Join(names, ", "))
	}
	return s, nil
}

// Open constructs the backend c names; for Auto, the first that can run here.
func Open(ctx context.Context, c Config) (Backend, Choice, error) {
	return defaultOpeners.open(ctx, c)
}

// opener constructs one platform's backend; engine names a docker engine.
type opener func(ctx context.Context, c Config) (b Backend, engine string, err error)

// openers are the constructors Open uses (tests give Auto others).
type openers struct {
	local, docker, kubernetes opener
	aws, gcp, azure           opener
}

var defaultOpeners = openers{local: openLocal, docker: openDocker, kubernetes: openKubernetes, aws: openAWS, gcp: openGcp, azure: openAzure}

func (o openers) open(ctx context.Context, c Config) (Backend, Choice, error) {
	if c.From == "" {
		c.From = "the default"
	}
	p, err := Parse(c.Platform, c.From)
	if err != nil {
		return nil, Choice{}, err
	}
	if p == Auto {
		return o.auto(ctx, c)
	}
	ch := Choice{Platform: capability.Platform(p), Why: "chosen by " + c.From}
	var op opener
	switch ch.Platform {
	case capability.Local:
		op = o.local
	case capability.Docker:
		op = o.docker
	case capability.Kubernetes:
		op = o.kubernetes
	case capability.AWS:
		op = o.aws
	case capability.Azure:
		op = o.azure
	case capability.GCP:
		op = o.gcp
	default:
		// Parse accepted it, so capability.Platforms gained a platform this switch lacks.
		return nil, ch, fmt.Errorf("%w: platform %s has no opener", sandbox.ErrUnsupported, p)
	}
	b, engine, err := op(ctx, c)
	ch.Engine = engine
	if err != nil {
		return nil, ch, &openError{what: fmt.Sprintf("platform %s (%s)", p, ch.Why), err: err}
	}
	return b, ch, nil
}

// auto opens the local runtime unless this host refuses it (sandbox.ErrUnsupported), else a
// docker-compatible engine; any other failure of the local runtime is returned as it is, since
// falling back would hide a problem the person can fix.
func (o openers) auto(ctx context.Context, c Config) (Backend, Choice, error) {
	ch := Choice{Auto: true, Platform: capability.Local, Why: "auto: the local runtime can run on this host"}
	b, _, lerr := o.local(ctx, c)
	if lerr == nil {
		return b, ch, nil
	}
	if !errors.Is(lerr, sandbox.ErrUnsupported) {
		return nil, ch, lerr
	}
	ch.PassedOver = firstLine(lerr.Error())
	b, engine, derr := o.docker(ctx, c)
	if derr != nil {
		ch.Why = "auto: nothing can run sandboxes here"
		return nil, ch, &noPlatformError{local: lerr, docker: derr}
	}
	ch.Platform, ch.Engine = capability.Docker, engine
	ch.Why = fmt.Sprintf("auto: the local runtime cannot run here (%s); docker can (%s)", ch.PassedOver, engine)
	return b, ch, nil
}

// noPlatformError is auto's failure: neither the local runtime nor docker can run here.
type noPlatformError struct{ local, docker error }

func (e *noPlatformError) Error() string {
	return fmt.Sprintf("%v: no platform can run sandboxes here (auto):\n  local: %v\n  docker: %v\nor give --platform kubernetes with a cluster's broker in the config file ($%s, default %s)",
		sandbox.ErrUnsupported, indent(e.local), indent(e.docker), EnvConfig, DefaultConfigFile)
}

func (e *noPlatformError) Unwrap() error { return sandbox.ErrUnsupported }

// openError is a backend's failure to open, with the platform it was opened as.
type openError struct {
	what string
	err  error
}

func (e *openError) Error() string { return e.what + ": " + e.err.Error() }
func (e *openError) Unwrap() error { return e.err }

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

func indent(err error) string { return strings.ReplaceAll(err.Error(), "\n", "\n    ") }

// openDocker connects to a docker-compatible engine.
func openDocker(ctx context.Context, c Config) (Backend, string, error) {
	db, err := docker.New(ctx, docker.Options{StateDir: c.Docker.StateDir, Engine: c.Docker.Engine, Host: c.Docker.Host, OpenNetwork: c.Docker.OpenNetwork, Logger: c.Logger})
	if err != nil {
		return nil, "", err
	}
	return db, db.Engine(), nil
}
