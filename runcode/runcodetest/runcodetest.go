// Package runcodetest builds the agent and real local backends for the run_code, MCP and CLI tests.
package runcodetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// BuildAgent is testutil.Agent: cmd/airlock-agent built (or $AIRLOCK_TEST_AGENT copied) into
// a fresh directory that the sandbox's mapped root can reach, and a cleanup.
func BuildAgent() (string, func(), error) { return testutil.Agent() }

// Build is testutil.Build: the Go package pkg as a binary named name in a fresh directory.
func Build(pkg, name string) (string, func(), error) { return testutil.Build(pkg, name) }

// StateDir returns a short fresh state directory (unix socket paths are limited to 107
// bytes), removed when the test ends.
func StateDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "al")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// CgroupParent returns a cgroup parent name of the test's own; when the test ends, the
// parent's directories in every hierarchy are removed (they must be empty by then: a
// sandbox left behind makes the test fail).
func CgroupParent(t testing.TB) string {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "airlock-test-" + hex.EncodeToString(b)
	t.Cleanup(func() { RemoveCgroupParent(t, name) })
	return name
}

// RemoveCgroupParent removes name's directory in every cgroup hierarchy where it exists.
func RemoveCgroupParent(t testing.TB, name string) {
	t.Helper()
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", name))
	if d := filepath.Join("/sys/fs/cgroup", name); exists(d) {
		dirs = append(dirs, d)
	}
	for _, d := range dirs {
		if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup %s left behind: %v", d, err)
		}
	}
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// Backend returns a real local backend over a fresh state dir and cgroup parent. When the
// test ends it fails the test for every session still alive (after terminating it), closes
// the backend and removes the cgroup parent.
func Backend(t testing.TB, agentPath string) *local.Backend {
	t.Helper()
	testutil.RequireRoot(t)
	parent := CgroupParent(t)
	b, err := local.New(context.Background(), local.Options{StateDir: StateDir(t), AgentPath: agentPath, CgroupParent: parent})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		list, err := b.List(ctx)
		if err != nil {
			t.Errorf("cleanup: list: %v", err)
		}
		for _, s := range list {
			t.Errorf("sandbox %s (%s) outlived its test", s.ID, s.SandboxID)
			if err := b.Terminate(ctx, s.ID); err != nil {
				t.Errorf("cleanup: terminate %s: %v", s.ID, err)
			}
		}
		b.Close()
	})
	return b
}
