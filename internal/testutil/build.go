package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Build builds the Go package pkg as a static binary named name in a fresh directory (mode
// 0755: a sandbox's mapped root runs what it holds), returning the path and a cleanup that
// removes the directory.
func Build(pkg, name string) (string, func(), error) {
	bin, cleanup, err := binDir(name)
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0") // static, as DESIGN.md has it: no cgo
	if out, err := cmd.CombinedOutput(); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
	}
	return bin, cleanup, nil
}

// Agent is the agent binary for tests that run sandboxes: a copy of $AIRLOCK_TEST_AGENT when
// set (hack/v2vm builds it beforehand: a go build in its VM costs ~40 s of emulation), else
// cmd/airlock-agent built as it ships.
func Agent() (string, func(), error) {
	pre := os.Getenv("AIRLOCK_TEST_AGENT")
	if pre == "" {
		return Build("github.com/airlock-sandbox/airlock/cmd/airlock-agent", "airlock-agent")
	}
	bin, cleanup, err := binDir("airlock-agent")
	if err != nil {
		return "", nil, err
	}
	raw, err := os.ReadFile(pre)
	if err == nil {
		err = os.WriteFile(bin, raw, 0o755)
	}
	if err != nil {
		cleanup()
		return "", nil, fmt.Errorf("AIRLOCK_TEST_AGENT: %w", err)
	}
	return bin, cleanup, nil
}

// binDir is the path of a binary named name in a fresh directory others can reach.
func binDir(name string) (string, func(), error) {
	dir, err := os.MkdirTemp("", "airlock-bin-")
	if err != nil {
		return "", nil, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	if err := os.Chmod(dir, 0o755); err != nil {
		cleanup()
		return "", nil, err
	}
	return filepath.Join(dir, name), cleanup, nil
}
