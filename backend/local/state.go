package local

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/backend/local/sessions"
	"github.com/airlock-sandbox/airlock/internal/kernfile"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/spec"
)

// record is session.json: what a later process needs to find, reach and reap a sandbox. The
// fields but the declaration are sessions.RecordCore's (embedded: its JSON fields are this
// record's), which a claimer reads without the spec package.
type record struct {
	sessions.RecordCore
	Spec spec.Sandbox `json:"spec"`
}

const (
	recordFile = sessions.RecordFile
	masterFile = statedir.MasterFile
	lockFile   = statedir.LockFile
	initLog    = "init.log"
	// rootMountDir is the state dir's subdirectory native sandboxes mount their root on.
	rootMountDir = "mnt"
)

// The state dir's shared parts (ids, master secret, lock) are statedir's, as in backend/docker.
var (
	newSessionID   = statedir.NewSessionID
	checkSessionID = statedir.CheckSessionID
	loadMaster     = statedir.LoadMaster
	readMaster     = statedir.ReadMaster
	flock          = statedir.Lock
)

func writeRecord(dir string, r *record) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, recordFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, recordFile))
}

func readRecord(dir string) (*record, error) {
	var r record
	if err := sessions.DecodeRecord(dir, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// Process identity is parked sandboxes' (a claimer checks a parked sandbox's init without this package).
type procStat = sessions.ProcStat

var (
	readStat  = sessions.ReadStat
	startTime = sessions.StartTime
	running   = sessions.Running
	alive     = sessions.Alive
)

// mountPoints returns the mount points listed in mountinfo text (field 5, octal escapes
// decoded), in file order.
func mountPoints(r io.Reader) ([]string, error) {
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			continue
		}
		out = append(out, kernfile.UnescapeMount(f[4]))
	}
	return out, sc.Err()
}

// mountInfo is the mount table unmountUnder reads (a variable for a test): the calling
// thread's. A process's threads may be in different mount namespaces (one that unshared its
// own, as the benchmark's crun starter does), and /proc/self is the main thread's: its table
// may list mounts the caller's namespace lacks and miss those it has.
var mountInfo = "/proc/thread-self/mountinfo"

// unmountUnder detaches every host mount at or below dir, deepest first, in the calling
// goroutine's mount namespace (read and unmounted on one locked thread).
func unmountUnder(dir string) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	f, err := os.Open(mountInfo)
	if err != nil {
		return err
	}
	points, err := mountPoints(f)
	f.Close()
	if err != nil {
		return err
	}
	for i := len(points) - 1; i >= 0; i-- {
		p := points[i]
		if p != dir && !strings.HasPrefix(p, dir+"/") {
			continue
		}
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("unmount %s: %w", p, err)
		}
	}
	return nil
}

// tmpfsMarker, in the directory beneath a state dir's own tmpfs, says the runtime made that
// directory for its state: a later start (after a reboot emptied the tmpfs) mounts one again.
const tmpfsMarker = ".airlock-tmpfs"

// ownTmpfs mounts a tmpfs of the runtime's own on a state dir it made itself (made, or marked
// by an earlier start) when the dir's filesystem is not in memory already. Every create and
// terminate makes and frees about seven inodes there (session dir, run/, init.log, record,
// uid claim, resolv.conf, agent.sock); on a disk filesystem that is inode allocation and
// freeing per call (on ext4 without a journal a search past every inode freed in the last
// minute: milliseconds of CPU per create at tens a second; docs/benchmarks.md). A directory
// someone else made, or one holding anything, stays as it is: a tmpfs on it would hide what
// is there. The mount is in the caller's mount namespace, like the sandboxes' roots.
func ownTmpfs(dir string, made bool) error {
	// Two starts on one fresh dir: the lock on the directory beneath makes the second see the
	// first's tmpfs (a second tmpfs on top would hide the first's sandboxes).
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := unix.Flock(int(d.Fd()), unix.LOCK_EX); err != nil {
		return err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return err
	}
	if st.Type == unix.TMPFS_MAGIC || st.Type == unix.RAMFS_MAGIC {
		return nil
	}
	if made {
		f, err := os.OpenFile(filepath.Join(dir, tmpfsMarker), os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		f.Close()
	} else {
		entries, err := d.ReadDir(2)
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if len(entries) != 1 || entries[0].Name() != tmpfsMarker {
			return nil
		}
	}
	if err := unix.Mount("airlock-state", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0711"); err != nil {
		return fmt.Errorf("mount a tmpfs on %s: %w", dir, err)
	}
	return nil
}

// RemoveStateDir removes a state dir for good: every mount at or below it (its own tmpfs, a
// sandbox's leftovers) is detached first, then the tree goes. The sandboxes must be gone.
func RemoveStateDir(dir string) error {
	dir = filepath.Clean(dir)
	var err error
	// A mount that appears meanwhile (a start on the dir, finding only the marker, mounts its
	// tmpfs again) fails the removal with EBUSY: detached and tried again, a few times.
	for range 3 {
		if err = unmountUnder(dir); err != nil {
			return err
		}
		if err = os.RemoveAll(dir); !errors.Is(err, unix.EBUSY) {
			return err
		}
	}
	return err
}
