// Package local is the embedded runtime: sandboxes from namespaces, cgroups, seccomp and landlock, with no daemon.
package local

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/agent"
	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/backend/local/egresswire"
	"github.com/airlock-sandbox/airlock/backend/local/gvisor"
	"github.com/airlock-sandbox/airlock/backend/local/idrange"
	"github.com/airlock-sandbox/airlock/backend/local/nsinit"
	"github.com/airlock-sandbox/airlock/backend/local/pause"
	"github.com/airlock-sandbox/airlock/backend/local/seccomp"
	"github.com/airlock-sandbox/airlock/backend/local/sessions"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/image"
	"github.com/airlock-sandbox/airlock/internal/backoff"
	"github.com/airlock-sandbox/airlock/internal/sched"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
	"github.com/airlock-sandbox/airlock/token"
)

// Defaults.
const (
	DefaultStateDir      = statedir.DefaultDir
	defaultImageCacheDir = "/var/lib/airlock/images"
	defaultUIDBase       = 100000
	// idRange is how many ids the sandbox's user namespace maps (0..65535).
	idRange = idrange.Size
	// defaultCgroupParent is the cgroup the default state dir's sandboxes live under.
	defaultCgroupParent = "airlock"
	// startTimeout bounds how long Create waits for the agent when ctx has no deadline.
	startTimeout = 60 * time.Second
	// initExitWait is how long terminate waits for its own killed init before it kills the
	// sandbox's cgroup member by member.
	initExitWait = 2 * time.Second
	// maxSocketPath is sockaddr_un's limit (108 bytes with the NUL).
	maxSocketPath = 107
)

// Options configure a local backend.
type Options struct {
	// StateDir holds one directory per session plus the master secret (default /run/airlock).
	StateDir string
	// AgentPath is the agent binary. Empty: $AIRLOCK_AGENT, "airlock-agent" next to this
	// executable, "airlock-agent" on PATH, else this executable run as "__agent".
	AgentPath string
	// AgentArgs are arguments put before "init" (the "__agent" fallback sets it).
	AgentArgs []string
	// ImageCacheDir holds unpacked OCI images (default /var/lib/airlock/images).
	ImageCacheDir string
	// CgroupParent is the cgroup sandboxes are created under (default "airlock" for the
	// default state dir, "airlock-<hash of the state dir>" otherwise, so that two state dirs
	// never reap each other's sandboxes).
	CgroupParent string
	Logger       *slog.Logger
	// UIDBase starts the host ids native sandboxes map (default 100000): UIDBase..+65535 own
	// unpacked images and no sandbox maps them; each live sandbox maps its ids 0..65535 onto
	// a range of its own after that (idrange).
	UIDBase int
	// UIDRanges is how many such ranges follow UIDBase's own, so how many native sandboxes
	// may live at once in this state dir (default idrange.DefaultRanges).
	UIDRanges int
	// ImageProgress, if set, is called while an OCI image is unpacked.
	ImageProgress func(done, total int64)
	// RunscPath is runsc for runtime gvisor (default: runsc on PATH).
	RunscPath string
	// Egress configures the gateway of sandboxes whose egress is not deny (egress.go).
	Egress EgressOptions
	// OneShot is for a one-shot process that starts, as it ends, a process that opens this
	// state dir without it (airlock run and its parked sandbox filler) and so does the upkeep this one
	// leaves out: New skips its reconcile (adopting the live sandboxes, reaping the broken
	// ones, orphan cgroups, id ranges and /etc copies) once the state dir has its master
	// secret, so that neither it nor the creates in flight it waits for are on the one-shot's
	// path (sessions are still adopted one by one as looked up); and it takes a cached
	// capability probe up to oneShotProbeMaxAge old, which the follower probes anew past
	// hostProbeTTL (capabilities.go).
	OneShot bool
}

// Backend is the local runtime.
type Backend struct {
	opts      Options
	log       *slog.Logger
	agentPath string
	agentArgs []string
	master    []byte
	cg        cgroupDriver
	etc       *etcCache
	ids       *idrange.Allocator    // idrange
	caps      func() capability.Set // the published set (capabilities.go)
	runscPath string                // found on first use
	rootless  *idrange.Subordinate  // rootless.go; nil when root

	mu       sync.Mutex
	sessions map[string]*session
	// reaped are the sessions New's reconcile removed (Reaped).
	reaped   []string
	closed   bool
	stop     chan struct{} // closed by Close: adopted-session watchers stop
	watchers sync.WaitGroup
	previews previews // preview.go: open preview listeners
	// egress.go: the egress gateway and this process's attachments.
	egress egressState
}

var _ sandbox.Backend = (*Backend)(nil)

// session is a live sandbox this process knows.
type session struct {
	rec  record
	dir  string
	key  ed25519.PrivateKey
	cmd  *exec.Cmd     // nil when adopted from another process
	cg   sandboxCgroup // the cgroup this process created; nil when adopted
	done chan struct{} // closed once init has exited (and, for our child, been reaped)
	// pidfd is an adopted native init's (0 otherwise), open while its watcher runs: the
	// watcher closes it only after destroy, which holds mu, is done.
	pidfd int

	mu        sync.Mutex // serialises destroy
	gone      bool
	killed    bool   // by Kill: its remains are another process's to remove, not the watcher's
	stopTimer func() // stops the lifetime timer of a gVisor session

	// cachedClient is the client Create's health check used, its connection to the agent still
	// open: the first Connect takes it, so the first exec skips a dial and the agent's
	// accept. Whoever takes it closes it; destroy and Backend.Close close one left untaken.
	cachedClient atomic.Pointer[client.Client]
}

// takeCachedClient returns the session's open client once, nil after that.
func (s *session) takeCachedClient() *client.Client { return s.cachedClient.Swap(nil) }

// dropCachedClient closes a client nobody took (its idle connection and the transport's goroutines).
func (s *session) dropCachedClient() {
	if c := s.takeCachedClient(); c != nil {
		c.Close()
	}
}

// New returns a local backend over opts.StateDir, reconciling what a previous process left:
// live sandboxes are adopted, broken ones reaped.
func New(ctx context.Context, opts Options) (*Backend, error) {
	asRoot := os.Geteuid() == 0
	if opts.StateDir == "" {
		if opts.StateDir = DefaultStateDirForUser(); opts.StateDir == "" {
			return nil, fmt.Errorf("%w: stateDir: not root and XDG_RUNTIME_DIR is unset: name a state dir of this user's", sandbox.ErrInvalid)
		}
	}
	sd, err := filepath.Abs(opts.StateDir)
	if err != nil {
		return nil, err
	}
	opts.StateDir = filepath.Clean(sd)
	if opts.ImageCacheDir == "" {
		opts.ImageCacheDir = defaultImageCacheDir
		if !asRoot {
			cache, err := os.UserCacheDir()
			if err != nil {
				return nil, fmt.Errorf("%w: imageCacheDir: not root and %v", sandbox.ErrInvalid, err)
			}
			opts.ImageCacheDir = filepath.Join(cache, "airlock", "images")
		}
	}
	if opts.UIDBase == 0 {
		opts.UIDBase = defaultUIDBase
	}
	if opts.UIDRanges == 0 {
		opts.UIDRanges = idrange.DefaultRanges
	}
	if last := int64(opts.UIDBase) + int64(opts.UIDRanges+1)*idRange - 1; opts.UIDBase < 1 || opts.UIDRanges < 1 || last > 1<<32-2 {
		return nil, fmt.Errorf("%w: uidBase %d, uidRanges %d: the host ids %d..%d must be inside 1..%d", sandbox.ErrInvalid, opts.UIDBase, opts.UIDRanges, opts.UIDBase, last, uint32(1<<32-2))
	}
	if opts.CgroupParent == "" {
		opts.CgroupParent = CgroupParentFor(opts.StateDir)
		if !asRoot {
			// Under the cgroups delegated to this user: one per state dir below them.
			opts.CgroupParent = rootlessCgroupParentFor(opts.StateDir)
		}
	}
	if strings.Contains(opts.CgroupParent, "..") || path.IsAbs(opts.CgroupParent) {
		return nil, fmt.Errorf("%w: cgroupParent %q must be a relative path without ..", sandbox.ErrInvalid, opts.CgroupParent)
	}
	if n := len(opts.StateDir) + len("/s-0123456789abcdef/run/agent.sock"); n > maxSocketPath {
		return nil, fmt.Errorf("%w: stateDir %q is too long: the agent socket path would be %d bytes, at most %d fit a unix socket address", sandbox.ErrInvalid, opts.StateDir, n, maxSocketPath)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	// Create derives a key per sandbox and every request to an agent carries a signed token
	// (token.DeriveKey, Connect): build Ed25519's table in the background now.
	token.PrecomputeEd25519()
	b := &Backend{
		opts:     opts,
		etc:      newEtcCache(opts.StateDir),
		log:      opts.Logger.With("backend", "local"),
		sessions: map[string]*session{},
		stop:     make(chan struct{}),
	}
	if b.agentPath, b.agentArgs, err = resolveAgent(opts.AgentPath, opts.AgentArgs, asRoot); err != nil {
		return nil, err
	}
	if b.cg, err = newCgroupDriver(opts.CgroupParent); err != nil {
		return nil, fmt.Errorf("%w: %v", sandbox.ErrUnsupported, err)
	}
	if !asRoot {
		if b.rootless, err = probeRootless(b.cg, opts.CgroupParent); err != nil {
			return nil, fmt.Errorf("%w: not root: %v", sandbox.ErrUnsupported, err)
		}
	}
	if err := prepareStateDir(opts.StateDir, asRoot); err != nil {
		return nil, err
	}
	if b.ids, err = idrange.NewAllocator(opts.StateDir, opts.UIDBase, opts.UIDRanges); err != nil {
		return nil, err
	}
	b.caps = b.capabilitySet() // probed (or read from the state dir) in the background
	if opts.OneShot {
		// An existing secret is only read: no lock needed. Otherwise (a state dir's first
		// start, or a secret being written) it is made or read under the lock, and this New
		// reconciles too.
		if b.master, err = readMaster(opts.StateDir); err == nil {
			return b, nil
		}
	}
	release, err := flock(opts.StateDir, unix.LOCK_EX)
	if err != nil {
		return nil, err
	}
	defer release()
	if b.master, err = loadMaster(opts.StateDir); err != nil {
		return nil, err
	}
	if err := b.reconcile(ctx); err != nil {
		b.Close()
		return nil, &ReconcileError{Reaped: b.reaped, Err: err}
	}
	inUse := map[string]bool{}
	b.mu.Lock()
	for _, s := range b.sessions {
		inUse[s.rec.EtcDir] = true
	}
	b.mu.Unlock()
	if err := b.etc.gc(inUse); err != nil {
		b.log.Warn("removing unused /etc copies", "err", err)
	}
	return b, nil
}

// Close stops watching sessions; it does not terminate them (a later New adopts them).
func (b *Backend) Close() error {
	b.mu.Lock()
	if !b.closed {
		b.closed = true
		close(b.stop)
	}
	sessions := make([]*session, 0, len(b.sessions))
	for _, s := range b.sessions {
		sessions = append(sessions, s)
	}
	b.mu.Unlock()
	// gVisor lifetime timers are this process's; a later New re-arms them.
	for _, s := range sessions {
		s.dropCachedClient() // the sandbox lives on; this process's connection to it does not
		s.mu.Lock()
		if s.stopTimer != nil {
			s.stopTimer()
		}
		s.mu.Unlock()
	}
	b.watchers.Wait()
	return b.closeEgress() // egress.go: the sandboxes' network goes until a later New adopts them
}

// CgroupParentFor is the cgroup parent a root runtime on stateDir uses when Options leave it
// empty: whoever removes a state dir for good removes that cgroup too (airlock gc does).
func CgroupParentFor(stateDir string) string {
	if stateDir == DefaultStateDir {
		return defaultCgroupParent
	}
	return defaultCgroupParent + "-" + shortHash(stateDir)
}

// prepareStateDir creates the state dir 0711: the sandbox's mapped root must traverse it to
// reach its own session directory, but may not list it. Every parent must be traversable too
// (by others: a root runtime's sandbox root is an id of its own; a rootless one's is the user,
// rootless.go, who made the dir).
func prepareStateDir(dir string, asRoot bool) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o711); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	made := true
	if err := os.Mkdir(dir, 0o711); errors.Is(err, fs.ErrExist) {
		made = false
	} else if err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	if asRoot {
		if err := ownTmpfs(dir, made); err != nil {
			return fmt.Errorf("state dir: %w", err)
		}
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	// Every native sandbox mounts its root on this one directory, each in its own mount
	// namespace: no per-session mount point to make and remove (two metadata writes of the
	// state dir's filesystem per sandbox).
	if err := os.Mkdir(filepath.Join(dir, rootMountDir), 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("state dir: %w", err)
	}
	for p := filepath.Dir(dir); asRoot; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("state dir parent: %w", err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("%w: state dir %s: its parent %s (mode %v) is not searchable by others; the sandbox's mapped root must reach its session directory", sandbox.ErrInvalid, dir, p, fi.Mode().Perm())
		}
		if p == "/" {
			return nil
		}
	}
	return nil
}

// resolveAgent finds the agent binary (statedir.ResolveAgent); the sandbox's mapped root runs
// it, so it must be executable by others (rootless, that root is the user itself).
func resolveAgent(opt string, args []string, asRoot bool) (string, []string, error) {
	return statedir.ResolveAgent(opt, args, func(abs string, fi fs.FileInfo) error {
		if asRoot && fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("%w: agent binary %s must be a regular file executable by others (mode %v): the sandbox's mapped root runs it", sandbox.ErrInvalid, abs, fi.Mode().Perm())
		}
		return nil
	})
}

// Platform is local.
func (b *Backend) Platform() capability.Platform { return capability.Local }

// Capabilities reports what this backend enforces on this host.
func (b *Backend) Capabilities(ctx context.Context) capability.Set { return b.caps() }

// resolved is a declaration turned into what the runtime needs.
type resolved struct {
	limits   limits
	disk     int64
	lifetime time.Duration
	workdir  string
	rootKind string
	rootSrc  string
	// imageIDs, when not 0, is the host id rootSrc's files of id 0 belong to (an unpacked
	// image's UIDBase): its clone is idmapped onto the sandbox's range (idmap.go).
	imageIDs int
	// policy is the agent's run policy (wire.NewPolicy): environment, refused paths,
	// deadlines, output cap, idle timeout.
	policy   wire.Policy
	hostname string
	gvisor   bool
	// snapshot is set for a sandbox made from a snapshot (snapshot.go).
	snapshot *snapshotRestore
}

// deniedWorkdirs are paths the runtime mounts itself; a workdir there would shadow them.
var deniedWorkdirs = []string{"/", "/proc", "/dev", "/sys", "/tmp", nsinit.AirlockDir, "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib64"}

func (b *Backend) resolve(ctx context.Context, decl spec.Sandbox) (*resolved, error) {
	bad := func(field, value, msg string) error {
		return fmt.Errorf("%w: %s %q: %s", sandbox.ErrInvalid, field, value, msg)
	}
	if err := spec.ValidateID(decl.ID); err != nil {
		return nil, err
	}
	r := &resolved{hostname: decl.ID}
	switch decl.Runtime {
	case "", spec.RuntimeNative:
	case spec.RuntimeGVisor:
		if _, err := gvisor.Find(b.opts.RunscPath); err != nil {
			return nil, err
		}
		r.gvisor = true
	default:
		return nil, fmt.Errorf("%w: runtime %q is not available on the local backend (native, gvisor)", sandbox.ErrUnsupported, decl.Runtime)
	}
	if err := egresswire.Check(decl.Egress, r.gvisor, b.egressEnforceable); err != nil { // egress.go
		return nil, err
	}
	if len(decl.PreviewPorts) > 0 && r.gvisor { // preview.go
		return nil, fmt.Errorf("%w: previewPorts: the preview proxy reaches native sandboxes only (gVisor has its own network stack)", sandbox.ErrUnsupported)
	}
	var err error
	if r.limits.CPUMillis, err = decl.Limits.CPUMillis(); err != nil {
		return nil, fmt.Errorf("%w: limits.cpu: %v", sandbox.ErrInvalid, err)
	}
	if r.limits.MemoryBytes, err = decl.Limits.MemoryBytes(); err != nil {
		return nil, fmt.Errorf("%w: limits.memory: %v", sandbox.ErrInvalid, err)
	}
	if r.disk, err = decl.Limits.DiskBytes(); err != nil {
		return nil, fmt.Errorf("%w: limits.disk: %v", sandbox.ErrInvalid, err)
	}
	r.limits.MaxProcesses = decl.Limits.Processes()
	switch {
	case r.limits.CPUMillis < 10:
		return nil, bad("limits.cpu", string(decl.Limits.CPU), "at least 10m")
	case r.limits.MemoryBytes < spec.MinMemoryBytes:
		return nil, bad("limits.memory", string(decl.Limits.Memory), "at least 1Mi")
	case r.disk < spec.MinDiskBytes:
		return nil, bad("limits.disk", string(decl.Limits.Disk), "at least 1Mi")
	case r.limits.MaxProcesses < 1 || r.limits.MaxProcesses > idRange:
		return nil, bad("limits.maxProcesses", fmt.Sprint(r.limits.MaxProcesses), fmt.Sprintf("must be 1..%d", idRange))
	}
	life := decl.Session.Lifetime()
	if life < 1 {
		return nil, bad("session.maxLifetimeSeconds", fmt.Sprint(life), "at least 1")
	}
	r.lifetime = time.Duration(life) * time.Second
	r.workdir = decl.Workdir
	if r.workdir == "" {
		r.workdir = spec.DefaultWorkdir
	}
	if !path.IsAbs(r.workdir) || path.Clean(r.workdir) != r.workdir {
		return nil, bad("workdir", r.workdir, "must be an absolute, clean path")
	}
	for _, d := range deniedWorkdirs {
		if r.workdir == d || (d != "/" && strings.HasPrefix(r.workdir, d+"/")) {
			return nil, bad("workdir", r.workdir, "is a directory the runtime owns ("+d+")")
		}
	}
	var imageEnv []string
	switch decl.Image.Kind() {
	case spec.ImageHost:
		r.rootKind = nsinit.RootHost
	case spec.ImageDir:
		d, err := filepath.Abs(decl.Image.Dir)
		if err != nil {
			return nil, err
		}
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			return nil, bad("image.dir", decl.Image.Dir, "is not a directory")
		}
		r.rootKind, r.rootSrc = nsinit.RootDir, d
	case spec.ImageOCILayout, spec.ImageTarball, spec.ImageRef:
		// Native sandboxes map their ids onto UIDBase..: unpack so. gVisor maps none.
		opts := b.imageResolveOptions() // snapshot.go
		if r.gvisor {
			opts.UIDBase, opts.IDCount = 0, 0
		}
		dir, err := image.ResolveWith(ctx, decl.Image, b.opts.ImageCacheDir, opts)
		if err != nil {
			return nil, err
		}
		r.rootKind, r.rootSrc, r.imageIDs = nsinit.RootDir, dir, opts.UIDBase
		if entry, err := image.Inspect(dir); err == nil {
			imageEnv = entry.Config.Env
		}
	case spec.ImageSnapshot:
		if imageEnv, err = b.resolveSnapshot(ctx, decl, r); err != nil { // snapshot.go
			return nil, err
		}
	default:
		return nil, fmt.Errorf("%w: image: exactly one source must be set", sandbox.ErrInvalid)
	}
	r.policy = agentPolicy(decl, r.workdir, imageEnv, r.lifetime)
	return r, nil
}

// agentPolicy is the run policy of a local sandbox's agent. The agent keeps the idle timeout
// itself: no activity for that long and it returns, so PID 1 exits and the sandbox ends as at
// its lifetime.
func agentPolicy(decl spec.Sandbox, workdir string, imageEnv []string, lifetime time.Duration) wire.Policy {
	return wire.NewPolicy(wire.PolicyFor{
		Workdir: workdir, User: nsinit.CodeUser, ImageEnv: imageEnv, Env: decl.Env,
		Lifetime: lifetime, IdleTimeout: time.Duration(decl.Session.IdleTimeout()) * time.Second,
		RuntimePaths: []string{nsinit.AirlockDir},
	})
}

// Create starts a sandbox and returns once its agent answers. What the backend's set says no
// to is refused first (plan.CheckSandbox: ErrRefused naming the capability).
func (b *Backend) Create(ctx context.Context, decl spec.Sandbox) (*sandbox.Session, error) {
	ph := createPhases{begin: nsinit.Clock()}
	// The compiled seccomp filter (~0.3 ms the first time in a process) is made while the
	// declaration resolves; never in New, whose process may only claim (airlock run with a
	// parked sandbox) or reconcile.
	go func() { _, _ = seccomp.For(b.cg.version()) }()
	// What this backend's own set says no to is refused, naming the capability: the set plan
	// and 'airlock capabilities' read (capabilities.go).
	if err := plan.CheckSandbox(decl, b.caps()); err != nil {
		return nil, err
	}
	r, err := b.resolve(ctx, decl)
	if err != nil {
		return nil, err
	}
	prog, err := seccomp.For(b.cg.version())
	if err != nil {
		return nil, fmt.Errorf("%w: %v", sandbox.ErrUnsupported, err)
	}
	// Shared: creates run side by side; a reconcile (exclusive) waits for them.
	release, err := flock(b.opts.StateDir, unix.LOCK_SH)
	if err != nil {
		return nil, err
	}
	defer release()
	id, err := newSessionID()
	if err != nil {
		return nil, err
	}
	var s *session
	if r.gvisor {
		s, err = b.startGVisor(ctx, id, decl, r)
	} else {
		s, err = b.start(ctx, id, decl, r, prog, &ph)
	}
	if err != nil {
		// Everything the attempt made goes; an error here is worth more than the first one
		// only if the sandbox could not be removed.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if derr := b.destroy(cctx, id, s); derr != nil {
			return nil, fmt.Errorf("%w (and cleaning up failed: %v)", err, derr)
		}
		return nil, err
	}
	return s.public(), nil
}

// start creates the state dir and cgroup, starts init and waits until the agent answers.
// On error the caller destroys what was made (s may be nil or partial).
func (b *Backend) start(ctx context.Context, id string, decl spec.Sandbox, r *resolved, prog *seccomp.Program, ph *createPhases) (*session, error) {
	// The /etc copy is checked against its sources while the cgroups are made and init
	// starts; only the config needs it.
	etcc := make(chan etcResult, 1)
	if r.rootKind == nsinit.RootHost {
		go func() {
			d, err := b.etc.get(r.workdir)
			etcc <- etcResult{d, err}
		}()
	} else {
		etcc <- etcResult{}
	}
	etc := sync.OnceValue(func() etcResult { return <-etcc })
	defer etc() // never leave the goroutine behind
	dir := filepath.Join(b.opts.StateDir, id)
	// The sandbox's own host ids (idrange); s.rec carries them from here on, so a failed
	// create's destroy frees them. Rootless, the user's own (rootless.go).
	idr, idBase := 0, 0
	if b.rootless != nil {
		idBase = b.rootless.UID
	} else {
		var err error
		if idr, idBase, err = b.ids.Claim(id); err != nil {
			return nil, err
		}
	}
	// The cgroups (handed to the sandbox's root) and the session dir and key do not depend
	// on each other: the cgroups, the slowest (a directory and limits in each hierarchy), are
	// made on another thread meanwhile.
	type cgResult struct {
		cg  sandboxCgroup
		err error
	}
	cgc := make(chan cgResult, 1)
	go func() {
		cg, err := b.cg.create(id, r.limits)
		if err == nil {
			err = cg.delegate(idBase, idBase)
		}
		cgc <- cgResult{cg, err}
	}()
	// A directory root's locked clone (idmap.go) needs only the range: made meanwhile too.
	type treeResult struct {
		tree *os.File
		err  error
	}
	treec := make(chan treeResult, 1)
	if r.rootKind == nsinit.RootDir && b.rootless == nil { // root's alone (rootless.go)
		go func() {
			t, err := b.rootTree(r.rootSrc, r.imageIDs, idBase)
			treec <- treeResult{t, err}
		}()
	} else {
		treec <- treeResult{}
	}
	key, ring, err := b.sessionDirAndKey(dir, id, idBase)
	cgr := <-cgc
	tr := <-treec
	if tr.tree != nil {
		defer tr.tree.Close()
	}
	rootSrc := r.rootSrc
	var hc *hostCopy
	if tr.tree != nil && err == nil {
		// In the host's namespace only until init's clone has copied (and locked) it.
		if rootSrc, err = attachImage(dir, tr.tree); err == nil {
			hc = newHostCopy(dir)
			defer hc.wait()
		}
	}
	err = errors.Join(err, tr.err)
	now := time.Now()
	s := &session{
		dir: dir, key: key, cg: cgr.cg, done: make(chan struct{}),
		rec: record{RecordCore: sessions.RecordCore{
			ID: id, SandboxID: decl.ID, Generation: 1, CreatedAt: now.UTC(), ExpiresAt: now.Add(r.lifetime).UTC(),
			Cgroup: path.Join("/", b.opts.CgroupParent, id), CgroupVersion: b.cg.version(),
			IDRange: idr, IDBase: idBase, Creator: creatorOf(decl),
		}, Spec: decl},
	}
	if err = errors.Join(err, cgr.err); err != nil {
		return s, err // destroy removes whichever of the two was made
	}
	cg := s.cg
	cfg := &nsinit.Config{
		SessionDir: dir, RootMount: filepath.Join(b.opts.StateDir, rootMountDir), Hostname: decl.ID, RootKind: r.rootKind, RootSource: rootSrc,
		DiskBytes: r.disk, Workdir: r.workdir, CgroupVersion: b.cg.version(),
		Deadline: s.rec.ExpiresAt, Seccomp: prog.BPF,
		Agent: agent.Config{
			SandboxID: decl.ID, SessionID: id, Generation: s.rec.Generation, KeyRing: string(ring),
			Workdir: r.workdir, Policy: r.policy,
			// On v2 the agent cannot read the sandbox cgroup's usage (execParent): an upload
			// into the writable layer (tmpfs, in memory) is checked against this instead.
			MemoryBytes: r.limits.MemoryBytes,
		},
	}
	restored, err := b.prepareSnapshot(ctx, dir, r, cfg, s.rec.IDBase) // snapshot.go
	if err != nil {
		return s, err
	}
	defer restored()
	ph.spawn = nsinit.Clock()
	st, err := b.spawn(ctx, s, cg, cfg, func() error {
		if hc != nil {
			hc.detach()
		}
		e := etc()
		cfg.EtcDir = e.dir
		if e.dir != "" {
			s.rec.EtcDir = filepath.Base(e.dir)
		}
		return e.err
	})
	if err != nil {
		return s, err
	}
	s.rec.LandlockABI = st.LandlockABI
	// Init's ready line is the agent's own word that it serves: written once it listens, its
	// spawner thread is ready and its HTTP server runs (agent.Hooks.Ready), so the next request
	// is answered. No health round trip is added (~0.4 ms of a fresh call; the first request
	// opens the connection). The record is complete now (other processes find the session by
	// it; a failed create removes it with the rest, under the shared lock a reconcile waits for).
	if err := writeRecord(dir, &s.rec); err != nil {
		return s, err
	}
	if hc != nil {
		if err := hc.wait(); err != nil {
			return s, err
		}
	}
	s.cachedClient.Store(b.client(s))
	b.mu.Lock()
	b.sessions[id] = s
	b.mu.Unlock()
	if b.log.Enabled(ctx, slog.LevelDebug) { // the phases' group is built only for a reader
		b.log.Debug("sandbox created", "session", id, "sandbox", decl.ID, "pid", s.rec.InitPID, "landlockAbi", st.LandlockABI,
			"phases", ph.log(st.Marks, nsinit.Clock()))
	}
	return s, nil
}

// createPhases are a create's times (nsinit.Clock readings) for its debug log line: when it
// began and when init's spawn began.
type createPhases struct{ begin, spawn int64 }

// log is the create's phases ending at end, each from a mark that causally precedes the next:
// prepare (the declaration resolved, cgroups, session dir and key, the image's clone), start
// (into the cgroups, the clone, init's exec and its Go runtime's start, to init's main), then
// init's own (marks, from its ready status): config, root, serve; and ready (the status line
// read, the record written). Without init's marks: prepare, init, total.
func (ph *createPhases) log(marks *nsinit.Marks, end int64) slog.Value {
	d := func(from, to int64) time.Duration { return time.Duration(to - from) }
	attrs := []slog.Attr{slog.Duration("prepare", d(ph.begin, ph.spawn))}
	if marks != nil {
		attrs = append(attrs, slog.Duration("start", d(ph.spawn, marks.Main)), slog.Duration("config", d(marks.Main, marks.Config)),
			slog.Duration("root", d(marks.Config, marks.Root)), slog.Duration("serve", d(marks.Root, marks.Ready)),
			slog.Duration("ready", d(marks.Ready, end)))
	} else {
		attrs = append(attrs, slog.Duration("init", d(ph.spawn, end)))
	}
	return slog.GroupValue(append(attrs, slog.Duration("total", d(ph.begin, end)))...)
}

// sessionDirAndKey makes the session dir (the sandbox's mapped root traverses it and owns its
// run dir, where the agent listens) and derives the session's key and the key ring the agent
// verifies tokens with.
func (b *Backend) sessionDirAndKey(dir, id string, idBase int) (ed25519.PrivateKey, []byte, error) {
	if err := os.Mkdir(dir, 0o711); err != nil {
		return nil, nil, fmt.Errorf("session dir: %w", err)
	}
	if err := os.Chmod(dir, 0o711); err != nil { // umask
		return nil, nil, err
	}
	run := filepath.Join(dir, "run")
	if err := os.Mkdir(run, 0o700); err != nil {
		return nil, nil, err
	}
	if err := os.Chown(run, idBase, idBase); err != nil {
		return nil, nil, err
	}
	key, err := token.DeriveKey(b.master, id)
	if err != nil {
		return nil, nil, err
	}
	ring, err := token.NewKeyRing(key.Public().(ed25519.PublicKey)).MarshalText()
	if err != nil {
		return nil, nil, err
	}
	return key, ring, nil
}

// etcResult is a host-image sandbox's /etc copy (etcCache.get).
type etcResult struct {
	dir string
	err error
}

// spawn starts init in its namespaces and cgroups, completes the config (finish), sends it
// and waits for init's status line.
func (b *Backend) spawn(ctx context.Context, s *session, cg sandboxCgroup, cfg *nsinit.Config, finish func() error) (*nsinit.Status, error) {
	self, err := os.Open(b.agentPath)
	if err != nil {
		return nil, fmt.Errorf("agent binary: %w", err)
	}
	defer self.Close()
	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer cfgR.Close()
	defer cfgW.Close()
	stR, stW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer stR.Close()
	defer stW.Close()
	logf, err := os.OpenFile(filepath.Join(s.dir, initLog), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	ids := []syscall.SysProcIDMap{{ContainerID: 0, HostID: s.rec.IDBase, Size: idRange}}
	cmd := &exec.Cmd{
		// The binary by descriptor: its directory need not be searchable by the mapped ids.
		Path: fmt.Sprintf("/proc/self/fd/%d", nsinit.FDSelf),
		Args: append(append([]string{"airlock-agent"}, b.agentArgs...), "init"),
		// GOMAXPROCS: the agent runs on one P anyway (agentcmd.Main); given at start, the Go
		// runtime skips its cgroup CPU-limit lookup (mountinfo and cgroup files: ~0.1 ms of
		// every init) and the later resize. Commands get an environment of their own.
		Env:    []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "GOTRACEBACK=single", "GOMAXPROCS=1"},
		Dir:    "/",
		Stdout: logf,
		Stderr: logf,
		// Order fixes the fd numbers: 3 self, 4 config, 5 status (6 the exec cgroups' parent).
		ExtraFiles: []*os.File{self, cfgR, stW},
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID |
				syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
			UidMappings:                ids,
			GidMappings:                ids,
			GidMappingsEnableSetgroups: true,
			// Root of the new user namespace, or it has no capabilities there for mounts.
			Credential: &syscall.Credential{Uid: 0, Gid: 0},
			Setsid:     true,
		},
	}
	if f, err := cg.execParent(); err != nil {
		return nil, err
	} else if f != nil {
		defer f.Close()
		cmd.ExtraFiles = append(cmd.ExtraFiles, f)
	}
	if b.rootless != nil {
		// Maps only newuidmap/newgidmap can write, after the exec (rootless.go).
		a := cmd.SysProcAttr
		a.UidMappings, a.GidMappings, a.GidMappingsEnableSetgroups, a.Credential = nil, nil, false, nil
		cfg.Reexec = true
		err = b.startRootless(s, cg, cmd, cfg)
	} else {
		// Born inside its cgroups; it still waits for the config before doing anything. A
		// refill is born idle (idle.go).
		if startsIdle(ctx) && b.canIdle() {
			err = sched.StartIdle(func() error { return cg.start(cmd) })
		} else {
			err = cg.start(cmd)
		}
		if cmd.Process != nil {
			// Started (if the thread could not leave the cgroups, still ours to reap).
			b.watchStarted(s, cmd)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("start sandbox init: %w", err)
	}
	if s.rec.InitStart, err = startTime(cmd.Process.Pid); err != nil {
		return nil, fmt.Errorf("read init start time: %w", err)
	}
	cfgR.Close()
	stW.Close()
	// Init waits for the config, so what is left of it is completed while init starts.
	if err := finish(); err != nil {
		return nil, err
	}
	// egress.go: the network is wired while init still waits, before anything runs inside.
	if err := b.attachEgress(ctx, s, cfg); err != nil {
		return nil, err
	}
	enc, err := cfg.Encode()
	if err != nil {
		return nil, err
	}
	if _, err := cfgW.Write(enc); err != nil {
		return nil, fmt.Errorf("send config to init: %w", err)
	}
	cfgW.Close()
	type result struct {
		st  nsinit.Status
		err error
	}
	ch := make(chan result, 1)
	go func() {
		line, err := bufio.NewReader(stR).ReadBytes('\n')
		var st nsinit.Status
		if len(line) > 0 {
			err = json.Unmarshal(line, &st)
		} else if err != nil {
			err = fmt.Errorf("init exited without a status (%v)", err)
		}
		ch <- result{st, err}
	}()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, startTimeout)
		defer cancel()
	}
	select {
	case <-ctx.Done():
		stR.Close() // the reader goroutine ends; init, if still alive, is killed by destroy
		return nil, fmt.Errorf("%w: sandbox did not start: %v", sandbox.ErrDeadlineExceeded, ctx.Err())
	case r := <-ch:
		if r.err != nil || !r.st.Ready {
			msg := r.st.Error
			if r.err != nil {
				msg = r.err.Error()
			}
			return nil, fmt.Errorf("sandbox init failed: %s%s", msg, b.logTail(s.dir))
		}
		return &r.st, nil
	}
}

// logTail returns the end of init's log, for errors.
func (b *Backend) logTail(dir string) string {
	data, err := os.ReadFile(filepath.Join(dir, initLog))
	if err != nil || len(data) == 0 {
		return ""
	}
	if len(data) > 2048 {
		data = data[len(data)-2048:]
	}
	return "\ninit log:\n" + strings.TrimSpace(string(data))
}

// watchStarted records our just started init in s and watches it (watchChild): the watcher
// may reap it at once, so the record has its pid first.
func (b *Backend) watchStarted(s *session, cmd *exec.Cmd) {
	s.cmd = cmd
	s.rec.InitPID = cmd.Process.Pid
	b.watchChild(s)
}

// watchChild reaps our own init when it exits, then removes the sandbox's remains unless a
// Terminate is already doing so.
func (b *Backend) watchChild(s *session) {
	go func() {
		_ = s.cmd.Wait()
		close(s.done)
		b.reapExited(s)
	}()
}

// watchAdopted does the same for an init another process started: a pidfd becomes readable
// when the process exits.
func (b *Backend) watchAdopted(s *session, pidfd int) {
	b.watchers.Add(1)
	go func() {
		defer b.watchers.Done()
		defer unix.Close(pidfd)
		stopR, stopW, err := os.Pipe()
		if err != nil {
			return
		}
		defer stopR.Close()
		go func() {
			<-b.stop
			stopW.Close()
		}()
		if !sessions.WaitExit(pidfd, int(stopR.Fd())) {
			return
		}
		close(s.done)
		b.reapExited(s)
	}()
}

func (b *Backend) reapExited(s *session) {
	s.mu.Lock()
	gone := s.gone || s.killed
	s.mu.Unlock()
	if gone {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.destroy(ctx, s.rec.ID, s); err != nil {
		b.log.Error("reap exited sandbox", "session", s.rec.ID, "err", err)
	}
}

func (s *session) public() *sandbox.Session {
	state := sandbox.StateRunning
	select {
	case <-s.done:
		state = sandbox.StateTerminated
	default:
		if s.paused() { // pause.go
			state = sandbox.StatePaused
		}
	}
	return &sandbox.Session{
		ID: s.rec.ID, SandboxID: s.rec.SandboxID, Platform: string(capability.Local), State: state,
		Generation: s.rec.Generation, CreatedAt: s.rec.CreatedAt, ExpiresAt: s.rec.ExpiresAt,
		Labels: s.rec.Spec.Labels, Spec: s.rec.Spec,
	}
}

func (s *session) exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// lookup finds a live session: one this process knows, or one another process created in the
// same state dir (adopted on first use).
func (b *Backend) lookup(ctx context.Context, id string) (*session, error) {
	if err := checkSessionID(id); err != nil {
		return nil, err
	}
	if s := b.known(id); s != nil {
		return knownLive(s)
	}
	dir := filepath.Join(b.opts.StateDir, id)
	rec, err := readRecord(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: session %s", sandbox.ErrNotFound, id)
	}
	return b.lookupRecord(ctx, dir, rec)
}

// knownLive is lookup's answer for a session this process holds.
func knownLive(s *session) (*session, error) {
	if s.exited() {
		return nil, fmt.Errorf("%w: session %s has ended", sandbox.ErrNotFound, s.rec.ID)
	}
	if heldElsewhere(s.dir, s.rec.Spec.Labels) { // pool_held.go
		return nil, errHeldElsewhere(s.rec.ID)
	}
	return s, nil
}

// lookupRecord is lookup for a session whose record (in dir) the caller has read.
func (b *Backend) lookupRecord(ctx context.Context, dir string, rec *record) (*session, error) {
	id := rec.ID
	if s := b.known(id); s != nil {
		return knownLive(s)
	}
	if heldElsewhere(dir, rec.Spec.Labels) {
		return nil, errHeldElsewhere(id)
	}
	s, err := b.adopt(ctx, dir, rec)
	if err != nil {
		return nil, fmt.Errorf("%w: session %s: %v", sandbox.ErrNotFound, id, err)
	}
	return s, nil
}

// Get returns a live session.
func (b *Backend) Get(ctx context.Context, sessionID string) (*sandbox.Session, error) {
	s, err := b.lookup(ctx, sessionID)
	if err != nil {
		return nil, err
	}
	return s.public(), nil
}

// List returns every live session in the state dir, but pool sandboxes other processes hold
// (pool_held.go).
func (b *Backend) List(ctx context.Context) ([]*sandbox.Session, error) {
	entries, err := os.ReadDir(b.opts.StateDir)
	if err != nil {
		return nil, err
	}
	var out []*sandbox.Session
	for _, e := range entries {
		if !e.IsDir() || checkSessionID(e.Name()) != nil {
			continue
		}
		s, err := b.lookup(ctx, e.Name())
		if err != nil {
			continue // being created, or gone
		}
		out = append(out, s.public())
	}
	slices.SortFunc(out, func(a, c *sandbox.Session) int { return a.CreatedAt.Compare(c.CreatedAt) })
	return out, nil
}

// Connect returns an agent client whose every request carries a freshly minted execute token.
func (b *Backend) Connect(ctx context.Context, sessionID string) (sandbox.Agent, error) {
	s, err := b.lookup(ctx, sessionID)
	if err != nil {
		return nil, err
	}
	if c := s.takeCachedClient(); c != nil {
		return pause.NewAgent(c, s.freezer(), s.rec.ID), nil
	}
	return b.pausableClient(s), nil // pause.go: refuses calls while paused
}

func (b *Backend) client(s *session) *client.Client {
	return client.New("unix:"+filepath.Join(s.dir, "run", "agent.sock"), sessions.Tokens(s.key, s.rec.RecordCore, time.Now))
}

// Terminate destroys the sandbox and everything it made, succeeding only once it is gone.
func (b *Backend) Terminate(ctx context.Context, sessionID string) error {
	if err := checkSessionID(sessionID); err != nil {
		return err
	}
	return b.destroy(ctx, sessionID, b.known(sessionID))
}

// known is the session this process holds for id, nil when it holds none.
func (b *Backend) known(id string) *session {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sessions[id]
}

// kill ends every process of an adopted sandbox and returns once its init is gone, leaving its
// cgroups and state dir to a later Terminate, by any process: the part of a terminate its
// caller must wait for, when another process can do the rest off its path (airlock run hands
// a used parked sandbox to the filler it starts). Until then the remains are a broken sandbox, which a
// reconcile reaps once this process is gone. A sandbox this process cannot kill through its
// init's pidfd (its own child, gVisor's) is terminated whole.
func (b *Backend) kill(ctx context.Context, sessionID string) error {
	if err := checkSessionID(sessionID); err != nil {
		return err
	}
	s := b.known(sessionID)
	if s == nil || s.pidfd <= 0 {
		return b.Terminate(ctx, sessionID)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone || s.killed {
		return nil
	}
	s.dropCachedClient()
	// PID 1 of the sandbox's pid namespace: the kernel kills every other process there and
	// has reaped them all by the time init exits and its pidfd turns readable.
	// The kill a one-shot claimer makes without this package (sessions.Claimed.Kill) too.
	if err := sessions.SignalKill(s.pidfd, s.freezer()); err != nil {
		return fmt.Errorf("%w: kill %s: %v", sandbox.ErrOutcomeUnknown, sessionID, err)
	}
	select {
	case <-s.done:
	case <-ctx.Done():
		return fmt.Errorf("%w: kill %s: init %d still alive: %v", sandbox.ErrOutcomeUnknown, sessionID, s.rec.InitPID, ctx.Err())
	}
	s.killed = true
	b.forget(sessionID, s)
	return nil
}

// forget drops s from this process's sessions, unless id now names another session.
func (b *Backend) forget(id string, s *session) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sessions[id] == s {
		delete(b.sessions, id)
	}
}

// destroy kills the sandbox's cgroup, waits for init to be gone, removes the cgroups and the
// state dir, and confirms all of it. s may be nil (a session this process does not know).
func (b *Backend) destroy(ctx context.Context, id string, s *session) error {
	if s != nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.gone {
			return nil
		}
	}
	dir := filepath.Join(b.opts.StateDir, id)
	var rec *record
	if s != nil {
		s.dropCachedClient()
		rec = &s.rec
		if s.stopTimer != nil {
			s.stopTimer()
		}
	} else if r, err := readRecord(dir); err == nil {
		rec = r
	}
	_, err := os.Stat(filepath.Join(dir, "runsc"))
	gvisor := err == nil
	if gvisor {
		if err := b.stopGVisor(ctx, dir, id); err != nil {
			return fmt.Errorf("%w: terminate %s: %v", sandbox.ErrOutcomeUnknown, id, err)
		}
	}
	var cg sandboxCgroup
	if s != nil && s.cg != nil {
		cg = s.cg // made by this process: no need to look for it
	} else if c, err := b.cg.load(id); err == nil {
		cg = c
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: terminate %s: %v", sandbox.ErrOutcomeUnknown, id, err)
	}
	removed := false
	own := s != nil && s.cmd != nil && s.cmd.Process != nil
	if adopted := s != nil && s.pidfd > 0 && !gvisor; own || adopted {
		// Init first, through its pidfd (no pid reuse): our own child's, or the one an
		// adopted session's watcher holds. It is PID 1 of the sandbox's pid namespace: the
		// kernel kills every other process there and has reaped them all by the time init
		// exits (and its pidfd turns readable), so the cgroup is normally empty then, and
		// removing it at once proves it (rmdir refuses a cgroup with a task) without polling
		// its members. Anything in the cgroup from outside the namespace fails that and is
		// killed below, as is everything when init does not go at once.
		if own {
			_ = s.cmd.Process.Signal(syscall.SIGKILL) // fails only once init is already gone
		} else {
			_ = unix.PidfdSendSignal(s.pidfd, unix.SIGKILL, nil, 0)
		}
		if cg != nil {
			_ = cg.thaw() // a paused sandbox; its cgroup may be gone already
		}
		t := time.NewTimer(initExitWait)
		select {
		case <-s.done:
			removed = cg != nil && cg.removeEmpty() == nil
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	if cg != nil && !removed {
		if err := cg.kill(ctx); err != nil {
			return fmt.Errorf("%w: terminate %s: kill: %v", sandbox.ErrOutcomeUnknown, id, err)
		}
	}
	// Init is in the cgroup, so it is dead; reap it if it is our child.
	if rec != nil && rec.InitPID > 0 {
		if s != nil && s.cmd != nil {
			select {
			case <-s.done:
			case <-ctx.Done():
				return fmt.Errorf("%w: terminate %s: init %d not reaped: %v", sandbox.ErrOutcomeUnknown, id, rec.InitPID, ctx.Err())
			}
		} else if alive(rec.InitPID, rec.InitStart) {
			// Not in the cgroup (an incomplete create) or not our child: kill it directly;
			// its parent (or init) reaps it.
			_ = unix.Kill(rec.InitPID, unix.SIGKILL)
			if err := waitGone(ctx, rec.InitPID, rec.InitStart); err != nil {
				return fmt.Errorf("%w: terminate %s: %v", sandbox.ErrOutcomeUnknown, id, err)
			}
		}
	}
	if cg != nil {
		if !removed {
			if err := cg.remove(); err != nil {
				return fmt.Errorf("%w: terminate %s: %v", sandbox.ErrOutcomeUnknown, id, err)
			}
		}
		for _, d := range cg.dirs() {
			if _, err := os.Stat(d); !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("%w: terminate %s: cgroup %s still exists", sandbox.ErrOutcomeUnknown, id, d)
			}
		}
	}
	// runsc leaves a namespace file bind-mounted in its state (null-netns): whatever is
	// mounted there goes before the files do. A native sandbox mounts in the host's
	// namespace only a directory root's clone, during its create (idmap.go); its own
	// namespace is a copy whose shared mounts the kernel made slaves. So its sessions skip
	// reading the host's mount table and detach that one mount point, there if the create
	// died half-way.
	if native := rec != nil && rec.Runtime == "" && !gvisor; !native {
		// Unless the session dir is gone (a terminate of a sandbox terminated already):
		// nothing is mounted below a directory that does not exist, and the host's mount
		// table is long (~0.4 ms of CPU to read and parse here).
		if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
			if err := unmountUnder(dir); err != nil {
				return fmt.Errorf("%w: terminate %s: %v", sandbox.ErrOutcomeUnknown, id, err)
			}
		}
	} else if err := detachImage(dir); err != nil {
		return fmt.Errorf("%w: terminate %s: %v", sandbox.ErrOutcomeUnknown, id, err)
	}
	if err := b.detachEgress(ctx, id, dir); err != nil { // egress.go
		return fmt.Errorf("%w: terminate %s: egress: %v", sandbox.ErrOutcomeUnknown, id, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("%w: terminate %s: remove state: %v", sandbox.ErrOutcomeUnknown, id, err)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: terminate %s: state dir %s still exists", sandbox.ErrOutcomeUnknown, id, dir)
	}
	// Nothing runs under the sandbox's host ids any more: they may go to another sandbox.
	if err := b.releaseIDs(id, rec); err != nil {
		return fmt.Errorf("%w: terminate %s: %v", sandbox.ErrOutcomeUnknown, id, err)
	}
	if s != nil {
		s.gone = true
		b.forget(id, s)
	}
	return nil
}

// waitGone waits until pid is no longer the process that started at start.
func waitGone(ctx context.Context, pid int, start uint64) error {
	for wait := backoff.New(100*time.Microsecond, 10*time.Millisecond); alive(pid, start); {
		// A zombie whose parent is gone is reaped by init soon; one whose parent lives is
		// that parent's to reap, and counts as dead for the sandbox (it holds nothing).
		if st, err := readStat(pid); err == nil && st.State == 'Z' {
			return nil
		}
		if !wait.Wait(ctx) {
			return fmt.Errorf("process %d still alive: %w", pid, ctx.Err())
		}
	}
	return nil
}
