package local

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Rootless mode: the local runtime run by a user other than root, where the host allows it.
// What root gives the runtime, the host must give that user instead:
//   - ids: sandbox id 0 is the user itself (it owns the state dir, the delegated cgroups and
//     the session's run dir, which the sandbox's root must reach), ids 1..65535 are the
//     user's subordinate ids from /etc/subuid and /etc/subgid, mapped by the setuid helpers
//     newuidmap and newgidmap (shadow's uidmap package). The code runs as id 1000, a
//     subordinate id: not the user, so it cannot touch the user's files or processes.
//   - cgroups: a parent cgroup per v1 hierarchy that root created and gave to the user
//     (Options.CgroupParent; the refusal prints the commands). Without one no limit could be
//     enforced, and every declaration has limits.
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

// subIDsNeeded is how many subordinate ids a rootless sandbox maps: its ids 1..65535.
const subIDsNeeded = idRange - 1

// rootless is what a rootless backend maps and with what.
type rootless struct {
	uid, gid             int
	subUID, subGID       int // the first subordinate id of each
	newuidmap, newgidmap string
}

// probeRootless checks that this user may run sandboxes: the id helpers, its subordinate
// ids, and cgroups delegated under parent. The error says what the host lacks and how root
// provides it.
func probeRootless(parent string, cgroupVersion int) (*rootless, error) {
	rl := &rootless{uid: os.Geteuid(), gid: os.Getegid()}
	if cgroupVersion != 1 {
		return nil, fmt.Errorf("rootless mode needs cgroup v1 hierarchies delegated to uid %d; this host is cgroup v%d, where rootless mode (a systemd-delegated cgroup v2 subtree) is not built yet: run as root", rl.uid, cgroupVersion)
	}
	var err error
	if rl.newuidmap, err = exec.LookPath("newuidmap"); err != nil {
		return nil, fmt.Errorf("rootless mode needs newuidmap and newgidmap (the uidmap package): %w", err)
	}
	if rl.newgidmap, err = exec.LookPath("newgidmap"); err != nil {
		return nil, fmt.Errorf("rootless mode needs newuidmap and newgidmap (the uidmap package): %w", err)
	}
	name := strconv.Itoa(rl.uid)
	if u, err := user.LookupId(name); err == nil {
		name = u.Username
	}
	if rl.subUID, err = subIDStart("/etc/subuid", name, rl.uid); err != nil {
		return nil, err
	}
	if rl.subGID, err = subIDStart("/etc/subgid", name, rl.gid); err != nil {
		return nil, err
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
			rl.uid, parent, strings.Join(missing, ", "), strings.Join(delegate, " "), rl.uid, rl.gid)
	}
	return rl, nil
}

// DefaultStateDirForUser is DefaultStateDir for root and $XDG_RUNTIME_DIR/airlock for any
// other user ("" when that is unset).
func DefaultStateDirForUser() string {
	if os.Geteuid() == 0 {
		return DefaultStateDir
	}
	if run := os.Getenv("XDG_RUNTIME_DIR"); run != "" {
		return filepath.Join(run, "airlock")
	}
	return ""
}

// RootlessCgroupParent is the cgroup, in every v1 hierarchy, that root delegates to uid for
// its rootless sandboxes: a rootless backend's default parent is a child of it per state dir.
func RootlessCgroupParent(uid int) string { return "airlock-user-" + strconv.Itoa(uid) }

// subIDStart finds the first range of at least subIDsNeeded ids for name (or its id) in an
// /etc/subuid-format file.
func subIDStart(file, name string, id int) (int, error) {
	f, err := os.Open(file)
	if err != nil {
		return 0, fmt.Errorf("rootless mode needs %d subordinate ids for %s in %s: %w", subIDsNeeded, name, file, err)
	}
	defer f.Close()
	start, err := ownSubIDs(f, name, id)
	if err != nil {
		return 0, fmt.Errorf("rootless mode needs %d subordinate ids for %s in %s (as root: usermod --add-subuids/--add-subgids): %w", subIDsNeeded, name, file, err)
	}
	return start, nil
}

// ownSubIDs returns the start of the first of name's (by name or by id) ranges in an
// /etc/subuid-format file with at least subIDsNeeded ids.
func ownSubIDs(r io.Reader, name string, id int) (int, error) {
	spans, err := parseSubIDs(r) // subids.go
	if err != nil {
		return 0, err
	}
	for _, sp := range spans {
		if (sp.owner == name || sp.owner == strconv.Itoa(id)) && sp.first > 0 && sp.count >= subIDsNeeded && sp.first+sp.count <= 1<<32-1 {
			return int(sp.first), nil
		}
	}
	return 0, errors.New("no such range")
}

// mapIDs writes a rootless init's uid and gid maps: 0 is the user, 1.. its subordinate ids.
func (rl *rootless) mapIDs(pid int) error {
	for _, m := range []struct {
		helper   string
		own, sub int
	}{{rl.newuidmap, rl.uid, rl.subUID}, {rl.newgidmap, rl.gid, rl.subGID}} {
		args := []string{strconv.Itoa(pid), "0", strconv.Itoa(m.own), "1", "1", strconv.Itoa(m.sub), strconv.Itoa(subIDsNeeded)}
		if out, err := exec.Command(m.helper, args...).CombinedOutput(); err != nil {
			return fmt.Errorf("%s %s: %v: %s", m.helper, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// startRootless starts init (in its namespaces, without maps), puts it in its cgroups — from
// outside: a thread of ours that entered a cgroup of the user's could not go back to the
// cgroup it came from, which is root's — and writes its maps. Init waits for the config
// meanwhile.
func (b *Backend) startRootless(s *session, cg sandboxCgroup, cmd *exec.Cmd) error {
	if err := cmd.Start(); err != nil {
		return err
	}
	b.watchStarted(s, cmd)
	if err := cg.addProc(cmd.Process.Pid); err != nil {
		return err
	}
	return b.rootless.mapIDs(cmd.Process.Pid)
}
