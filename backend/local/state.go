package local

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/spec"
)

// record is session.json: what a later process needs to find, reach and reap a sandbox.
type record struct {
	ID        string `json:"id"`
	SandboxID string `json:"sandboxId"`
	// InitPID is the sandbox's PID 1 as the host sees it; InitStart its start time (clock
	// ticks since boot, /proc/<pid>/stat field 22), so a reused pid is never mistaken for it.
	InitPID       int          `json:"initPid"`
	InitStart     uint64       `json:"initStart"`
	Cgroup        string       `json:"cgroup"`
	CgroupVersion int          `json:"cgroupVersion"`
	Generation    uint64       `json:"generation"`
	CreatedAt     time.Time    `json:"createdAt"`
	ExpiresAt     time.Time    `json:"expiresAt"`
	Spec          spec.Sandbox `json:"spec"`
	LandlockABI   int          `json:"landlockAbi"`
	// EtcDir names the /etc copy a host-image sandbox has bound (etc.go), kept while it lives.
	EtcDir string `json:"etcDir,omitempty"`
	// Runtime is "gvisor" for a runsc sandbox, empty for the native runtime.
	Runtime string `json:"runtime,omitempty"`
	// IDRange is the host id range a native sandbox maps (uidrange.go) and IDBase the host
	// id its id 0 maps to; IDBase 0: none (gVisor, or a record from before per-sandbox ranges,
	// which mapped Options.UIDBase).
	IDRange int `json:"idRange,omitempty"`
	IDBase  int `json:"idBase,omitempty"`
}

const (
	recordFile = "session.json"
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
	b, err := os.ReadFile(filepath.Join(dir, recordFile))
	if err != nil {
		return nil, err
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, recordFile), err)
	}
	return &r, nil
}

// procStat is what liveness checks read of /proc/<pid>/stat.
type procStat struct {
	state byte   // field 3: R, S, D, Z, ...
	start uint64 // field 22, starttime: with the pid, the process's identity
	// exiting: the process is a zombie (state Z or X) or being torn down by the kernel
	// (flags, field 9, has PF_EXITING): it never runs its own code again.
	exiting bool
}

// pfExiting is PF_EXITING (include/linux/sched.h), set at the start of do_exit.
const pfExiting = 0x4

// parseStat reads a /proc/<pid>/stat line. The command name (field 2) is in parentheses and
// may itself hold spaces and parentheses: fields are counted after its last ')'.
func parseStat(r io.Reader) (procStat, error) {
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil && err != io.EOF {
		return procStat{}, err
	}
	i := strings.LastIndexByte(line, ')')
	if i < 0 {
		return procStat{}, errors.New("stat: no ')' after the command name")
	}
	fields := strings.Fields(line[i+1:])
	// fields[0] is field 3 (state), fields[6] field 9 (flags), fields[19] field 22.
	if len(fields) < 20 {
		return procStat{}, fmt.Errorf("stat: %d fields after the command name, want at least 20", len(fields))
	}
	start, err := strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		return procStat{}, err
	}
	flags, err := strconv.ParseUint(fields[6], 10, 64)
	if err != nil {
		return procStat{}, err
	}
	exiting := fields[0] == "Z" || fields[0] == "X" || flags&pfExiting != 0
	return procStat{state: fields[0][0], start: start, exiting: exiting}, nil
}

func readStat(pid int) (procStat, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	defer f.Close()
	return parseStat(f)
}

// startTime reads pid's start time; fs.ErrNotExist when the process is gone.
func startTime(pid int) (uint64, error) {
	st, err := readStat(pid)
	return st.start, err
}

// running reports whether pid is still the process that started at start and not on its way
// out (procStat.exiting): what an owner must be to still act on what it owns. alive counts
// such a process until it is reaped.
func running(pid int, start uint64) bool {
	if pid <= 0 {
		return false
	}
	st, err := readStat(pid)
	return err == nil && st.start == start && !st.exiting
}

// alive reports whether pid is still the process that started at start. A zombie still
// counts: it is not yet reaped and its pid not yet reusable.
func alive(pid int, start uint64) bool {
	if pid <= 0 {
		return false
	}
	got, err := startTime(pid)
	return err == nil && got == start
}

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
		out = append(out, unescapeOctal(f[4]))
	}
	return out, sc.Err()
}

func unescapeOctal(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
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
