package platform

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/airlock-sandbox/airlock/backend/docker"
	"github.com/airlock-sandbox/airlock/backend/gcp"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// Source says where a capability set came from.
type Source struct {
	// Choice is the platform, and for Auto why it was chosen.
	Choice Choice
	// Instance is set when the set is an opened backend's: what Create on this machine checks.
	Instance bool
	// Text says it in words: "this host's local runtime", "docker engine: ...", "as designed ...".
	Text string
}

// Capabilities is the capability set of the platform c names: an opened backend's when one can
// be opened here (the set its Create checks), else the set its backend publishes. For Auto it
// is the set of the platform Auto opens; when nothing can be opened, the error says why.
func Capabilities(ctx context.Context, c Config) (capability.Set, Source, error) {
	return defaultOpeners.capabilities(ctx, c)
}

func (o openers) capabilities(ctx context.Context, c Config) (capability.Set, Source, error) {
	if c.Logger == nil {
		c.Logger = discard
	}
	// A capabilities read does no upkeep of the local state dir (reconcile is a run's).
	c.Local.OneShot = true
	b, ch, err := o.open(ctx, c)
	if err == nil {
		defer b.Close()
		src := Source{Choice: ch, Instance: true, Text: instanceText(ch)}
		return b.Capabilities(ctx), src, nil
	}
	var none *noPlatformError
	if errors.As(err, &none) {
		// Nothing runs here: plan and capabilities still answer, for this host's local runtime
		// as probed, saying why nothing runs.
		ch.Platform = capability.Local
		set, _ := Published(capability.Local)
		return set, Source{Choice: ch, Text: fmt.Sprintf("probed from this host; nothing can run sandboxes here: local: %s; docker: %s",
			firstLine(none.local.Error()), firstLine(none.docker.Error()))}, nil
	}
	if ch.Auto && ch.PassedOver == "" {
		// The local runtime failed to start for another reason than this host (its state dir):
		// auto stops there, and so do these answers, on the probe.
		ch.Platform, ch.Why = capability.Local, "auto: the local runtime would run here, but cannot start"
		set, _ := Published(capability.Local)
		return set, Source{Choice: ch, Text: publishedText(capability.Local, err)}, nil
	}
	if ch.Auto || errors.Is(err, sandbox.ErrInvalid) && ch.Platform == "" {
		return capability.Set{}, Source{Choice: ch}, err
	}
	set, perr := Published(ch.Platform)
	if ch.Platform == capability.GCP {
		set = publishedGcp(c.Gcp)
	}
	if perr != nil {
		return capability.Set{}, Source{Choice: ch}, perr
	}
	src := Source{Choice: ch, Text: publishedText(ch.Platform, err)}
	return set, src, nil
}

// Published is the set platform p's backend publishes without an instance: local's is probed
// from this host; every other platform's is its backend's own published set.
func Published(p capability.Platform) (capability.Set, error) {
	switch p {
	case capability.Docker:
		return docker.Published(), nil
	case capability.Kubernetes:
		return publishedKubernetes(), nil
	case capability.AWS:
		return publishedAWS(), nil
	case capability.GCP:
		return gcp.Published(), nil
	case capability.Azure:
		return publishedAzure(), nil
	}
	return capability.For(p)
}

func instanceText(ch Choice) string {
	switch ch.Platform {
	case capability.Local:
		return "this host's local runtime"
	case capability.Docker:
		return "docker engine: " + ch.Engine
	case capability.AWS:
		return "the aws backend configured here: " + ch.Engine
	}
	return "the " + string(ch.Platform) + " backend configured here"
}

func publishedText(p capability.Platform, openErr error) string {
	var oe *openError
	if errors.As(openErr, &oe) {
		openErr = oe.err
	}
	switch {
	case p == capability.Local:
		return fmt.Sprintf("probed from this host; the local runtime cannot start here: %s", firstLine(openErr.Error()))
	}
	return fmt.Sprintf("as airlock's %s backend publishes it; none can be opened here: %s", p, firstLine(openErr.Error()))
}

var discard = slog.New(slog.DiscardHandler)
