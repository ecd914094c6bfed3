package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/airlock-sandbox/airlock/internal/cli"
	"github.com/airlock-sandbox/airlock/internal/runcli"
	"github.com/airlock-sandbox/airlock/runcode"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// Parked sandboxes for airlock run (docs/pool.md#parked-sandboxes-airlock-run): a run claims a sandbox parked in the state dir by
// an earlier run's filler, and starts a filler that parks the next one.

// parkedMaxAge retires a parked sandbox this old; it lives at most this plus the longest run.
const parkedMaxAge = 5 * time.Minute

// parkedTemplate is the sandbox a parked sandbox for runs with image img is: what runcode.Run would
// declare for them, living long enough for the longest run after parkedMaxAge parked.
func parkedTemplate(img spec.Image) spec.Sandbox {
	t := runcode.PoolTemplate(runcode.Options{Image: img}, parkedMaxAge)
	t.ID = "parked"
	return t
}

// imageKey names img among the parked sandboxes' aliases (runcli.AliasPath): the host image and
// directories as the lean front names them (runcli.ImageKey), any other image by its JSON.
func imageKey(img spec.Image) string {
	switch img.Kind() {
	case spec.ImageHost, spec.ImageDir:
		return runcli.ImageKey(img.Host, img.Dir)
	}
	b, _ := json.Marshal(img)
	return "json:" + string(b)
}

// newFiller is how this run starts the filler of img's parked sandboxes: this executable.
func newFiller(b *cli.BackendFlags, img spec.Image, count int) (runcli.Filler, error) {
	exe, err := os.Executable()
	if err != nil {
		return runcli.Filler{}, err
	}
	imgJSON, err := json.Marshal(img)
	if err != nil {
		return runcli.Filler{}, err
	}
	sd, err := filepath.Abs(b.StateDir)
	if err != nil {
		return runcli.Filler{}, err
	}
	return runcli.Filler{Exe: exe, StateDir: filepath.Clean(sd), CgroupParent: b.CgroupParent, ImageJSON: string(imgJSON), Count: count}, nil
}

// terminateAll terminates sandboxes this process owns when no filler could be started to.
func terminateAll(b sandbox.Backend, ids []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	for _, id := range ids {
		if err := b.Terminate(ctx, id); err != nil {
			errs = append(errs, fmt.Errorf("terminating sandbox %s: %w", id, err))
		}
	}
	return errors.Join(errs...)
}
