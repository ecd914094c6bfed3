// Package docker is the docker runtime: sandboxes as containers of a Docker-compatible engine, driven by our agent.
package docker

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/airlock-sandbox/airlock/agent"
	"github.com/airlock-sandbox/airlock/agent/client"
	"github.com/airlock-sandbox/airlock/agent/wire"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/image"
	"github.com/airlock-sandbox/airlock/internal/backoff"
	"github.com/airlock-sandbox/airlock/internal/kernfile"
	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
	"github.com/airlock-sandbox/airlock/token"
)

// Defaults and fixed values.
const (
	DefaultStateDir = "/run/airlock-docker"
	// CodeUID and CodeGID run every command; the agent itself is the container's uid 0. For
	// a user other than root whose uid is CodeUID, commands run as CodeUID+1 (codeIDs): the
	// code must never own the session's directories, bound into its container.
	CodeUID = 1000
	CodeGID = 1000
	// Paths inside the container.
	agentDir        = "/.airlock"
	agentBinPath    = agentDir + "/bin/airlock-agent"
	agentConfigPath = agentDir + "/" + configFile
	agentRunPath    = agentDir + "/" + runDir
	agentFreezer    = agentDir + "/cgroup/freezer"
	// containerMemoryV1 is where runc and crun mount the container's own v1 memory cgroup.
	containerMemoryV1 = kernfile.CgroupRoot + "/memory"
	// Container labels.
	labelSession    = "airlock.session"
	labelSandbox    = "airlock.sandbox"
	labelState      = "airlock.state"
	labelCreated    = "airlock.created"
	labelExpires    = "airlock.expires"
	labelGeneration = "airlock.generation"
	labelSpec       = "airlock.spec"
	// tokenLifetime bounds each minted execute token; a fresh one is minted per request.
	tokenLifetime = 60 * time.Second
	// startTimeout bounds how long Create waits for the agent when ctx has no deadline.
	startTimeout = 60 * time.Second
	// minMemoryBytes is the engines' own floor (docker and podman refuse less than 6 MB).
	minMemoryBytes = 6 << 20
	// minProcesses: the agent is the container's PID 1 and its threads count against the
	// container's pids limit, which is the declared maxProcesses exactly.
	minProcesses = 16
	// agentSpareThreads are the idle threads the agent keeps (agent.Config.SpareThreads).
	agentSpareThreads = 6
	// shmBytes sizes /dev/shm, as on the local runtime.
	shmBytes = 64 << 20
	// maxSocketPath is sockaddr_un's limit (108 bytes with the NUL).
	maxSocketPath = 107
)

// agentCaps are the only capabilities the container keeps; everything else is dropped. The
// agent (the container's uid 0) needs them, the code (uid 1000, no capabilities once it has
// changed uid, no-new-privileges) never holds them:
//   - SETUID, SETGID: drop each command to CodeUID/CodeGID (with an empty group list);
//   - KILL: signal the code's processes, which run under another uid, at deadlines;
//   - CHOWN: the files API gives written files and directories to the code's uid;
//   - DAC_OVERRIDE, FOWNER: the files API reads, writes and chmods the code's files.
var agentCaps = []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL", "CAP_SETGID", "CAP_SETUID"}

// runtimePaths are refused by the files API (with the kernel's filesystems, wire.NewPolicy):
// our own mounts, and the files the engine bind-mounts writable from its own storage (a write
// there would escape the disk limit).
var runtimePaths = []string{agentDir, "/etc/hostname", "/etc/hosts", "/etc/resolv.conf", "/run/.containerenv"}

// deniedWorkdirs are paths the runtime mounts itself or the image needs; a workdir there would shadow them.
var deniedWorkdirs = []string{"/", "/proc", "/dev", "/sys", "/tmp", agentDir, "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib64"}

// Options configure a docker backend.
type Options struct {
	// StateDir holds the master secret and one directory per session (agent config, agent
	// socket, scratch tmpfs); default DefaultStateDirForUser. The engine must run on this
	// machine: these paths are bind-mounted into the containers.
	StateDir string
	// AgentPath is the agent binary, statically linked (CGO_ENABLED=0). Empty: $AIRLOCK_AGENT,
	// "airlock-agent" next to this executable, on PATH, else this executable as "__agent".
	AgentPath string
	// AgentArgs are arguments put before "serve" (the "__agent" fallback sets it).
	AgentArgs []string
	// Engine chooses the engine: EngineAuto (default), EngineAPI, EngineDocker, EnginePodman,
	// EngineNerdctl.
	Engine string
	// Host is the Engine API address (and DOCKER_HOST for the docker CLI); default
	// $DOCKER_HOST, else DefaultHost.
	Host string
	// OpenNetwork is the engine network a sandbox whose egress is open joins; empty means the
	// engine's default network ("podman" for podman, else "bridge"). It must exist and not
	// be internal: open means the container reaches whatever that network routes to.
	OpenNetwork string
	Logger      *slog.Logger
}

// Backend runs sandboxes as containers.
type Backend struct {
	opts      Options
	log       *slog.Logger
	eng       engine
	agentPath string
	agentArgs []string
	master    []byte
	tag       string // this state dir's airlock.state label value
	// freezer is set when the host has a v1 freezer hierarchy: each session gets a freezer
	// cgroup the agent kills execs through (kill scope cgroup-v1, not process-group).
	freezer bool
	// asUser is set when this process is not root (a user with access to a rootful engine's
	// socket): it mounts nothing on the host, so the engine mounts each session's scratch, and
	// the agent gives its socket to this user.
	asUser bool
	// codeUID and codeGID run every command (codeIDs).
	codeUID, codeGID uint32
	caps             capability.Set
}

// codeIDs is the uid and gid commands run as for a backend run by uid: CodeUID and CodeGID,
// unless uid is CodeUID (a user's backend), whose session directories (its own, the agent's
// socket in them) the code would then own; then the next ones.
func codeIDs(uid int) (uint32, uint32) {
	if uid == CodeUID {
		return CodeUID + 1, CodeGID + 1
	}
	return CodeUID, CodeGID
}

// DefaultStateDirForUser is DefaultStateDir for root and $XDG_RUNTIME_DIR/airlock-docker for
// any other user ("" when that is unset).
func DefaultStateDirForUser() string {
	if os.Geteuid() == 0 {
		return DefaultStateDir
	}
	if run := os.Getenv("XDG_RUNTIME_DIR"); run != "" {
		return filepath.Join(run, "airlock-docker")
	}
	return ""
}

var _ sandbox.Backend = (*Backend)(nil)

// New detects the engine and prepares the state dir, removing what sessions whose containers
// are gone left behind.
func New(ctx context.Context, opts Options) (*Backend, error) {
	asUser := os.Geteuid() != 0
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
	if n := len(opts.StateDir) + len("/s-0123456789abcdef/run/agent.sock"); n > maxSocketPath {
		return nil, fmt.Errorf("%w: stateDir %q is too long: the agent socket path would be %d bytes, at most %d fit a unix socket address", sandbox.ErrInvalid, opts.StateDir, n, maxSocketPath)
	}
	if strings.ContainsAny(opts.StateDir, ":,") {
		return nil, fmt.Errorf("%w: stateDir %q: a bind-mounted path may not contain ':' or ','", sandbox.ErrInvalid, opts.StateDir)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	b := &Backend{opts: opts, log: opts.Logger.With("backend", "docker"), tag: stateTag(opts.StateDir), asUser: asUser}
	b.codeUID, b.codeGID = codeIDs(os.Geteuid())
	if b.agentPath, b.agentArgs, err = resolveAgent(opts.AgentPath, opts.AgentArgs); err != nil {
		return nil, err
	}
	if strings.ContainsAny(b.agentPath, ":,") {
		return nil, fmt.Errorf("%w: agent binary path %q: a bind-mounted path may not contain ':' or ','", sandbox.ErrInvalid, b.agentPath)
	}
	if err := os.MkdirAll(opts.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	if b.master, err = loadMaster(opts.StateDir); err != nil {
		return nil, err
	}
	if b.eng, err = detect(ctx, opts.Engine, opts.Host, asUser); err != nil {
		return nil, err
	}
	// A user other than root cannot make cgroups in the host's freezer hierarchy.
	b.freezer = !asUser && freezerV1()
	b.caps = capabilities(b.freezer, asUser)
	if err := b.reconcile(ctx); err != nil {
		b.eng.close()
		return nil, err
	}
	b.log.Debug("docker backend ready", "engine", b.eng.describe(), "stateDir", opts.StateDir)
	return b, nil
}

// Close releases the engine connection; it does not terminate sandboxes.
func (b *Backend) Close() error { return b.eng.close() }

// Engine names the engine in use ("Docker Engine API at unix:///...", "podman CLI (/usr/bin/podman)").
func (b *Backend) Engine() string { return b.eng.describe() }

// Platform is docker.
func (b *Backend) Platform() capability.Platform { return capability.Docker }

// Capabilities reports what this backend enforces.
func (b *Backend) Capabilities(ctx context.Context) capability.Set { return b.caps }

// reconcile removes session directories whose container no longer exists (an agent that died
// takes its auto-removed container with it; a crashed creator leaves a half-made directory).
func (b *Backend) reconcile(ctx context.Context) error {
	release, err := flock(b.opts.StateDir, lockExclusive)
	if err != nil {
		return err
	}
	defer release()
	entries, err := os.ReadDir(b.opts.StateDir)
	if err != nil {
		return err
	}
	live, err := b.eng.list(ctx, map[string]string{labelState: b.tag})
	if err != nil {
		return err
	}
	alive := map[string]bool{}
	for _, c := range live {
		alive[c.Labels[labelSession]] = true
	}
	for _, e := range entries {
		if !e.IsDir() || checkSessionID(e.Name()) != nil || alive[e.Name()] {
			continue
		}
		if err := removeSessionDir(filepath.Join(b.opts.StateDir, e.Name())); err != nil {
			return fmt.Errorf("reconcile: %w", err)
		}
		b.log.Debug("removed the remains of an ended session", "session", e.Name())
	}
	cgs, err := os.ReadDir(b.freezerParent())
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("reconcile: %w", err)
	}
	for _, e := range cgs {
		if !e.IsDir() || checkSessionID(e.Name()) != nil || alive[e.Name()] {
			continue
		}
		if err := removeCgroupTree(ctx, filepath.Join(b.freezerParent(), e.Name())); err != nil {
			return fmt.Errorf("reconcile: %w", err)
		}
	}
	return nil
}

// freezerParent is the v1 freezer cgroup this state dir's sessions get theirs under.
func (b *Backend) freezerParent() string {
	return filepath.Join(kernfile.CgroupRoot, "freezer", "airlock-docker-"+b.tag)
}

// resolved is a declaration turned into what the runtime needs.
type resolved struct {
	cpuMillis, memory, disk, procs int64
	lifetime                       time.Duration
	workdir                        string
	// network is what the container joins: "none" (egress deny), or for open the engine
	// network Create found ("" until then).
	network string
}

func resolve(decl spec.Sandbox) (*resolved, error) {
	bad := func(field, value, msg string) error {
		return fmt.Errorf("%w: %s %q: %s", sandbox.ErrInvalid, field, value, msg)
	}
	if err := spec.ValidateID(decl.ID); err != nil {
		return nil, err
	}
	switch decl.Runtime {
	case "", spec.RuntimeNative, spec.RuntimeDocker:
	default:
		return nil, fmt.Errorf("%w: runtime %q: the docker backend runs the engine's own OCI runtime (allowed: native, docker); use the local backend for gvisor", sandbox.ErrUnsupported, decl.Runtime)
	}
	r := &resolved{network: "none"}
	switch decl.Egress.Mode {
	case "", spec.EgressDeny:
	case spec.EgressOpen:
		if len(decl.Egress.Domains) > 0 {
			return nil, bad("egress.domains", strings.Join(decl.Egress.Domains, ","), "only valid with mode allowDomains")
		}
		r.network = "" // the engine's network, chosen and checked by Create
	case spec.EgressAllow:
		return nil, fmt.Errorf("%w: egress mode allow: the docker backend cannot keep a container on a bridge away from private and metadata addresses (capability %s); use deny, or the local runtime", sandbox.ErrUnsupported, capability.PublicOnlyEgress)
	case spec.EgressAllowDomains:
		return nil, fmt.Errorf("%w: egress mode allowDomains: the docker backend has no egress proxy in the container's network path (capability %s)", sandbox.ErrUnsupported, capability.DomainEgressRules)
	default:
		return nil, bad("egress.mode", string(decl.Egress.Mode), "must be deny, allow, allowDomains or open")
	}
	if len(decl.PreviewPorts) > 0 {
		return nil, fmt.Errorf("%w: previewPorts: the docker backend has no preview proxy (capability %s)", sandbox.ErrUnsupported, capability.Preview)
	}
	var err error
	if r.cpuMillis, err = decl.Limits.CPUMillis(); err != nil {
		return nil, fmt.Errorf("%w: limits.cpu: %v", sandbox.ErrInvalid, err)
	}
	if r.memory, err = decl.Limits.MemoryBytes(); err != nil {
		return nil, fmt.Errorf("%w: limits.memory: %v", sandbox.ErrInvalid, err)
	}
	if r.disk, err = decl.Limits.DiskBytes(); err != nil {
		return nil, fmt.Errorf("%w: limits.disk: %v", sandbox.ErrInvalid, err)
	}
	r.procs = decl.Limits.Processes()
	switch {
	case r.cpuMillis < 10:
		return nil, bad("limits.cpu", string(decl.Limits.CPU), "at least 10m")
	case r.memory < minMemoryBytes:
		return nil, bad("limits.memory", string(decl.Limits.Memory), "the docker backend needs at least 6Mi (the engines' floor)")
	case r.disk < spec.MinDiskBytes:
		return nil, bad("limits.disk", string(decl.Limits.Disk), "at least 1Mi")
	case r.procs < minProcesses:
		return nil, bad("limits.maxProcesses", strconv.FormatInt(r.procs, 10), fmt.Sprintf("the docker backend needs at least %d: the agent's own threads count against the container's pids limit", minProcesses))
	}
	life := decl.Session.Lifetime()
	if life < 1 {
		return nil, bad("session.maxLifetimeSeconds", strconv.FormatInt(life, 10), "at least 1")
	}
	r.lifetime = time.Duration(life) * time.Second
	r.workdir = decl.Workdir
	if r.workdir == "" {
		r.workdir = spec.DefaultWorkdir
	}
	if !path.IsAbs(r.workdir) || path.Clean(r.workdir) != r.workdir {
		return nil, bad("workdir", r.workdir, "must be an absolute, clean path")
	}
	if strings.ContainsAny(r.workdir, ":,") {
		return nil, bad("workdir", r.workdir, "may not contain ':' or ',' (it is a bind-mount target)")
	}
	for _, d := range deniedWorkdirs {
		if r.workdir == d || (d != "/" && strings.HasPrefix(r.workdir, d+"/")) {
			return nil, bad("workdir", r.workdir, "is a directory the runtime owns ("+d+")")
		}
	}
	switch decl.Image.Kind() {
	case spec.ImageRef, spec.ImageOCILayout, spec.ImageTarball:
	case spec.ImageHost:
		return nil, fmt.Errorf("%w: image host: a root assembled from the host's /usr needs the local runtime (capability %s)", sandbox.ErrUnsupported, capability.ImageHost)
	case spec.ImageDir:
		return nil, fmt.Errorf("%w: image dir: a directory root filesystem needs the local runtime (capability %s)", sandbox.ErrUnsupported, capability.ImageDir)
	case spec.ImageSnapshot:
		return nil, fmt.Errorf("%w: image snapshot: the docker backend has no snapshots (capability %s)", sandbox.ErrUnsupported, capability.Snapshot)
	default:
		return nil, fmt.Errorf("%w: image: exactly one source must be set", sandbox.ErrInvalid)
	}
	return r, nil
}

// openNetwork is the network an open sandbox joins: Options.OpenNetwork or the engine's
// default, refused when the engine has no such network (a dockerd started with
// --bridge=none has no "bridge") or when it is internal (no route out), rather than giving
// the container less network than open asks for.
func (b *Backend) openNetwork(ctx context.Context) (string, error) {
	name := b.opts.OpenNetwork
	if name == "" {
		name = "bridge"
		if b.eng.kind() == "podman" {
			name = "podman"
		}
	}
	info, err := b.eng.networkInspect(ctx, name)
	if errors.Is(err, sandbox.ErrNotFound) {
		return "", fmt.Errorf("%w: egress mode open: the %s has no network %q for the container to join (a dockerd started with --bridge=none has no default bridge); create one (docker network create NAME) and name it in the docker backend's OpenNetwork: %v", sandbox.ErrUnsupported, b.eng.describe(), name, err)
	}
	if err != nil {
		return "", fmt.Errorf("egress mode open: network %q: %w", name, err)
	}
	if info.Internal {
		return "", fmt.Errorf("%w: egress mode open: network %q of the %s is internal (it routes nowhere); name a network that reaches out in the docker backend's OpenNetwork", sandbox.ErrUnsupported, name, b.eng.describe())
	}
	return name, nil
}

// ensureImage makes the declared image present in the engine and returns it. A reference is
// pulled when absent; an OCI layout or tarball is loaded under a tag naming its config digest,
// so the same image is loaded once.
func (b *Backend) ensureImage(ctx context.Context, img spec.Image) (string, imageInfo, error) {
	var ref string
	switch img.Kind() {
	case spec.ImageRef:
		ref = img.Ref
		info, err := b.eng.imageInspect(ctx, ref)
		if errors.Is(err, sandbox.ErrNotFound) {
			if err := b.eng.imagePull(ctx, ref); err != nil {
				return "", imageInfo{}, err
			}
			info, err = b.eng.imageInspect(ctx, ref)
		}
		return ref, info, err
	default:
		v1img, err := image.Load(ctx, img)
		if err != nil {
			return "", imageInfo{}, err
		}
		digest, err := v1img.ConfigName()
		if err != nil {
			return "", imageInfo{}, fmt.Errorf("%w: image config digest: %v", sandbox.ErrInvalid, err)
		}
		ref = "airlock.local/image:" + digest.Hex
		if info, err := b.eng.imageInspect(ctx, ref); err == nil {
			return ref, info, nil
		} else if !errors.Is(err, sandbox.ErrNotFound) {
			return "", imageInfo{}, err
		}
		tag, err := name.NewTag(ref)
		if err != nil {
			return "", imageInfo{}, err
		}
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(tarball.Write(tag, v1img, pw)) }()
		err = b.eng.imageLoad(ctx, pr)
		pr.CloseWithError(errors.New("load finished"))
		if err != nil {
			return "", imageInfo{}, err
		}
		info, err := b.eng.imageInspect(ctx, ref)
		return ref, info, err
	}
}

// Create starts a container and returns once its agent answers. What this backend's set says
// no to is refused first (plan.CheckSandbox: ErrRefused naming the capability).
func (b *Backend) Create(ctx context.Context, decl spec.Sandbox) (*sandbox.Session, error) {
	if err := plan.CheckSandbox(decl, b.caps); err != nil {
		return nil, err
	}
	r, err := resolve(decl)
	if err != nil {
		return nil, err
	}
	if r.network == "" {
		if r.network, err = b.openNetwork(ctx); err != nil {
			return nil, err
		}
	}
	ref, img, err := b.ensureImage(ctx, decl.Image)
	if err != nil {
		return nil, err
	}
	if len(img.Volumes) > 0 {
		return nil, fmt.Errorf("%w: image %s declares VOLUME %s: the engine would give each an anonymous volume, writable storage outside the disk limit", sandbox.ErrUnsupported, describeImage(decl.Image), strings.Join(img.Volumes, ", "))
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, startTimeout)
		defer cancel()
	}
	// Shared: creates run side by side; a reconcile (exclusive) waits for them.
	release, err := flock(b.opts.StateDir, lockShared)
	if err != nil {
		return nil, err
	}
	defer release()
	id, err := newSessionID()
	if err != nil {
		return nil, err
	}
	s, err := b.start(ctx, id, decl, r, ref, img)
	if err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
		defer cancel()
		if derr := b.Terminate(cctx, id); derr != nil {
			return nil, fmt.Errorf("%w (and cleaning up failed: %v)", err, derr)
		}
		return nil, err
	}
	return s, nil
}

func describeImage(img spec.Image) string {
	switch img.Kind() {
	case spec.ImageRef:
		return img.Ref
	case spec.ImageOCILayout:
		return "ociLayout " + img.OCILayout
	case spec.ImageTarball:
		return "tarball " + img.Tarball
	}
	return string(img.Kind())
}

// agentPolicy is the run policy of a container's agent (the image's environment is imageEnv).
// The agent, the container's PID 1, ends itself when idle.
func agentPolicy(decl spec.Sandbox, r *resolved, imageEnv []string) wire.Policy {
	return wire.NewPolicy(wire.PolicyFor{
		Workdir: r.workdir, User: "sandbox", ImageEnv: imageEnv, Env: decl.Env,
		Lifetime: r.lifetime, IdleTimeout: time.Duration(decl.Session.IdleTimeout()) * time.Second,
		RuntimePaths: runtimePaths,
	})
}

// runSpecFor is the container for one session: every hardening setting is here.
func (b *Backend) runSpecFor(id string, decl spec.Sandbox, r *resolved, ref, sessionDir, workspace, tmp string, labels map[string]string) *runSpec {
	rs := &runSpec{
		Name:       "airlock-" + id,
		Image:      ref,
		Labels:     labels,
		User:       "0:0",
		Entrypoint: []string{agentBinPath},
		Cmd:        append(slices.Clone(b.agentArgs), "serve", "--config", agentConfigPath),
		Hostname:   decl.ID,
		WorkingDir: "/",
		Env:        []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "GOTRACEBACK=single"},
		Binds: []bind{
			{Source: b.agentPath, Target: agentBinPath, ReadOnly: true},
			{Source: filepath.Join(sessionDir, configFile), Target: agentConfigPath, ReadOnly: true},
			{Source: filepath.Join(sessionDir, runDir), Target: agentRunPath},
		},
		Network:         r.network,
		MemoryBytes:     r.memory,
		MemorySwapBytes: r.memory,
		NanoCPUs:        r.cpuMillis * 1_000_000,
		PidsLimit:       r.procs,
		ShmBytes:        shmBytes,
		ReadOnlyRoot:    true,
		CapDrop:         []string{"ALL"},
		CapAdd:          slices.Clone(agentCaps),
		SecurityOpt:     []string{"no-new-privileges"},
		AutoRemove:      true,
	}
	if workspace != "" {
		rs.Binds = append(rs.Binds, bind{Source: workspace, Target: r.workdir}, bind{Source: tmp, Target: "/tmp"})
	} else {
		// No scratch of ours (asUser): the engine mounts a tmpfs at each, held in the
		// container's memory, so bounded by its memory limit; exec as on our own scratch.
		rs.Tmpfs = []tmpfsMount{
			{Target: r.workdir, Options: fmt.Sprintf("exec,size=%d,mode=0755,uid=%d,gid=%d", r.memory, b.codeUID, b.codeGID)},
			{Target: "/tmp", Options: fmt.Sprintf("exec,size=%d,mode=1777", r.memory)},
		}
	}
	if b.freezer {
		rs.Binds = append(rs.Binds, bind{Source: filepath.Join(b.freezerParent(), id), Target: agentFreezer})
	}
	return rs
}

// start makes the session directory and the container and waits until the agent answers. On
// error the caller terminates the session id, removing whatever was made.
func (b *Backend) start(ctx context.Context, id string, decl spec.Sandbox, r *resolved, ref string, img imageInfo) (*sandbox.Session, error) {
	dir := filepath.Join(b.opts.StateDir, id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("session dir: %w", err)
	}
	if err := os.Mkdir(filepath.Join(dir, runDir), 0o700); err != nil {
		return nil, err
	}
	var workspace, tmp string
	if !b.asUser {
		var err error
		if workspace, tmp, err = makeScratch(dir, r.disk); err != nil {
			return nil, err
		}
	}
	if b.freezer {
		if err := makeFreezer(filepath.Join(b.freezerParent(), id)); err != nil {
			return nil, err
		}
	}
	key, err := token.DeriveKey(b.master, id)
	if err != nil {
		return nil, err
	}
	ring, err := token.NewKeyRing(key.Public().(ed25519.PublicKey)).MarshalText()
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	sess := &sandbox.Session{
		ID: id, SandboxID: decl.ID, Platform: string(capability.Docker), State: sandbox.StateRunning,
		Generation: 1, CreatedAt: now, ExpiresAt: now.Add(r.lifetime), Labels: decl.Labels, Spec: decl,
	}
	cfg := agent.Config{
		SandboxID: decl.ID, SessionID: id, Generation: 1, KeyRing: string(ring),
		Listen:    "unix:" + agentRunPath + "/agent.sock",
		FilesRoot: "/", Workdir: r.workdir, Policy: agentPolicy(decl, r, img.Env),
		CodeUID: b.codeUID, CodeGID: b.codeGID,
		// The agent is PID 1: at its deadline or idle timeout it returns, and the kernel
		// kills everything else in the container (setsid escapees included).
		Deadline: sess.ExpiresAt,
		// The agent's threads share the container's pids limit with the code: threads made
		// now let it serve (wait, read, write) while code has forked up to the limit.
		SpareThreads: agentSpareThreads,
	}
	if b.asUser {
		// The agent (the container's root, the host's with a rootful engine) makes the
		// socket; this user must be able to connect to it.
		cfg.SocketUID = os.Geteuid()
	}
	if b.freezer {
		cfg.CgroupV1Freezer, cfg.CgroupV1Memory = agentFreezer, containerMemoryV1
	}
	cj, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, configFile), cj, 0o600); err != nil {
		return nil, err
	}
	specJSON, err := json.Marshal(decl)
	if err != nil {
		return nil, err
	}
	labels := map[string]string{
		labelSession:    id,
		labelSandbox:    decl.ID,
		labelState:      b.tag,
		labelCreated:    sess.CreatedAt.Format(time.RFC3339Nano),
		labelExpires:    sess.ExpiresAt.Format(time.RFC3339Nano),
		labelGeneration: "1",
		labelSpec:       string(specJSON),
	}
	rs := b.runSpecFor(id, decl, r, ref, dir, workspace, tmp, labels)
	cid, err := b.eng.create(ctx, rs)
	if err != nil {
		return nil, err
	}
	output, release, err := b.eng.start(ctx, cid)
	if err != nil {
		return nil, err
	}
	defer release()
	if err := b.waitAgent(ctx, id, decl.ID); err != nil {
		return nil, fmt.Errorf("%w%s", err, logTail(output()))
	}
	b.log.Debug("sandbox created", "session", id, "sandbox", decl.ID, "container", cid, "engine", b.eng.kind())
	return sess, nil
}

func logTail(s string) string {
	s = strings.TrimSpace(s)
	if s == "" {
		return ""
	}
	return "\ncontainer output:\n" + s
}

// waitAgent polls the agent until it answers for this sandbox, the container is gone, or ctx ends.
func (b *Backend) waitAgent(ctx context.Context, id, sandboxID string) error {
	c := b.client(id, sandboxID)
	defer c.Close()
	sock := filepath.Join(b.opts.StateDir, id, runDir, "agent.sock")
	var last error
	for wait := backoff.New(time.Millisecond, 100*time.Millisecond); ; {
		if _, err := os.Stat(sock); err == nil {
			hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			h, err := c.Health(hctx)
			cancel()
			if err == nil {
				if h.SandboxID != sandboxID {
					return fmt.Errorf("%w: agent of %s answered for sandbox %q", sandbox.ErrUnreachable, id, h.SandboxID)
				}
				return nil
			}
			last = err
		}
		if cs, err := b.eng.list(ctx, map[string]string{labelSession: id, labelState: b.tag}); err == nil {
			if len(cs) == 0 || isEnded(cs[0].Status) {
				return fmt.Errorf("%w: the container of %s exited before its agent answered", sandbox.ErrUnreachable, id)
			}
		}
		if !wait.Wait(ctx) {
			return fmt.Errorf("%w: agent of %s did not answer: %v (last error: %v)", sandbox.ErrDeadlineExceeded, id, ctx.Err(), last)
		}
	}
}

// isEnded reports whether a container in this state will never run the agent again.
func isEnded(status string) bool {
	switch status {
	case "exited", "dead", "removing", "stopped":
		return true
	}
	return false
}

// sessionFrom rebuilds a session from its container's labels.
func (b *Backend) sessionFrom(c containerInfo) (*sandbox.Session, error) {
	l := c.Labels
	s := &sandbox.Session{ID: l[labelSession], SandboxID: l[labelSandbox], Platform: string(capability.Docker)}
	switch c.Status {
	case "running":
		s.State = sandbox.StateRunning
	case "paused":
		s.State = sandbox.StatePaused
	default:
		s.State = sandbox.StateTerminated
	}
	var err error
	if s.Generation, err = strconv.ParseUint(l[labelGeneration], 10, 64); err != nil {
		return nil, fmt.Errorf("container %s: label %s: %v", c.ID, labelGeneration, err)
	}
	if s.CreatedAt, err = time.Parse(time.RFC3339Nano, l[labelCreated]); err != nil {
		return nil, fmt.Errorf("container %s: label %s: %v", c.ID, labelCreated, err)
	}
	if s.ExpiresAt, err = time.Parse(time.RFC3339Nano, l[labelExpires]); err != nil {
		return nil, fmt.Errorf("container %s: label %s: %v", c.ID, labelExpires, err)
	}
	if err := json.Unmarshal([]byte(l[labelSpec]), &s.Spec); err != nil {
		return nil, fmt.Errorf("container %s: label %s: %v", c.ID, labelSpec, err)
	}
	s.Labels = s.Spec.Labels
	return s, nil
}

// lookup returns a live session's container.
func (b *Backend) lookup(ctx context.Context, id string) (*sandbox.Session, error) {
	if err := checkSessionID(id); err != nil {
		return nil, err
	}
	cs, err := b.eng.list(ctx, map[string]string{labelSession: id, labelState: b.tag})
	if err != nil {
		return nil, err
	}
	for _, c := range cs {
		if isEnded(c.Status) {
			continue
		}
		return b.sessionFrom(c)
	}
	return nil, fmt.Errorf("%w: session %s", sandbox.ErrNotFound, id)
}

// Get returns a live session.
func (b *Backend) Get(ctx context.Context, sessionID string) (*sandbox.Session, error) {
	return b.lookup(ctx, sessionID)
}

// List returns every live session of this state dir, oldest first.
func (b *Backend) List(ctx context.Context) ([]*sandbox.Session, error) {
	cs, err := b.eng.list(ctx, map[string]string{labelState: b.tag})
	if err != nil {
		return nil, err
	}
	var out []*sandbox.Session
	for _, c := range cs {
		if isEnded(c.Status) || checkSessionID(c.Labels[labelSession]) != nil {
			continue
		}
		s, err := b.sessionFrom(c)
		if err != nil {
			b.log.Warn("skipping a container with unreadable labels", "container", c.ID, "err", err)
			continue
		}
		out = append(out, s)
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
	return b.client(s.ID, s.SandboxID), nil
}

func (b *Backend) client(id, sandboxID string) *client.Client {
	key, err := token.DeriveKey(b.master, id)
	return client.New("unix:"+filepath.Join(b.opts.StateDir, id, runDir, "agent.sock"), func() string {
		if err != nil {
			return "" // the agent refuses an empty token; DeriveKey fails only on a bad master
		}
		now := time.Now()
		tok, err := token.Mint(key, token.Claims{
			Sandbox: sandboxID, Session: id, Generation: 1, Class: token.Execute,
			IssuedAt: now.Unix(), Expiry: now.Add(tokenLifetime).Unix(),
		})
		if err != nil {
			return ""
		}
		return tok
	})
}

// Terminate removes the container and the session's directory, succeeding only once both are
// confirmed gone; an absent session is not an error.
func (b *Backend) Terminate(ctx context.Context, sessionID string) error {
	if err := checkSessionID(sessionID); err != nil {
		return err
	}
	sel := map[string]string{labelSession: sessionID, labelState: b.tag}
	cs, err := b.eng.list(ctx, sel)
	if err != nil {
		return fmt.Errorf("%w: terminate %s: %v", sandbox.ErrOutcomeUnknown, sessionID, err)
	}
	for _, c := range cs {
		if err := b.eng.remove(ctx, c.ID); err != nil {
			return fmt.Errorf("%w: terminate %s: %v", sandbox.ErrOutcomeUnknown, sessionID, err)
		}
	}
	for wait := backoff.New(time.Millisecond, 100*time.Millisecond); ; {
		cs, err := b.eng.list(ctx, sel)
		if err != nil {
			return fmt.Errorf("%w: terminate %s: confirm removal: %v", sandbox.ErrOutcomeUnknown, sessionID, err)
		}
		if len(cs) == 0 {
			break
		}
		if !wait.Wait(ctx) {
			return fmt.Errorf("%w: terminate %s: container %s still exists (%s): %v", sandbox.ErrOutcomeUnknown, sessionID, cs[0].ID, cs[0].Status, ctx.Err())
		}
	}
	if err := removeCgroupTree(ctx, filepath.Join(b.freezerParent(), sessionID)); err != nil {
		return fmt.Errorf("%w: terminate %s: %v", sandbox.ErrOutcomeUnknown, sessionID, err)
	}
	if err := removeSessionDir(filepath.Join(b.opts.StateDir, sessionID)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("%w: terminate %s: %v", sandbox.ErrOutcomeUnknown, sessionID, err)
	}
	return nil
}
