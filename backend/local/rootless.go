package local

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/cgroups/v3"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/backend/local/idrange"
	"github.com/airlock-sandbox/airlock/backend/local/nsinit"
	"github.com/airlock-sandbox/airlock/internal/kernfile"
	"github.com/airlock-sandbox/airlock/internal/statedir"
)

// Rootless mode: the local runtime run by a user other than root, where the host allows it.
// What root gives the runtime, the host must give that user instead:
//   - ids: sandbox id 0 is the user itself, ids 1..65535 its subordinate ids
//     (idrange.Subordinate).
//   - cgroups: on v1 a parent cgroup per hierarchy that root created and gave to the user
//     (Options.CgroupParent); on v2 a delegated subtree this process runs in (below). The
//     refusal prints the commands. Without them no limit could be enforced, and every
//     declaration has limits. The limits hold the code (a subordinate id), not the sandbox's
//     root: that is the user, who owns the cgroup files anyway.
//
// What stays root's: egress other than deny (a veth and nftables in the host's namespace:
// the capability set says so), gVisor, per-sandbox id ranges (every sandbox of the user maps
// the same subordinate ids; pid namespaces still keep them from seeing each other), and the
// locked, idmapped image clone (idmap.go needs root in the initial user namespace): images
// are unpacked as the user's own files, which the sandbox sees as its root's, read-only by a
// bind the sandbox's root could undo — on files the user owns anyway.
//
// Init starts without maps (exec.Cmd writes maps itself only with root's powers), so it
// execs without capabilities; the host runs newuidmap/newgidmap on it, and init, told by the
// config (nsinit.Config.Reexec), execs itself again, now its namespace's root.

// probeRootless checks that this user may run sandboxes: the id helpers, its subordinate
// ids, and cgroups delegated for parent (v1: in every hierarchy; v2: a subtree this process
// runs in, rootless_v2 below). The error says what the host lacks and how root provides it.
func probeRootless(cg cgroupDriver, parent string) (*idrange.Subordinate, error) {
	rl, err := idrange.ProbeSubordinate()
	if err != nil {
		return nil, err
	}
	if d, ok := cg.(*v2Driver); ok {
		own, err := ownCgroupV2()
		if err != nil {
			return nil, err
		}
		if err := probeDelegationV2(cgroupRoot, own, parent, rl.UID, rl.GID); err != nil {
			return nil, err
		}
		d.rootless = true
		return rl, nil
	}
	// The parent's nearest existing ancestor in every hierarchy must be the user's to write:
	// the runtime makes the rest of the path and the sandboxes' cgroups below it.
	var missing, delegate []string
	top := strings.SplitN(parent, "/", 2)[0]
	for _, ctrl := range v1Controllers {
		p := parent
		for p != "." && p != "/" {
			if _, err := os.Stat(filepath.Join(cgroupRoot, ctrl, p)); err == nil {
				break
			}
			p = path.Dir(p)
		}
		if err := unix.Access(filepath.Join(cgroupRoot, ctrl, p), unix.W_OK|unix.X_OK); err != nil {
			missing = append(missing, filepath.Join(cgroupRoot, ctrl, p))
			delegate = append(delegate, filepath.Join(cgroupRoot, ctrl, top))
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("rootless mode needs cgroups delegated to uid %d in every v1 hierarchy (for the cgroup parent %q); not writable: %s; as root: for d in %s; do mkdir -p $d && chown %d:%d $d; done",
			rl.UID, parent, strings.Join(missing, ", "), strings.Join(delegate, " "), rl.UID, rl.GID)
	}
	return rl, nil
}

// DefaultStateDirForUser is DefaultStateDir for root and $XDG_RUNTIME_DIR/airlock for any
// other user ("" when that is unset).
func DefaultStateDirForUser() string { return statedir.DefaultDirForUser() }

// RootlessCgroupParent is the cgroup, in every v1 hierarchy, that root delegates to uid for
// its rootless sandboxes: a rootless backend's default parent is a child of it per state dir.
func RootlessCgroupParent(uid int) string { return "airlock-user-" + strconv.Itoa(uid) }

// startRootless starts init (in its namespaces, without maps), puts it in its cgroups and
// writes its maps. Init waits for the config meanwhile. On v1 its cgroups are joined from
// outside: a thread of ours that entered a cgroup of the user's could not go back to the
// cgroup it came from, which is root's. On v2 init is born in its cgroup (clone3), as with
// root: this process runs inside the delegated subtree (probeDelegationV2). Only the agent's
// cgroup fd differs there: cloning a mount (open_tree, v2Cgroup.execParent) takes
// CAP_SYS_ADMIN over the mount namespace, which this process lacks and init has over its own,
// so init makes it (nsinit.Config.CgroupCodeDir) and the fd it replaces is /dev/null until
// then: an fd that leads nowhere, should it ever stay.
func (b *Backend) startRootless(s *session, cg sandboxCgroup, cmd *exec.Cmd, cfg *nsinit.Config) error {
	if b.cg.version() == 2 {
		null, err := os.Open(os.DevNull)
		if err != nil {
			return err
		}
		defer null.Close()
		cmd.ExtraFiles = append(cmd.ExtraFiles, null) // nsinit.FDCgroup
		if len(cmd.ExtraFiles) != nsinit.FDCgroup-2 {
			return fmt.Errorf("rootless init's cgroup fd would be %d, not %d", len(cmd.ExtraFiles)+2, nsinit.FDCgroup)
		}
		cfg.CgroupCodeDir = filepath.Join(cg.dirs()[0], nsinit.CodePidsName)
		err = cg.start(cmd)
		if cmd.Process != nil {
			b.watchStarted(s, cmd)
		}
		if err != nil {
			return err
		}
		return b.rootless.MapIDs(cmd.Process.Pid)
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	b.watchStarted(s, cmd)
	if err := cg.addProc(cmd.Process.Pid); err != nil {
		return err
	}
	return b.rootless.MapIDs(cmd.Process.Pid)
}

// Rootless on cgroup v2: the user is given a subtree (its directory and its cgroup.procs,
// cgroup.subtree_control and cgroup.threads: what systemd's Delegate=yes gives
// user@<uid>.service, or root by hand). The kernel lets an unprivileged process create a
// process in a cgroup (clone3's CLONE_INTO_CGROUP) only when it may write cgroup.procs of the
// common ancestor of its own cgroup and the target, so this process must run inside the
// subtree too, in a leaf (a cgroup whose children have controllers holds no process), and the
// sandboxes go beside it: <delegation>/airlock-<hash of the state dir> by default. Init is
// born in its cgroup, as with root: no process is ever moved.

// v2Needed are the controllers a sandbox's limits need on cgroup v2 (cpu.max, memory.max and
// memory.swap.max, pids.max).
var v2Needed = []string{"cpu", "memory", "pids"}

// ownCgroupV2 is this process's cgroup ("/a/b") in the unified hierarchy.
func ownCgroupV2() (string, error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	defer f.Close()
	ms, err := kernfile.ParseProcCgroup(f)
	if err != nil {
		return "", err
	}
	p, ok := kernfile.UnifiedPath(ms)
	if !ok {
		return "", errors.New("rootless mode on cgroup v2: /proc/self/cgroup names no cgroup v2 (no 0:: line)")
	}
	// A cgroup namespace shows cgroups outside its root as "/..": not under cgroupRoot.
	if !strings.HasPrefix(p, "/") || strings.Contains(p, "/..") {
		return "", fmt.Errorf("rootless mode on cgroup v2: this process's cgroup %q is outside its cgroup namespace's root, so not under %s", p, cgroupRoot)
	}
	return path.Clean(p), nil
}

// delegationV2 is the highest of own and its ancestors (cgroup paths under root) whose
// cgroup.procs this user may write: the root of the subtree delegated to it. "" when none.
func delegationV2(root, own string) string {
	d := ""
	for c := own; ; c = path.Dir(c) {
		if c != "/" && unix.Access(filepath.Join(root, c, "cgroup.procs"), unix.W_OK) == nil {
			d = c
		}
		if c == "/" {
			return d
		}
	}
}

// RootlessCgroupTree is, on a cgroup v2 host, the directory of the cgroup subtree delegated
// to this user that this process runs in: a rootless runtime's sandboxes live in airlock-*
// children of it (one per state dir), which is all `airlock gc` run by the user may look at.
// ok is false on v1 (there it is RootlessCgroupParent in every hierarchy) or without one.
func RootlessCgroupTree() (dir string, ok bool) {
	if cgroups.Mode() != cgroups.Unified {
		return "", false
	}
	own, err := ownCgroupV2()
	if err != nil {
		return "", false
	}
	if d := delegationV2(cgroupRoot, own); d != "" {
		return filepath.Join(cgroupRoot, d), true
	}
	return "", false
}

// rootlessCgroupParentFor is a rootless runtime's default cgroup parent for stateDir, one per
// state dir below what is delegated to the user: v1 airlock-user-<uid>/<hash>, v2
// <delegation>/airlock-<hash>. Without a v2 delegation it is v1's, which probeRootless then
// refuses, saying what is missing.
func rootlessCgroupParentFor(stateDir string) string {
	if d, ok := RootlessCgroupTree(); ok {
		if rel, err := filepath.Rel(cgroupRoot, d); err == nil {
			return path.Join(rel, "airlock-"+shortHash(stateDir))
		}
	}
	return path.Join(RootlessCgroupParent(os.Geteuid()), shortHash(stateDir))
}

// probeDelegationV2 checks that sandboxes can live under parent (relative to root) for a
// process of uid in cgroup own, and enables the controllers their limits need from the
// delegation's root down to parent (making parent if missing). The error says what is missing
// and the command that provides it.
func probeDelegationV2(root, own, parent string, uid, gid int) error {
	d := delegationV2(root, own)
	if d == "" {
		return fmt.Errorf("rootless mode on cgroup v2 needs a cgroup subtree delegated to uid %d that this process runs in: neither its cgroup %s nor any above it has a cgroup.procs uid %d may write. "+
			"With systemd, start it in a unit of the user's own manager (user@%d.service is delegated), e.g. systemd-run --user --scope -p Delegate=yes airlock ...; by hand, as root: %s",
			uid, own, uid, uid, manualDelegationV2(root, uid, gid))
	}
	if d == own {
		leaf := filepath.Join(root, d, "airlock-session")
		return fmt.Errorf("rootless mode on cgroup v2: this process is in %s, the root of the cgroup subtree delegated to uid %d, where no controller can be enabled for the sandboxes (a cgroup whose children have controllers holds no process): move it to a leaf below first, as uid %d: mkdir %s && echo $$ > %s/cgroup.procs",
			d, uid, uid, leaf, leaf)
	}
	p := path.Clean("/" + parent)
	if !strings.HasPrefix(p, d+"/") {
		return fmt.Errorf("rootless mode on cgroup v2: cgroupParent %q is not inside %s, the cgroup subtree delegated to uid %d that this process (in %s) runs in: name a cgroup below it, or leave cgroupParent empty for %s/airlock-<hash of the state dir>",
			parent, d, uid, own, strings.TrimPrefix(d, "/"))
	}
	if p == own || strings.HasPrefix(p, own+"/") {
		return fmt.Errorf("rootless mode on cgroup v2: cgroupParent %q is this process's own cgroup %s or below it, which holds a process and so can have no controllers for children: name a cgroup beside it in %s",
			parent, own, d)
	}
	lca := own
	for lca != p && !strings.HasPrefix(p, lca+"/") {
		lca = path.Dir(lca)
	}
	if err := unix.Access(filepath.Join(root, lca, "cgroup.procs"), unix.W_OK); err != nil {
		return fmt.Errorf("rootless mode on cgroup v2: %s/cgroup.procs, of the common ancestor of this process's cgroup %s and cgroupParent %q, is not writable by uid %d (%v): the kernel lets it create a process in another cgroup only then; as root: chown %d:%d %s",
			filepath.Join(root, lca), own, parent, uid, err, uid, gid, filepath.Join(root, lca, "cgroup.procs"))
	}
	have, err := os.ReadFile(filepath.Join(root, d, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("rootless mode on cgroup v2: %w", err)
	}
	if missing := missingControllers(string(have)); len(missing) > 0 {
		var files []string
		for c := path.Dir(d); ; c = path.Dir(c) {
			files = append([]string{filepath.Join(root, c, "cgroup.subtree_control")}, files...)
			if c == "/" {
				break
			}
		}
		return fmt.Errorf("rootless mode on cgroup v2 needs the controllers %s delegated to %s (the sandboxes' cpu, memory and process limits); its cgroup.controllers is %q, not delegated: %s. "+
			"With systemd, as root: mkdir -p /etc/systemd/system/user@.service.d && printf '[Service]\\nDelegate=cpu cpuset io memory pids\\n' > /etc/systemd/system/user@.service.d/delegate.conf && systemctl daemon-reload, then log in again; by hand, as root: for f in %s; do echo '%s' > $f; done",
			strings.Join(v2Needed, ", "), filepath.Join(root, d), strings.TrimSpace(string(have)), strings.Join(missing, ", "), strings.Join(files, " "), plusControllers(missing))
	}
	// Enabled from the delegation's root down to parent, so that this process's probe (the
	// capability set) and every sandbox below parent see them; made once, written only when
	// missing.
	for c := d; ; {
		dir := filepath.Join(root, c)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("rootless mode on cgroup v2: make the cgroup parent: %w", err)
		}
		sc, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
		if err != nil {
			return fmt.Errorf("rootless mode on cgroup v2: %w", err)
		}
		if add := missingControllers(string(sc)); len(add) > 0 {
			err := kernfile.Write(filepath.Join(dir, "cgroup.subtree_control"), plusControllers(add))
			switch {
			case errors.Is(err, unix.EBUSY):
				procs, _ := readPidFile(filepath.Join(dir, "cgroup.procs"))
				return fmt.Errorf("rootless mode on cgroup v2: cannot enable %s for the cgroups below %s: it holds processes %v (a cgroup whose children have controllers holds none): move them to a leaf below it",
					strings.Join(add, ", "), dir, procs)
			case err != nil:
				return fmt.Errorf("rootless mode on cgroup v2: enable %s in %s/cgroup.subtree_control: %w (a delegation gives uid %d that file with cgroup.procs and cgroup.threads; as root: chown %d:%d %s/cgroup.subtree_control)",
					strings.Join(add, ", "), dir, err, uid, uid, gid, dir)
			}
		}
		if c == p {
			return nil
		}
		next, _, _ := strings.Cut(strings.TrimPrefix(p, c+"/"), "/")
		c = c + "/" + next
	}
}

// missingControllers are the v2Needed controllers not in a cgroup.controllers or
// cgroup.subtree_control list.
func missingControllers(list string) []string {
	have := strings.Fields(list)
	var out []string
	for _, c := range v2Needed {
		if !slices.Contains(have, c) {
			out = append(out, c)
		}
	}
	return out
}

func plusControllers(cs []string) string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = "+" + c
	}
	return strings.Join(out, " ")
}

// manualDelegationV2 is the shell, run as root, that gives uid a v2 subtree without systemd
// (docs/rootless.md): the controllers enabled at the root, the subtree's directory and its
// three delegation files chowned, a leaf for the user's shell, the shell moved into it.
func manualDelegationV2(root string, uid, gid int) string {
	d := filepath.Join(root, RootlessCgroupParent(uid))
	return fmt.Sprintf("echo '%s' > %s/cgroup.subtree_control; mkdir -p %s/session && chown %d:%d %s %s/cgroup.procs %s/cgroup.subtree_control %s/cgroup.threads && chown -R %d:%d %s/session && echo <pid of the user's shell> > %s/session/cgroup.procs",
		plusControllers(v2Needed), root, d, uid, gid, d, d, d, d, uid, gid, d, d)
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
