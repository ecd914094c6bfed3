//go:build linux

package agent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/backoff"
	"github.com/airlock-sandbox/airlock/internal/kernfile"
	"github.com/airlock-sandbox/airlock/sandbox/sbtypes"
)

// Kill scopes as reported by health: what an exec's kill reaches.
const (
	scopeV1   = sbtypes.KillScopeCgroupV1
	scopeV2   = sbtypes.KillScopeCgroupV2
	scopePgrp = sbtypes.KillScopePgrp // honest: a setsid'd descendant escapes it
	// Without a cgroup: each command runs below a reaper of its own that kills every
	// descendant (reaper.go).
	scopeReaper = sbtypes.KillScopeSubreaper
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

	// v1: the next exec's cgroup, made once an exec is over (prepare) as next-<id> and renamed
	// exec-<id> when an exec takes it: a rename costs a fraction of a mkdir (v1 only; v2 cannot
	// rename a cgroup). close removes it.
	mu      sync.Mutex
	next    *execGroup
	filling bool
	closed  bool
	fills   sync.WaitGroup

	// oom is the sandbox-wide OOM-kill counter file, opened at its first read and kept open:
	// each exec reads it twice, on its path, and an open of a cgroup file costs more than the
	// read (see counterFile).
	oomMu sync.Mutex
	oom   *counterFile
}

// memoryRoom is how much of the sandbox's memory limit is free, and the limit (ok false: no
// limit known): v1 the memory cgroup's, v2 the tightest of the exec cgroups' parent and its own
// parent (the sandbox's cgroup).
func (c *cgroups) memoryRoom() (room, limit int64, ok bool) {
	read := func(p string) (int64, bool) {
		b, err := os.ReadFile(p)
		if err != nil {
			return 0, false
		}
		v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return v, err == nil
	}
	switch c.kind {
	case scopeV1:
		if c.memoryV1 == "" {
			return 0, 0, false
		}
		l, ok1 := read(c.memoryV1 + "/memory.limit_in_bytes")
		u, ok2 := read(c.memoryV1 + "/memory.usage_in_bytes")
		return l - u, l, ok1 && ok2 && l < 1<<60
	case scopeV2:
		for _, dir := range []string{c.base, filepath.Dir(c.base)} {
			l, ok1 := read(dir + "/memory.max") // "max": no limit here, not a number
			u, ok2 := read(dir + "/memory.current")
			if ok1 && ok2 && (!ok || l-u < room) {
				room, limit, ok = l-u, l, true
			}
		}
		return room, limit, ok
	}
	return 0, 0, false
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
	if reaperAvailable() {
		return &cgroups{kind: scopeReaper}, nil
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

// oomPerExec reports whether an OOM kill is attributed to the one exec it happened in (v2 with
// the memory controller enabled below the sandbox: every exec cgroup has its own
// memory.events) rather than to every exec running in the sandbox at the time.
func (c *cgroups) oomPerExec() bool {
	if c.kind != scopeV2 {
		return false
	}
	b, err := kernfile.Read(c.base + "/cgroup.subtree_control")
	return err == nil && slices.Contains(strings.Fields(string(b)), "memory")
}

// execGroup is one exec's kill scope.
type execGroup struct {
	id   string // the exec's id, also in its cgroup's name
	kind string
	dir  string // the exec cgroup
	fd   int    // v2: the cgroup directory, for CLONE_INTO_CGROUP
	// tasks is the v1 cgroup's tasks file, opened with the cgroup (off the exec's path) and
	// kept through its renames and recycling, for the spawner thread to enter it with one
	// write (-1: none, for other kinds).
	tasks int
	pgid  int       // process-group: set once the leader is spawned
	rp    *reapLink // subreaper: the exec's reaper
	c     *cgroups
	// left is closed once the spawner thread, which enters a v1 exec cgroup to fork into it,
	// is out again (nil: it never entered). Set by the spawner before its reply.
	left chan struct{}

	killed bool // kill was called: the cgroup may have been left frozen, never recycle it

	oomFile   string // the OOM-kill counter covering this exec ("" when none does)
	oomShared bool   // oomFile is the sandbox-wide one, read through cgroups.oom
	oomStart  uint64 // its value before the exec started
	oomKilled bool   // it went up while the exec ran (read once the exec's cgroup is empty)
}

// group returns the kill scope for a new exec: the pre-made cgroup if one is ready, else a new one.
func (c *cgroups) group() (*execGroup, error) {
	c.mu.Lock()
	g := c.next
	c.next = nil
	c.mu.Unlock()
	if g != nil {
		dir := c.base + "/exec-" + g.id
		// unix.Rename, not os.Rename: no lstat of the target first.
		if err := unix.Rename(g.dir, dir); err != nil {
			_ = g.destroy()
			g = nil
		} else {
			g.dir = dir
		}
	}
	if g == nil {
		var err error
		if g, err = c.create("exec-", newID()); err != nil {
			return nil, err
		}
	}
	// Now, not when the cgroup was made: an OOM kill before this exec is not its own.
	g.startOOM()
	return g, nil
}

// prepare makes the next exec's cgroup in the background, unless one is ready or being made.
func (c *cgroups) prepare() {
	if c.kind != scopeV1 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.next != nil || c.filling {
		return
	}
	c.filling = true
	c.fills.Add(1)
	go func() {
		defer c.fills.Done()
		g, err := c.create("next-", newID())
		c.mu.Lock()
		c.filling = false
		if err == nil && !c.closed {
			c.next, g = g, nil
		}
		c.mu.Unlock()
		if g != nil {
			_ = g.destroy()
		}
	}()
}

// close removes the pre-made cgroup; no exec may start after it.
func (c *cgroups) close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.fills.Wait()
	c.mu.Lock()
	g := c.next
	c.next = nil
	c.mu.Unlock()
	if g == nil {
		return nil
	}
	return g.destroy()
}

func (c *cgroups) create(prefix, id string) (*execGroup, error) {
	g := &execGroup{id: id, kind: c.kind, fd: -1, tasks: -1, c: c}
	switch c.kind {
	case scopePgrp:
		return g, nil
	case scopeReaper:
		return g, nil // its reaper is the spawner's to give (runReaper)
	}
	g.dir = c.base + "/" + prefix + id
	if err := os.Mkdir(g.dir, 0o755); err != nil {
		return nil, fmt.Errorf("create exec cgroup: %w", err)
	}
	if c.kind == scopeV1 {
		fd, err := kernfile.Open(g.dir+"/tasks", unix.O_WRONLY)
		if err != nil {
			_ = os.Remove(g.dir)
			return nil, fmt.Errorf("open exec cgroup: %w", err)
		}
		g.tasks = fd
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

// startOOM picks the counter that sees this exec's OOM kills and records its value: v2 the
// exec's own memory.events when the memory controller is enabled below the sandbox, else the
// sandbox's (hierarchical, so it counts the exec's too); v1 the sandbox memory cgroup's
// memory.oom_control, where the exec's processes live (sandbox-wide: v1 has no per-exec one).
// One file for the whole exec, so start and end are comparable.
func (g *execGroup) startOOM() {
	switch g.kind {
	case scopeV1:
		if g.c.memoryV1 != "" {
			g.oomFile = g.c.memoryV1 + "/memory.oom_control"
			g.oomShared = true
		}
	case scopeV2:
		g.oomFile = g.dir + "/memory.events"
		if _, err := os.Stat(g.oomFile); err != nil {
			g.oomFile = g.c.base + "/memory.events"
			g.oomShared = true
		}
	}
	if g.oomFile == "" {
		return
	}
	n, ok := g.readOOM()
	if !ok {
		g.oomFile = ""
		return
	}
	g.oomStart = n
}

// readOOM reads the exec's OOM-kill counter.
func (g *execGroup) readOOM() (uint64, bool) {
	if g.oomShared {
		return g.c.readSandboxCounter(g.oomFile, "oom_kill")
	}
	return readCounter(g.oomFile, "oom_kill")
}

// endOOM records whether the counter went up during the exec. Called with the exec's cgroup
// empty (every process of it gone, so every OOM kill among them counted) and before it is
// removed (a v2 exec's own memory.events goes with it).
func (g *execGroup) endOOM() {
	if g.oomFile == "" || g.oomKilled {
		return
	}
	if n, ok := g.readOOM(); ok && n > g.oomStart {
		g.oomKilled = true
	}
}

func readCounter(name, key string) (uint64, bool) {
	b, err := kernfile.Read(name)
	if err != nil {
		return 0, false
	}
	n, ok, err := parseCounter(bytes.NewReader(b), key)
	return n, ok && err == nil
}

// counterFile is a small cgroup file kept open and read with one pread from offset 0: a cgroup
// file's contents are made anew by every read that starts at 0 (seq_file), so the descriptor
// never goes stale, and a read costs one system call instead of an open, two reads and a close.
// Not for v1 tasks and cgroup.procs: their pid list is cached per descriptor for a while.
type counterFile struct {
	fd  int
	buf [4096]byte
}

// readSandboxCounter reads key from the sandbox-wide counter file name through c.oom, which it
// opens at the first call: name is the same for every exec of a sandbox (startOOM).
func (c *cgroups) readSandboxCounter(name, key string) (uint64, bool) {
	c.oomMu.Lock()
	defer c.oomMu.Unlock()
	if c.oom == nil {
		fd, err := kernfile.Open(name, unix.O_RDONLY)
		if err != nil {
			return 0, false
		}
		c.oom = &counterFile{fd: fd}
	}
	f := c.oom
	for {
		n, err := unix.Pread(f.fd, f.buf[:], 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == len(f.buf) {
			// Gone, or more than one read holds (never for these files): the slow way.
			return readCounter(name, key)
		}
		v, ok, err := parseCounter(bytes.NewReader(f.buf[:n]), key)
		return v, ok && err == nil
	}
}

// closeFiles closes the files c keeps open; call it once no exec runs any more.
func (c *cgroups) closeFiles() {
	c.oomMu.Lock()
	defer c.oomMu.Unlock()
	if c.oom != nil {
		unix.Close(c.oom.fd)
		c.oom = nil
	}
}

// kill kills every process in the group and, for cgroups, returns only once the cgroup is
// empty. It may be called more than once.
func (g *execGroup) kill() error {
	g.killed = true
	switch g.kind {
	case scopeReaper:
		if g.rp == nil {
			return nil // nothing started
		}
		return g.rp.kill()
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
		if g.left != nil {
			// Freezing with the spawner thread inside would freeze it too.
			<-g.left
		}
		return g.killV1()
	}
}

// finish ends the group of an exec whose main process has been reaped: what is left is killed
// and the cgroup removed, or, when nothing is left and nothing was ever killed in it, the
// cgroup becomes the next exec's pre-made cgroup (see recycle).
func (g *execGroup) finish() error {
	if g.kind == scopeReaper {
		if g.rp == nil {
			return nil
		}
		// The reaper has exited, and it exits only once everything is gone (or says not).
		return g.rp.close()
	}
	if g.kind == scopeV1 && g.dir != "" && !g.killed {
		if g.left != nil {
			<-g.left
		}
		if g.c.recycle(g) {
			g.endOOM()
			return nil
		}
	}
	return g.destroy()
}

// release is finish for an exec whose exit is reported before everything it started is
// confirmed gone (exitFirst): an empty v1 cgroup is recycled as finish does; otherwise the
// processes left that hold the exec's output (holds; nil: every process) are sent SIGKILL now,
// so that the output ends as it would once finish had killed them, and rest, run after the
// report, kills the others, waits until the cgroup is empty and removes it. The OOM counter is
// read now: an OOM kill among the exec's processes is counted by the time its main process has
// been reaped, and the processes killed here die of SIGKILL, not of OOM.
func (g *execGroup) release(holds func(pid int) bool) (rest func() error, err error) {
	switch g.kind {
	case scopeV1, scopeV2:
		if g.dir == "" {
			return nil, g.finish()
		}
		if g.left != nil {
			<-g.left
		}
		if g.kind == scopeV1 && !g.killed && g.c.recycle(g) {
			g.endOOM()
			return nil, nil
		}
		g.killed = true
		err = g.killListed(holds)
	default:
		return nil, g.finish()
	}
	if err != nil {
		// Nothing is reported before it is gone, then.
		return nil, errors.Join(err, g.destroy())
	}
	g.endOOM()
	return g.destroy, nil
}

// recycle renames an exec's v1 cgroup to be the next exec's pre-made cgroup instead of removing it (and making
// the pre-made cgroup anew after the answer): a v1 cgroup's creation and removal are the costliest part
// of an exec's cgroup work, much of it done by kernel threads after the fact, while a rename
// is one cheap call. Only an empty cgroup qualifies (its tasks file lists every live thread:
// with none, nothing can fork into it again), and only while no pre-made cgroup is there or being made.
// The caller makes sure nothing was ever killed in it: a kill freezes, and a failed thaw would
// hand the next exec a frozen cgroup.
//
// On success g's directory (and its open tasks file) belong to the pre-made cgroup: g.dir is "".
func (c *cgroups) recycle(g *execGroup) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.next != nil || c.filling {
		return false
	}
	// Opened anew, not read through g.tasks: a v1 tasks file's pid list is cached per open
	// file for a while (cgroup_pidlist_start), so a second read of a descriptor can be stale.
	b, err := kernfile.Read(g.dir + "/tasks")
	if err != nil || len(bytes.TrimSpace(b)) != 0 {
		return false
	}
	id := newID()
	next := c.base + "/next-" + id
	if unix.Rename(g.dir, next) != nil {
		return false
	}
	c.next = &execGroup{id: id, kind: c.kind, dir: next, fd: -1, tasks: g.tasks, c: c}
	g.dir, g.tasks = "", -1
	return true
}

// destroy kills what is left and removes the cgroup.
func (g *execGroup) destroy() error {
	if g.kind == scopeReaper {
		if g.rp == nil {
			return nil
		}
		// A reaper still running kills everything at the end of its control socket.
		return errors.Join(g.kill(), g.rp.close())
	}
	if g.kind == scopeV1 && g.dir != "" {
		if g.left != nil {
			<-g.left
		}
		// The spawner is out and done with this group: its tasks file is not written again.
		if g.tasks >= 0 {
			unix.Close(g.tasks)
			g.tasks = -1
		}
		// Usually everything is gone with the main process: then the rmdir alone confirms
		// the cgroup empty (the kernel refuses a populated one with EBUSY), and the kill's
		// read of cgroup.procs is saved. The v1 OOM counter is the sandbox's, still there.
		if unix.Rmdir(g.dir) == nil {
			g.dir = ""
			g.endOOM()
			return nil
		}
	}
	err := g.kill()
	if g.fd >= 0 {
		unix.Close(g.fd)
		g.fd = -1
	}
	if g.dir == "" || err != nil {
		return err
	}
	g.endOOM()
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
		if !wait.Wait(ctx) {
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
		if err := kernfile.Write(g.dir+"/cgroup.kill", "1"); err != nil {
			return fmt.Errorf("kill exec cgroup %s: %w", g.dir, err)
		}
		if !wait.Wait(ctx) {
			return fmt.Errorf("kill exec cgroup %s: %d processes left after %v", g.dir, len(pids), killTimeout)
		}
	}
}

// v1UnfrozenRounds is how many rounds killV1 kills from the listing alone (killListed) before
// it freezes the cgroup for each round instead. What is left after an exec has usually stopped
// forking (a pre-started python's exit holder, a background sleep), and a v1 freeze and thaw
// cost ~0.85 ms of kernel time each here (a static key patched with IPIs) under a mutex global
// to the freezer hierarchy, that every other freeze, thaw and freezer.state read on the host
// then waits for. A cgroup that still shows processes after these rounds (15 ms with the
// backoff) is one that keeps forking, which only the freezer stops for certain.
var v1UnfrozenRounds = v1UnfrozenRoundsDefault

const v1UnfrozenRoundsDefault = 4

// killV1 kills every process in the cgroup and repeats until it is empty: first from the
// listing alone, then (see v1UnfrozenRounds) with the cgroup frozen so nothing in it can fork
// while the snapshot of its members is killed, thawed after so the SIGKILLs are delivered.
func (g *execGroup) killV1() error {
	ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
	defer cancel()
	for round, wait := 0, newBackoff(); ; round++ {
		pids, err := readPids(g.dir + "/cgroup.procs")
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if round < v1UnfrozenRounds {
			err = g.killListed(nil)
		} else {
			err = g.sweepV1(ctx)
		}
		if err != nil {
			return err
		}
		if !wait.Wait(ctx) {
			return fmt.Errorf("kill exec cgroup %s: %d processes left after %v", g.dir, len(pids), killTimeout)
		}
	}
}

// killListed sends SIGKILL to every process in the cgroup that holds (holds; nil: every
// process), without freezing it (a v1 freeze is asynchronous: its state reads FREEZING until
// every task has stopped, and the wait for FROZEN cost a pre-started python's run 1-2 ms). It
// is a fixed point instead: the listing is read again after the kills, and whatever it shows
// that was not seen yet (a child forked before its parent's SIGKILL; a fork still in progress
// when SIGKILL arrives fails) is judged too, until a listing shows nothing new. Killed
// processes may still be dying when it returns. Every process seen is set to the lowest
// priority: it dies now or soon after, and its death (freeing its memory: for the exit holder
// of a pre-started python the whole interpreter's, ~1 ms of CPU) then takes an idle processor
// rather than the agent's or its caller's.
func (g *execGroup) killListed(holds func(pid int) bool) error {
	seen := map[int]bool{os.Getpid(): true} // the spawner thread passes through exec cgroups
	for {
		pids, err := readPids(g.dir + "/cgroup.procs")
		if err != nil {
			return err
		}
		fresh := false
		for _, pid := range pids {
			if seen[pid] {
				continue
			}
			fresh = true
			seen[pid] = true
			_ = unix.Setpriority(unix.PRIO_PROCESS, pid, 19)
			if holds != nil && !holds(pid) {
				continue
			}
			if err := unix.Kill(pid, unix.SIGKILL); err != nil && err != unix.ESRCH {
				return fmt.Errorf("kill pid %d in %s: %w", pid, g.dir, err)
			}
		}
		if !fresh {
			return nil
		}
		if len(seen) > 1<<16 {
			return fmt.Errorf("kill exec cgroup %s: more than %d processes", g.dir, 1<<16)
		}
	}
}

// holdsPipe reports whether process pid has one of the pipes inos open (true when it cannot
// tell: the caller then treats it as holding them).
func holdsPipe(pid int, inos map[uint64]bool) bool {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return !errors.Is(err, os.ErrNotExist) // gone: it holds nothing any more
	}
	for _, e := range ents {
		l, err := os.Readlink(dir + "/" + e.Name())
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // closed meanwhile
			}
			return true
		}
		if n, ok := strings.CutPrefix(l, "pipe:["); ok {
			if ino, err := strconv.ParseUint(strings.TrimSuffix(n, "]"), 10, 64); err == nil && inos[ino] {
				return true
			}
		}
	}
	return false
}

// sweepV1 sends SIGKILL to every process in the v1 cgroup while it is frozen, then thaws it
// so the kills are delivered. It does not wait for them to die.
func (g *execGroup) sweepV1(ctx context.Context) error {
	if err := g.freeze(ctx); err != nil {
		return err
	}
	pids, err := readPids(g.dir + "/cgroup.procs")
	if err != nil {
		return err
	}
	self := os.Getpid()
	for _, pid := range pids {
		// The spawner thread passes through exec cgroups; the agent never kills itself.
		if pid == self {
			continue
		}
		if err := unix.Kill(pid, unix.SIGKILL); err != nil && err != unix.ESRCH {
			return fmt.Errorf("kill pid %d in %s: %w", pid, g.dir, err)
		}
	}
	if err := kernfile.Write(g.dir+"/freezer.state", "THAWED"); err != nil {
		return fmt.Errorf("thaw exec cgroup %s: %w", g.dir, err)
	}
	return nil
}

// testHookFreeze, when set, is called with the directory of each exec cgroup about to be frozen.
var testHookFreeze func(dir string)

func (g *execGroup) freeze(ctx context.Context) error {
	if testHookFreeze != nil {
		testHookFreeze(g.dir)
	}
	for wait := newBackoff(); ; {
		if err := kernfile.Write(g.dir+"/freezer.state", "FROZEN"); err != nil {
			return fmt.Errorf("freeze exec cgroup %s: %w", g.dir, err)
		}
		state, err := kernfile.Read(g.dir + "/freezer.state")
		if err != nil {
			return fmt.Errorf("freeze exec cgroup %s: %w", g.dir, err)
		}
		if strings.TrimSpace(string(state)) == "FROZEN" {
			return nil
		}
		if !wait.Wait(ctx) {
			return fmt.Errorf("freeze exec cgroup %s: still %s after %v", g.dir, bytes.TrimSpace(state), killTimeout)
		}
	}
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
	b, err := kernfile.Read(name)
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

// newBackoff waits 1ms, 2ms, ... up to 50ms between polls of kernel state that has no event.
func newBackoff() *backoff.Backoff { return backoff.New(time.Millisecond, 50*time.Millisecond) }
