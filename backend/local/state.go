package local

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/backend/local/spares"
	"github.com/airlock-sandbox/airlock/internal/kernfile"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/spec"
)

// record is session.json: what a later process needs to find, reach and reap a sandbox. The
// fields but the declaration are spares.RecordCore's (embedded: its JSON fields are this
// record's), which a claimer reads without the spec package.
type record struct {
	spares.RecordCore
	Spec spec.Sandbox `json:"spec"`
}

const (
	recordFile = spares.RecordFile
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
	if err := spares.DecodeRecord(dir, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// Process identity is spares' (a claimer checks a spare's init without this package).
type procStat = spares.ProcStat

var (
	readStat  = spares.ReadStat
	startTime = spares.StartTime
	running   = spares.Running
	alive     = spares.Alive
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

// unmountUnder detaches every host mount at or below dir, deepest first.
func unmountUnder(dir string) error {
	f, err := os.Open("/proc/self/mountinfo")
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
