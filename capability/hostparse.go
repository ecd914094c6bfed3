package capability

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/kernfile"
)

// The kernel-facing text formats the host probe reads, parsed through io.Reader so that every
// layout (cgroup v1, v2, hybrid; with and without a kernel config) is tested without root.

// CgroupMount is one cgroup or cgroup2 filesystem from /proc/self/mountinfo.
type CgroupMount struct {
	Version    int    `json:"version"` // 1 or 2
	MountPoint string `json:"mountPoint"`
	// Root is the cgroup this mount shows as its top (not "/" inside a container).
	Root string `json:"root"`
	// Controllers are the v1 controllers bound to this hierarchy (none for cgroup2, whose
	// controllers are listed in its cgroup.controllers file).
	Controllers []string `json:"controllers,omitempty"`
	// Name is a named v1 hierarchy's name ("systemd" for name=systemd).
	Name     string `json:"name,omitempty"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

// v1Controllers are the cgroup v1 controller names as the kernel spells them in mount options;
// other options (rw, xattr, clone_children, release_agent=...) are not controllers.
var v1Controllers = map[string]bool{
	"cpu": true, "cpuacct": true, "cpuset": true, "memory": true, "devices": true,
	"freezer": true, "net_cls": true, "net_prio": true, "blkio": true, "perf_event": true,
	"hugetlb": true, "pids": true, "rdma": true, "misc": true,
}

// ParseCgroupMounts returns the cgroup and cgroup2 mounts in mountinfo text, in file order.
// Format (proc(5)): id parent major:minor root mountpoint options [optional...] - fstype source superoptions.
func ParseCgroupMounts(r io.Reader) ([]CgroupMount, error) {
	var mounts []CgroupMount
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	line := 0
	for sc.Scan() {
		line++
		text := sc.Text()
		if strings.TrimSpace(text) == "" {
			continue
		}
		fields := strings.Fields(text)
		sep := slices.Index(fields, "-")
		if sep < 6 || len(fields) < sep+4 {
			return nil, fmt.Errorf("mountinfo line %d: malformed: %q", line, text)
		}
		fstype := fields[sep+1]
		var version int
		switch fstype {
		case "cgroup":
			version = 1
		case "cgroup2":
			version = 2
		default:
			continue
		}
		m := CgroupMount{
			Version:    version,
			Root:       kernfile.UnescapeMount(fields[3]),
			MountPoint: kernfile.UnescapeMount(fields[4]),
		}
		for _, o := range strings.Split(fields[5], ",") {
			if o == "ro" {
				m.ReadOnly = true
			}
		}
		for _, o := range strings.Split(fields[sep+3], ",") {
			switch {
			case o == "ro":
				m.ReadOnly = true
			case strings.HasPrefix(o, "name="):
				m.Name = strings.TrimPrefix(o, "name=")
			case version == 1 && v1Controllers[o]:
				m.Controllers = append(m.Controllers, o)
			}
		}
		mounts = append(mounts, m)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading mountinfo: %w", err)
	}
	return mounts, nil
}

// ParseProcCgroups parses /proc/cgroups into controller → enabled. A controller missing
// from the result is not built into the kernel; one mapped to false was disabled at boot
// (cgroup_disable=).
func ParseProcCgroups(r io.Reader) (map[string]bool, error) {
	out := map[string]bool{}
	sc := bufio.NewScanner(r)
	line := 0
	for sc.Scan() {
		line++
		text := sc.Text()
		if strings.HasPrefix(text, "#") || strings.TrimSpace(text) == "" {
			continue
		}
		f := strings.Fields(text)
		if len(f) != 4 {
			return nil, fmt.Errorf("/proc/cgroups line %d: want 4 fields, got %q", line, text)
		}
		out[f[0]] = f[3] == "1"
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading /proc/cgroups: %w", err)
	}
	return out, nil
}

// ParseKernelConfig parses a kernel .config (plain text) into option → value ("y", "m", a
// string or number); "# CONFIG_X is not set" lines map to "n".
func ParseKernelConfig(r io.Reader) (map[string]string, error) {
	return parseKernelConfig(r, nil)
}

// parseKernelConfig keeps only the options in want (all when want is nil): a distribution
// config has thousands.
func parseKernelConfig(r io.Reader, want map[string]bool) (map[string]string, error) {
	out := map[string]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		// Bytes, not Text: a config has thousands of lines and few are wanted.
		line := bytes.TrimSpace(sc.Bytes())
		if name, ok := bytes.CutPrefix(line, []byte("# ")); ok {
			if opt, ok := bytes.CutSuffix(name, []byte(" is not set")); ok && bytes.HasPrefix(opt, []byte("CONFIG_")) && (want == nil || want[string(opt)]) {
				out[string(opt)] = "n"
			}
		} else if k, v, ok := bytes.Cut(line, []byte("=")); ok && bytes.HasPrefix(k, []byte("CONFIG_")) && (want == nil || want[string(k)]) {
			out[string(k)] = strings.Trim(string(v), `"`)
		}
		if want != nil && len(out) == len(want) {
			// Each option appears once: the rest (and, from /proc/config.gz, its
			// decompression) is not needed.
			return out, nil
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading kernel config: %w", err)
	}
	return out, nil
}

// ParseGzipKernelConfig parses /proc/config.gz.
func ParseGzipKernelConfig(r io.Reader) (map[string]string, error) {
	return parseGzipKernelConfig(r, nil)
}

func parseGzipKernelConfig(r io.Reader, want map[string]bool) (map[string]string, error) {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return nil, fmt.Errorf("kernel config: %w", err)
	}
	defer zr.Close()
	return parseKernelConfig(zr, want)
}

// ParseSwaps reports whether /proc/swaps lists any active swap area.
func ParseSwaps(r io.Reader) (bool, error) {
	sc := bufio.NewScanner(r)
	first := true
	for sc.Scan() {
		if first {
			first = false // the header line
			continue
		}
		if strings.TrimSpace(sc.Text()) != "" {
			return true, nil
		}
	}
	return false, sc.Err()
}

// procStatus is what the probe needs from /proc/self/status.
type procStatus struct {
	HasSeccomp  bool   // the Seccomp: line exists only with CONFIG_SECCOMP
	SeccompMode int    // 0 none, 1 strict, 2 filter
	CapEff      uint64 // effective capability bits
}

// parseProcStatus reads the Seccomp and CapEff lines of /proc/<pid>/status.
func parseProcStatus(r io.Reader) (procStatus, error) {
	var st procStatus
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch k {
		case "Seccomp":
			n, err := strconv.Atoi(v)
			if err != nil {
				return st, fmt.Errorf("status Seccomp: %q: %w", v, err)
			}
			st.HasSeccomp, st.SeccompMode = true, n
		case "CapEff":
			n, err := strconv.ParseUint(v, 16, 64)
			if err != nil {
				return st, fmt.Errorf("status CapEff: %q: %w", v, err)
			}
			st.CapEff = n
		}
	}
	return st, sc.Err()
}

// ModuleState is how a kernel feature is present.
type ModuleState string

const (
	ModuleLoaded   ModuleState = "loaded"   // /sys/module/<name> exists
	ModuleBuiltin  ModuleState = "builtin"  // compiled into the kernel
	ModuleLoadable ModuleState = "loadable" // a module file is installed; the kernel loads it on first use
	ModuleAbsent   ModuleState = "absent"   // known not to be there
	ModuleUnknown  ModuleState = "unknown"  // nothing to tell either way
)

// moduleInList reports whether a modules.builtin or modules.dep text names module name
// (as a path ending in /name.ko, optionally compressed).
func moduleInList(r io.Reader, name string) (bool, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	want := "/" + name + ".ko"
	for sc.Scan() {
		path, _, _ := strings.Cut(sc.Text(), ":")
		for _, ext := range []string{"", ".xz", ".zst", ".gz"} {
			if strings.HasSuffix(path, want+ext) {
				return true, nil
			}
		}
	}
	return false, sc.Err()
}
