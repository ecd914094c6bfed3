//go:build linux

package platform

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// openLocal starts the local runtime.
func openLocal(ctx context.Context, c Config) (Backend, string, error) {
	lb, err := Local(ctx, c.Local, c.Logger)
	if err != nil {
		return nil, "", err
	}
	return lb, "", nil
}

// Local starts the local runtime itself, for what exists only there (the parked pool's filler, the process
// pool, gc's reconcile), explaining what to do when this host cannot run it.
func Local(ctx context.Context, c LocalConfig, log *slog.Logger) (*local.Backend, error) {
	extra, err := EgressPublic()
	if err != nil {
		return nil, err
	}
	lb, err := local.New(ctx, local.Options{StateDir: c.StateDir, CgroupParent: c.CgroupParent,
		Logger: log, OneShot: c.OneShot, ImageProgress: c.ImageProgress, Egress: local.EgressOptions{ExtraPublic: extra}})
	switch {
	case err == nil:
		return lb, nil
	case os.Geteuid() != 0 && errors.Is(err, sandbox.ErrUnsupported):
		return nil, fmt.Errorf("%w\nrun airlock as root (sudo), or have root give this user what rootless mode needs (docs/rootless.md)", err)
	case errors.Is(err, sandbox.ErrUnsupported):
		return nil, fmt.Errorf("%w\nsee 'airlock capabilities --platform local' for what this host lacks and why", err)
	}
	return nil, err
}
