package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/backend/local/nsinit"
	"github.com/airlock-sandbox/airlock/internal/backoff"
	"github.com/airlock-sandbox/airlock/internal/kernfile"
)

// cgroupRoot is where the host mounts its cgroup hierarchies.
const cgroupRoot = kernfile.CgroupRoot

// agentPidsHeadroom is how many more tasks than the declared maxProcesses the sandbox's pids
// cgroup allows: the agent's own threads. Code is held to maxProcesses in a child cgroup of its
// own (nsinit.CodePidsName), so a fork bomb cannot starve the agent.
const agentPidsHeadroom = 32

// limits are a sandbox's resource ceilings, resolved from the declaration.
type limits struct {
	CPUMillis    int64
	MemoryBytes  int64
	MaxProcesses int64
}

// sandboxCgroup is one sandbox's cgroup, whichever the cgroup version.
type sandboxCgroup interface {
	// addProc moves a process (all its threads) into the cgroup.
	addProc(pid int) error
	// start starts cmd with the child born inside the cgroup: no migration afterwards (a v1
	// migration of a whole process costs an RCU grace period, tens of milliseconds), and no
	// moment in which the child runs outside its limits.
	start(cmd *exec.Cmd) error
	// delegate hands the agent (uid/gid on the host) what it needs to create per-exec
	// children and place its spawner thread; the limit files stay root's.
	delegate(uid, gid int) error
	// kill SIGKILLs every process in the cgroup and its children and waits until none is left.
	kill(ctx context.Context) error
	// thaw lifts a freeze (a paused sandbox): a frozen task dies of a SIGKILL only once thawed.
	thaw() error
	// procs lists every process in the cgroup and its children.
	procs() ([]int, error)
	// remove deletes the cgroup and every child, in every hierarchy, waiting a while for
	// killed tasks that are still leaving.
	remove() error
	// removeEmpty is remove without the wait: a cgroup that still holds a task fails at once
	// (EBUSY). Its success proves the cgroup was empty.
	removeEmpty() error
	// dirs are the host directories this cgroup consists of (absent once removed).
	dirs() []string
	// execParent opens the directory the agent makes its per-exec cgroups in, handed to init
	// as nsinit.FDCgroup; nil when the agent mounts a view of its own instead (v1).
	execParent() (*os.File, error)
}

// cgroupDriver creates and finds sandbox cgroups under one parent (e.g. "/airlock").
type cgroupDriver interface {
	version() int
	create(name string, l limits) (sandboxCgroup, error)
	// load returns the cgroup if any of its directories exists, fs.ErrNotExist otherwise.
	load(name string) (sandboxCgroup, error)
	// list names the parent's children.
	list() ([]string, error)
	// ensureParent makes the parent's directories if they are missing.
	ensureParent() error
}

func newCgroupDriver(parent string) (cgroupDriver, error) {
	switch cgroups.Mode() {
	case cgroups.Unified:
		return &v2Driver{parent: parent}, nil
	case cgroups.Legacy, cgroups.Hybrid:
		for _, c := range v1Controllers {
			if _, err := os.Stat(filepath.Join(cgroupRoot, c)); err != nil {
				return nil, fmt.Errorf("cgroup v1 controller %s is not mounted at %s: %w", c, filepath.Join(cgroupRoot, c), err)
			}
		}
		others, err := otherHierarchies()
		if err != nil {
			return nil, err
		}
		return &v1Driver{parent: parent, others: others}, nil
	}
	return nil, errors.New("no cgroup hierarchy is mounted at " + cgroupRoot)
}

// --- cgroup v1 ---

var v1Controllers = []string{"freezer", "pids", "cpu", "cpuacct", "memory"}

func v1Hierarchy() ([]cgroup1.Subsystem, error) {
	return []cgroup1.Subsystem{
		cgroup1.NewFreezer(cgroupRoot), cgroup1.NewPids(cgroupRoot), cgroup1.NewCpu(cgroupRoot),
		cgroup1.NewCpuacct(cgroupRoot), cgroup1.NewMemory(cgroupRoot),
	}, nil
}

func v1PidsOnly() ([]cgroup1.Subsystem, error) {
	return []cgroup1.Subsystem{cgroup1.NewPids(cgroupRoot)}, nil
}

type v1Driver struct {
	parent string
	// others are the hierarchies mounted at cgroupRoot besides v1Controllers, listed once:
	// runsc makes its cgroups in every hierarchy, so removal looks there too.
	others []string
}

// otherHierarchies lists the directories at cgroupRoot that are not v1Controllers (named
// hierarchies, co-mounted controllers).
func otherHierarchies() ([]string, error) {
	entries, err := os.ReadDir(cgroupRoot)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && !slices.Contains(v1Controllers, e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

func (d *v1Driver) version() int { return 1 }

func (d *v1Driver) ensureParent() error {
	for _, c := range v1Controllers {
		if err := os.MkdirAll(filepath.Join(cgroupRoot, c, d.parent), 0o755); err != nil {
			return err
		}
	}
	return nil
}

func (d *v1Driver) path(name string) string { return path.Join("/", d.parent, name) }

func (d *v1Driver) create(name string, l limits) (sandboxCgroup, error) {
	p := d.path(name)
	period := uint64(100000)
	quota := l.CPUMillis * int64(period) / 1000
	if quota < 1000 {
		quota = 1000 // the kernel's minimum quota is 1ms
	}
	pidsMax := l.MaxProcesses + agentPidsHeadroom
	res := &specs.LinuxResources{
		CPU: &specs.LinuxCPU{Quota: &quota, Period: &period},
		// memory+swap equal to memory: the sandbox cannot swap past its limit.
		Memory: &specs.LinuxMemory{Limit: &l.MemoryBytes, Swap: &l.MemoryBytes},
		Pids:   &specs.LinuxPids{Limit: &pidsMax},
	}
	cg, err := cgroup1.New(cgroup1.StaticPath(p), res, cgroup1.WithHierarchy(v1Hierarchy))
	if err != nil {
		c := &v1Cgroup{path: p, others: d.others}
		_ = c.remove()
		return nil, fmt.Errorf("create cgroup %s: %w", p, err)
	}
	codeMax := l.MaxProcesses + 1 // the spawner thread itself lives there too
	if _, err := cgroup1.New(cgroup1.StaticPath(path.Join(p, nsinit.CodePidsName)),
		&specs.LinuxResources{Pids: &specs.LinuxPids{Limit: &codeMax}}, cgroup1.WithHierarchy(v1PidsOnly)); err != nil {
		c := &v1Cgroup{path: p, cg: cg, others: d.others}
		_ = c.remove()
		return nil, fmt.Errorf("create cgroup %s/%s: %w", p, nsinit.CodePidsName, err)
	}
	return &v1Cgroup{path: p, cg: cg, others: d.others}, nil
}

func (d *v1Driver) load(name string) (sandboxCgroup, error) {
	c := &v1Cgroup{path: d.path(name), others: d.others}
	for _, dir := range c.dirs() {
		if _, err := os.Stat(dir); err == nil {
			if cg, err := cgroup1.Load(cgroup1.StaticPath(c.path), cgroup1.WithHierarchy(v1Hierarchy)); err == nil {
				c.cg = cg
			}
			return c, nil
		}
	}
	return nil, fs.ErrNotExist
}

func (d *v1Driver) list() ([]string, error) {
	var names []string
	for _, ctrl := range v1Controllers {
		entries, err := os.ReadDir(filepath.Join(cgroupRoot, ctrl, d.parent))
		if cgroupGone(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if e.IsDir() && !slices.Contains(names, e.Name()) {
				names = append(names, e.Name())
			}
		}
	}
	return names, nil
}

type v1Cgroup struct {
	path   string
	cg     cgroup1.Cgroup // nil when the cgroup is only partly there
	others []string       // the driver's other hierarchies
}

func (c *v1Cgroup) dir(ctrl string) string { return filepath.Join(cgroupRoot, ctrl, c.path) }

// dirs are the cgroup's directories in the hierarchies this runtime uses, plus any other
// hierarchy where one of that name exists (runsc makes its cgroups in every hierarchy).
// Looked up by name: a glob over cgroupRoot would read every hierarchy's top directory.
func (c *v1Cgroup) dirs() []string {
	out := make([]string, 0, len(v1Controllers)+len(c.others))
	for _, ctrl := range v1Controllers {
		out = append(out, c.dir(ctrl))
	}
	for _, h := range c.others {
		if _, err := os.Lstat(c.dir(h)); err == nil {
			out = append(out, c.dir(h))
		}
	}
	return out
}

func (c *v1Cgroup) addProc(pid int) error {
	if c.cg == nil {
		return errors.New("cgroup " + c.path + " is incomplete")
	}
	return c.cg.AddProc(uint64(pid))
}

func (c *v1Cgroup) start(cmd *exec.Cmd) error {
	// The calling thread joins the sandbox's cgroups to fork init there, then goes back where
	// it was before anything else can run on it. Going back matters: the runtime never ends
	// the main thread, and a thread of ours left inside would make the sandbox's kill list
	// this very process. The caller's own goroutine does it, locked to its thread: a goroutine
	// of its own cost two hand-offs, each a wait for a scheduler on a busy machine.
	runtime.LockOSThread()
	home, err := threadCgroups()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	enter := func(dir func(ctrl string) string) error {
		for _, ctrl := range v1Controllers {
			// "0" moves the calling thread only, which the kernel does without the global
			// threadgroup lock a pid (or a whole process) needs.
			if err := kernfile.Write(filepath.Join(dir(ctrl), "tasks"), "0"); err != nil {
				return fmt.Errorf("move thread into %s: %w", dir(ctrl), err)
			}
		}
		return nil
	}
	back := func(ctrl string) string { return filepath.Join(cgroupRoot, ctrl, home[ctrl]) }
	err = enter(c.dir)
	if err == nil {
		err = cmd.Start()
	}
	if berr := enter(back); berr != nil {
		// Stuck inside the sandbox's cgroups: the goroutine stays locked to this thread, so
		// nothing else ever runs on it, and the thread ends when the goroutine does.
		return errors.Join(err, berr)
	}
	runtime.UnlockOSThread()
	return err
}

// threadCgroups maps each v1 controller this runtime uses to the calling thread's cgroup.
func threadCgroups() (map[string]string, error) {
	f, err := os.Open("/proc/thread-self/cgroup")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseCgroupFile(f)
}

// parseCgroupFile reads /proc/<pid>/cgroup lines "id:controller[,controller]:path".
func parseCgroupFile(r io.Reader) (map[string]string, error) {
	ms, err := kernfile.ParseProcCgroup(r)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, m := range ms {
		for _, ctrl := range m.Controllers {
			out[ctrl] = m.Path
		}
	}
	for _, ctrl := range v1Controllers {
		if _, ok := out[ctrl]; !ok {
			return nil, fmt.Errorf("this thread is in no %s cgroup (v1)", ctrl)
		}
	}
	return out, nil
}

func (c *v1Cgroup) execParent() (*os.File, error) { return nil, nil }

func (c *v1Cgroup) delegate(uid, gid int) error {
	// The freezer directory: the agent makes a child per exec and moves its spawner thread in
	// and out. The code pids cgroup: the spawner thread enters it once. The memory cgroup is
	// only read (memory.oom_control), so nothing of it is handed over.
	chown := []string{
		c.dir("freezer"), filepath.Join(c.dir("freezer"), "cgroup.procs"), filepath.Join(c.dir("freezer"), "tasks"),
		filepath.Join(c.dir("pids"), nsinit.CodePidsName, "tasks"),
	}
	for _, p := range chown {
		if err := os.Chown(p, uid, gid); err != nil {
			return fmt.Errorf("delegate cgroup: %w", err)
		}
	}
	return nil
}

func (c *v1Cgroup) procs() ([]int, error) {
	var pids []int
	for _, ctrl := range v1Controllers {
		var err error
		if pids, err = appendTreeProcs(pids, c.dir(ctrl)); err != nil {
			return nil, err
		}
	}
	return pids, nil
}

// appendTreeProcs appends to pids, once each, the processes of the cgroup at root and of all
// its children; a cgroup removed meanwhile counts as empty.
func appendTreeProcs(pids []int, root string) ([]int, error) {
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if cgroupGone(err) {
				return nil
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		got, err := readPidFile(filepath.Join(p, "cgroup.procs"))
		if err != nil && !cgroupGone(err) {
			return err
		}
		for _, pid := range got {
			if !slices.Contains(pids, pid) {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids, err
}

func readPidFile(p string) ([]int, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %q is not a pid", p, f)
		}
		pids = append(pids, n)
	}
	return pids, nil
}

// setFreezer writes a v1 freezer state and waits (bounded) for it: the library's own Freeze
// waits without limit, and a sandbox stuck in FREEZING must not hang Terminate.
func (c *v1Cgroup) setFreezer(ctx context.Context, state string) error {
	f := filepath.Join(c.dir("freezer"), "freezer.state")
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	for {
		if err := kernfile.Write(f, state); err != nil {
			return err
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(b)) == state {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cgroup %s stayed %s, wanted %s", c.path, strings.TrimSpace(string(b)), state)
		case <-time.After(time.Millisecond):
		}
	}
}

// thaw thaws the sandbox's freezer cgroup and every one below it (spares.Freezer.Thaw).
func (c *v1Cgroup) thaw() error { return freezer{Version: 1, Dir: c.dir("freezer")}.Thaw() }

func (c *v1Cgroup) kill(ctx context.Context) error {
	// Every process of a sandbox is in its pid namespace, which cannot fork once its init is
	// dead: killing everything listed is already race-free. The freezer is the fallback for
	// anything that stays (a process put in the cgroup from outside the namespace).
	for attempt := 0; ; attempt++ {
		// A paused sandbox (pause.go) is frozen already: kill it frozen, then thaw it.
		frozen := (attempt > 0 || c.frozen()) && c.setFreezer(ctx, "FROZEN") == nil
		pids, err := c.procs()
		if err != nil {
			return err
		}
		for _, pid := range pids {
			if pid == os.Getpid() {
				return fmt.Errorf("cgroup %s holds a thread of this process: refusing to kill it", c.path)
			}
			if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("kill %d in cgroup %s: %w", pid, c.path, err)
			}
		}
		if frozen {
			// A frozen task only dies once thawed.
			if err := c.setFreezer(ctx, "THAWED"); err != nil && !cgroupGone(err) {
				return err
			}
		}
		// So does one in a child cgroup frozen on its own, which the above leaves frozen.
		if err := c.thaw(); err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if err := waitEmpty(ctx, c.procs); err == nil {
			return nil
		} else if ctx.Err() != nil {
			return err
		}
	}
}

// waitEmpty polls until the cgroup has no process (killed tasks leave the cgroup when the
// kernel has torn them down) or a second passes.
func waitEmpty(ctx context.Context, procs func() ([]int, error)) error {
	deadline := time.Now().Add(time.Second)
	for wait := backoff.New(200*time.Microsecond, 20*time.Millisecond); ; {
		pids, err := procs()
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d processes still in the cgroup: %v", len(pids), pids)
		}
		if !wait.Wait(ctx) {
			return fmt.Errorf("%d processes still in the cgroup: %w", len(pids), ctx.Err())
		}
	}
}

func (c *v1Cgroup) remove() error { return c.removeDirs(true) }

func (c *v1Cgroup) removeEmpty() error { return c.removeDirs(false) }

func (c *v1Cgroup) removeDirs(waitBusy bool) error {
	// Children first (the agent's per-exec cgroups, the code pids cgroup): the library
	// deletes one level only.
	var errs []error
	for _, d := range c.dirs() {
		// Most directories have no child cgroup (the pids one has the code cgroup, the
		// freezer one an exec's while it runs): one rmdir removes them without listing them.
		// Anything else (a child, a task) fails it with EBUSY and goes through the tree walk.
		if d == c.dir("pids") {
			if err := unix.Rmdir(filepath.Join(d, nsinit.CodePidsName)); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, rmdirTree(d, waitBusy))
				continue
			}
		}
		if err := unix.Rmdir(d); err == nil || errors.Is(err, unix.ENOENT) {
			continue
		}
		if err := rmdirTree(d, waitBusy); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// rmdirTree removes a cgroup directory and every child cgroup, deepest first. waitBusy
// retries a cgroup that still has tasks (one just killed is still leaving) for up to a second.
func rmdirTree(root string, waitBusy bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if !waitBusy {
		cancel() // tried once
	}
	return kernfile.RemoveCgroupTree(ctx, root)
}

// --- cgroup v2 ---

type v2Driver struct {
	parent string
	// rootless: init clones the agent's cgroup fd itself (rootless.go, startRootless).
	rootless bool
}

func (d *v2Driver) version() int { return 2 }

func (d *v2Driver) ensureParent() error {
	return os.MkdirAll(filepath.Join(cgroupRoot, d.parent), 0o755)
}

func (d *v2Driver) path(name string) string { return path.Join("/", d.parent, name) }

func (d *v2Driver) create(name string, l limits) (sandboxCgroup, error) {
	p := d.path(name)
	period := uint64(100000)
	quota := l.CPUMillis * int64(period) / 1000
	if quota < 1000 {
		quota = 1000
	}
	zero := int64(0)
	res := &cgroup2.Resources{
		CPU: &cgroup2.CPU{Max: cgroup2.NewCPUMax(&quota, &period)},
		// No swap: memory+swap equals memory.
		Memory: &cgroup2.Memory{Max: &l.MemoryBytes, Swap: &zero},
		Pids:   &cgroup2.Pids{Max: l.MaxProcesses + agentPidsHeadroom},
	}
	m, err := cgroup2.NewManager(cgroupRoot, p, res)
	if err != nil {
		_ = rmdirTree(filepath.Join(cgroupRoot, p), true)
		return nil, fmt.Errorf("create cgroup %s: %w", p, err)
	}
	c := &v2Cgroup{path: p, m: m, rootless: d.rootless}
	if err := c.layout(l); err != nil {
		_ = c.remove()
		return nil, fmt.Errorf("create cgroup %s: %w", p, err)
	}
	return c, nil
}

// layout makes the sandbox cgroup's children (docs/cgroups.md): v2 allows processes only in
// leaves once controllers are enabled below, so init is born in "init" and every command in a
// child of "code", whose pids.max holds code to maxProcesses and leaves the sandbox's headroom
// to the agent; memory enabled below code gives each exec its own memory.events. Made here
// before init starts, so nothing ever moves a process (a v2 move takes the global threadgroup
// lock for writing: an RCU grace period, tens of milliseconds on an idle host).
func (c *v2Cgroup) layout(l limits) error {
	dir := c.dirs()[0]
	for _, child := range []string{v2InitLeaf, nsinit.CodePidsName} {
		if err := unix.Mkdir(filepath.Join(dir, child), 0o755); err != nil {
			return err
		}
	}
	code := filepath.Join(dir, nsinit.CodePidsName)
	for _, w := range []struct{ file, value string }{
		{filepath.Join(dir, "cgroup.subtree_control"), "+pids +memory"},
		{filepath.Join(code, "pids.max"), strconv.FormatInt(l.MaxProcesses, 10)},
		{filepath.Join(code, "cgroup.subtree_control"), "+memory"},
		// code is the agent's to make cgroups in: one level, and no more of them than execs
		// can run at once (each holds a process until its cgroup goes), so a compromised agent
		// cannot fill the host with cgroups.
		{filepath.Join(code, "cgroup.max.depth"), "1"},
		{filepath.Join(code, "cgroup.max.descendants"), strconv.FormatInt(l.MaxProcesses+codeCgroupSlack, 10)},
	} {
		if err := kernfile.Write(w.file, w.value); err != nil {
			return fmt.Errorf("write %s: %w", w.file, err)
		}
	}
	return nil
}

// codeCgroupSlack is how many exec cgroups beyond maxProcesses the agent may hold at once:
// ones whose processes are gone and that are being removed.
const codeCgroupSlack = 16

// v2InitLeaf is the child of a v2 sandbox cgroup its init (and agent) lives in.
const v2InitLeaf = "init"

func (d *v2Driver) load(name string) (sandboxCgroup, error) {
	c := &v2Cgroup{path: d.path(name), rootless: d.rootless}
	if _, err := os.Stat(c.dirs()[0]); err != nil {
		return nil, fs.ErrNotExist
	}
	if m, err := cgroup2.Load(c.path, cgroup2.WithMountpoint(cgroupRoot)); err == nil {
		c.m = m
	}
	return c, nil
}

func (d *v2Driver) list() ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(cgroupRoot, d.parent))
	if cgroupGone(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

type v2Cgroup struct {
	path     string
	m        *cgroup2.Manager
	rootless bool
}

func (c *v2Cgroup) dirs() []string { return []string{filepath.Join(cgroupRoot, c.path)} }

// addProc moves pid into the init leaf: the sandbox's cgroup itself holds no process (layout).
func (c *v2Cgroup) addProc(pid int) error {
	return kernfile.Write(filepath.Join(c.dirs()[0], v2InitLeaf, "cgroup.procs"), strconv.Itoa(pid))
}

func (c *v2Cgroup) start(cmd *exec.Cmd) error {
	fd, err := unix.Open(filepath.Join(c.dirs()[0], v2InitLeaf), unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	cmd.SysProcAttr.UseCgroupFD = true
	cmd.SysProcAttr.CgroupFD = fd
	return cmd.Start()
}

func (c *v2Cgroup) delegate(uid, gid int) error {
	// The agent makes each exec's cgroup in code and places the command there with clone3,
	// which needs write access to cgroup.procs of the common ancestor of init's cgroup and the
	// exec's: the sandbox's. The limits (the sandbox's files, code's) stay root's, and file
	// modes are all that guards them: init is in the host's cgroup namespace, so nsdelegate
	// draws no boundary around the sandbox. Chown nothing more.
	dir := c.dirs()[0]
	for _, p := range []string{filepath.Join(dir, "cgroup.procs"), filepath.Join(dir, nsinit.CodePidsName)} {
		if err := os.Chown(p, uid, gid); err != nil {
			return fmt.Errorf("delegate cgroup: %w", err)
		}
	}
	return nil
}

// execParent is code: init has no cgroup namespace (nor mount) of its own on v2 (nsinit).
// Not an open of the directory, which would sit in the host's mount tree, where ".." climbs
// from it to the host's / (the sandbox's root could then walk the host's filesystem as its
// own uid: TestAgentFDsConfined); a detached clone of a mount rooted at code, whose root
// ".." does not leave.
func (c *v2Cgroup) execParent() (*os.File, error) {
	if c.rootless {
		return nil, nil // open_tree needs CAP_SYS_ADMIN here: init clones it (startRootless)
	}
	dir := filepath.Join(c.dirs()[0], nsinit.CodePidsName)
	fd, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return nil, &os.PathError{Op: "open_tree", Path: dir, Err: err}
	}
	tree := os.NewFile(uintptr(fd), dir)
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, attr); err != nil {
		tree.Close()
		return nil, &os.PathError{Op: "mount_setattr", Path: dir, Err: err}
	}
	return tree, nil
}

func (c *v2Cgroup) procs() ([]int, error) {
	return appendTreeProcs(nil, c.dirs()[0])
}

func (c *v2Cgroup) thaw() error { return freezer{Version: 2, Dir: c.dirs()[0]}.Thaw() }

func (c *v2Cgroup) kill(ctx context.Context) error {
	if c.m != nil {
		if err := c.m.Kill(); err != nil && !cgroupGone(err) && !errors.Is(err, syscall.ENOENT) {
			return err
		}
	}
	for {
		pids, err := c.procs()
		if err != nil {
			return err
		}
		for _, pid := range pids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		if err := waitEmpty(ctx, c.procs); err == nil {
			return nil
		} else if ctx.Err() != nil {
			return err
		}
	}
}

func (c *v2Cgroup) remove() error { return rmdirTree(c.dirs()[0], true) }

func (c *v2Cgroup) removeEmpty() error { return rmdirTree(c.dirs()[0], false) }

// cgroupGone reports whether err means the cgroup (or the file) is not there.
var cgroupGone = kernfile.CgroupGone
