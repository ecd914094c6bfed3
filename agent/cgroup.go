package agent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Kill scopes as reported by health: what an exec's kill reaches.
const (
	scopeV1   = "cgroup-v1"
	scopeV2   = "cgroup-v2"
	scopePgrp = "process-group" // honest: a setsid'd descendant escapes it
)

// killTimeout bounds how long a kill may take to empty an exec cgroup before it is an error.
const killTimeout = 30 * time.Second

// cgroups creates one cgroup per exec below the sandbox's and kills through it. The file
// operations are a handful of writes done by hand: the agent is on every sandbox's start-up
// path and must not link a cgroup library's dependency tree (see DESIGN "Start-up is on the
// hot path"); the runtime itself uses containerd/cgroups.
type cgroups struct {
	kind     string
	base     string // parent directory of exec cgroups ("" for process-group)
	memoryV1 string // memory cgroup whose oom_kill counter is read (v1)
}

func newCgroups(cfg *Config) (*cgroups, error) {
	switch {
	case cfg.CgroupV2 != "":
		if _, err := os.Stat(cfg.CgroupV2 + "/cgroup.procs"); err != nil {
			return nil, fmt.Errorf("agent config cgroupV2 %q is not a cgroup v2 directory: %w", cfg.CgroupV2, err)
		}
		return &cgroups{kind: scopeV2, base: cfg.CgroupV2}, nil
	case cfg.CgroupV1Freezer != "":
		if _, err := os.Stat(cfg.CgroupV1Freezer + "/tasks"); err != nil {
			return nil, fmt.Errorf("agent config cgroupV1Freezer %q is not a cgroup v1 directory: %w", cfg.CgroupV1Freezer, err)
		}
		if cfg.CgroupV1Memory != "" {
			if _, err := os.Stat(cfg.CgroupV1Memory + "/memory.oom_control"); err != nil {
				return nil, fmt.Errorf("agent config cgroupV1Memory %q has no memory.oom_control: %w", cfg.CgroupV1Memory, err)
			}
		}
		return &cgroups{kind: scopeV1, base: cfg.CgroupV1Freezer, memoryV1: cfg.CgroupV1Memory}, nil
	}
	return &cgroups{kind: scopePgrp}, nil
}

// oomDetection reports whether exits can be attributed to the OOM killer.
func (c *cgroups) oomDetection() bool {
	switch c.kind {
	case scopeV1:
		return c.memoryV1 != ""
	case scopeV2:
		_, err := os.Stat(c.base + "/memory.events")
		return err == nil
	}
	return false
}

// execGroup is one exec's kill scope.
type execGroup struct {
	kind string
	dir  string // the exec cgroup
	fd   int    // v2: the cgroup directory, for CLONE_INTO_CGROUP
	pgid int    // process-group: set once the leader is spawned
	c    *cgroups
}

func (c *cgroups) create(id string) (*execGroup, error) {
	g := &execGroup{kind: c.kind, fd: -1, c: c}
	if c.kind == scopePgrp {
		return g, nil
	}
	g.dir = c.base + "/exec-" + id
	if err := os.Mkdir(g.dir, 0o755); err != nil {
		return nil, fmt.Errorf("create exec cgroup: %w", err)
	}
	if c.kind == scopeV2 {
		fd, err := unix.Open(g.dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			_ = os.Remove(g.dir)
			return nil, fmt.Errorf("open exec cgroup: %w", err)
		}
		g.fd = fd
	}
	return g, nil
}

// kill kills every process in the group and, for cgroups, returns only once the cgroup is
// empty. It may be called more than once.
func (g *execGroup) kill() error {
	switch g.kind {
	case scopePgrp:
		if g.pgid > 0 {
			if err := unix.Kill(-g.pgid, unix.SIGKILL); err != nil && err != unix.ESRCH {
				return fmt.Errorf("kill process group %d: %w", g.pgid, err)
			}
		}
		return nil
	case scopeV2:
		return g.killV2()
	default:
		return g.killV1()
	}
}

// destroy kills what is left and removes the cgroup.
func (g *execGroup) destroy() error {
	err := g.kill()
	if g.fd >= 0 {
		unix.Close(g.fd)
		g.fd = -1
	}
	if g.dir == "" || err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
	defer cancel()
	for wait := newBackoff(); ; {
		err := unix.Rmdir(g.dir)
		if err == nil || err == unix.ENOENT {
			g.dir = ""
			return nil
		}
		if err != unix.EBUSY {
			return fmt.Errorf("remove exec cgroup %s: %w", g.dir, err)
		}
		// Busy: something entered after the kill (a fork caught mid-flight); kill again.
		if kerr := g.kill(); kerr != nil {
			return kerr
		}
		if !wait.sleep(ctx) {
			return fmt.Errorf("remove exec cgroup %s: still busy after %v", g.dir, killTimeout)
		}
	}
}

func (g *execGroup) killV2() error {
	ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
	defer cancel()
	for wait := newBackoff(); ; {
		pids, err := readPids(g.dir + "/cgroup.procs")
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if err := writeFile(g.dir+"/cgroup.kill", "1"); err != nil {
			return fmt.Errorf("kill exec cgroup %s: %w", g.dir, err)
		}
		if !wait.sleep(ctx) {
			return fmt.Errorf("kill exec cgroup %s: %d processes left after %v", g.dir, len(pids), killTimeout)
		}
	}
}

// killV1 freezes the cgroup so nothing in it can fork while the snapshot of its members is
// killed, then thaws so the pending SIGKILLs are delivered, and repeats until it is empty.
func (g *execGroup) killV1() error {
	ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
	defer cancel()
	self := os.Getpid()
	for wait := newBackoff(); ; {
		pids, err := readPids(g.dir + "/cgroup.procs")
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if err := g.freeze(ctx); err != nil {
			return err
		}
		pids, err = readPids(g.dir + "/cgroup.procs")
		if err != nil {
			return err
		}
		for _, pid := range pids {
			// The spawner thread passes through exec cgroups; the agent never kills itself.
			if pid == self {
				continue
			}
			if err := unix.Kill(pid, unix.SIGKILL); err != nil && err != unix.ESRCH {
				return fmt.Errorf("kill pid %d in %s: %w", pid, g.dir, err)
			}
		}
		if err := writeFile(g.dir+"/freezer.state", "THAWED"); err != nil {
			return fmt.Errorf("thaw exec cgroup %s: %w", g.dir, err)
		}
		if !wait.sleep(ctx) {
			return fmt.Errorf("kill exec cgroup %s: %d processes left after %v", g.dir, len(pids), killTimeout)
		}
	}
}

func (g *execGroup) freeze(ctx context.Context) error {
	for wait := newBackoff(); ; {
		if err := writeFile(g.dir+"/freezer.state", "FROZEN"); err != nil {
			return fmt.Errorf("freeze exec cgroup %s: %w", g.dir, err)
		}
		state, err := os.ReadFile(g.dir + "/freezer.state")
		if err != nil {
			return fmt.Errorf("freeze exec cgroup %s: %w", g.dir, err)
		}
		if strings.TrimSpace(string(state)) == "FROZEN" {
			return nil
		}
		if !wait.sleep(ctx) {
			return fmt.Errorf("freeze exec cgroup %s: still %s after %v", g.dir, bytes.TrimSpace(state), killTimeout)
		}
	}
}

// oomKills reads the OOM-kill counter that covers this exec; ok is false when none does.
func (g *execGroup) oomKills() (n uint64, ok bool) {
	var name, key string
	switch g.kind {
	case scopeV1:
		if g.c.memoryV1 == "" {
			return 0, false
		}
		name, key = g.c.memoryV1+"/memory.oom_control", "oom_kill"
	case scopeV2:
		// The exec's own counter exists only when the memory controller is enabled below the
		// sandbox; the sandbox-wide one is the fallback.
		name, key = g.dir+"/memory.events", "oom_kill"
		if _, err := os.Stat(name); err != nil {
			name = g.c.base + "/memory.events"
		}
	default:
		return 0, false
	}
	f, err := os.Open(name)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	n, ok, err = parseCounter(f, key)
	if err != nil {
		return 0, false
	}
	return n, ok
}

// parseCounter finds "key value" in a flat-keyed cgroup file (memory.events, memory.oom_control).
func parseCounter(r io.Reader, key string) (uint64, bool, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		k, v, found := strings.Cut(sc.Text(), " ")
		if !found || k != key {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return 0, false, fmt.Errorf("parse %s %q: %w", key, v, err)
		}
		return n, true, nil
	}
	return 0, false, sc.Err()
}

// readPids reads a cgroup.procs file.
func readPids(name string) ([]int, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		if errors.Is(err, syscall.ENODEV) || errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	return parsePids(b)
}

func parsePids(b []byte) ([]int, error) {
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil || pid <= 0 {
			return nil, fmt.Errorf("cgroup.procs: bad pid %q", f)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// backoff sleeps 1ms, 2ms, ... up to 50ms between polls of kernel state that has no event.
type backoff struct{ d time.Duration }

func newBackoff() *backoff { return &backoff{d: time.Millisecond} }

func (b *backoff) sleep(ctx context.Context) bool {
	t := time.NewTimer(b.d)
	defer t.Stop()
	if b.d < 50*time.Millisecond {
		b.d *= 2
	}
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
