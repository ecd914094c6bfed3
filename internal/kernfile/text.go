// Package kernfile holds what reads the kernel's files (cgroupfs, procfs, mountinfo): small ones with bare system calls, their text formats, cgroup trees' removal.
package kernfile

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// The kernel's text formats, parsed through io.Reader so that tests need no root; pure Go,
// built on every OS (capability's probe is read on clients too).

// CgroupRoot is where the host mounts its cgroup hierarchies.
const CgroupRoot = "/sys/fs/cgroup"

// UnescapeMount undoes the octal escapes (\040 for space, \011, \012, \134) the kernel writes in
// mountinfo's paths.
func UnescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
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

// CgroupMembership is one line of /proc/<pid>/cgroup: "hierarchy-ID:controller-list:path".
// The cgroup2 line has ID 0 and no controllers.
type CgroupMembership struct {
	HierarchyID int      `json:"hierarchyId"`
	Controllers []string `json:"controllers,omitempty"`
	Path        string   `json:"path"`
}

// ParseProcCgroup parses /proc/<pid>/cgroup text.
func ParseProcCgroup(r io.Reader) ([]CgroupMembership, error) {
	var out []CgroupMembership
	sc := bufio.NewScanner(r)
	line := 0
	for sc.Scan() {
		line++
		text := sc.Text()
		if strings.TrimSpace(text) == "" {
			continue
		}
		parts := strings.SplitN(text, ":", 3)
		if len(parts) != 3 {
			return nil, fmt.Errorf("cgroup line %d: want id:controllers:path, got %q", line, text)
		}
		id, err := strconv.Atoi(parts[0])
		if err != nil || id < 0 {
			return nil, fmt.Errorf("cgroup line %d: bad hierarchy id %q", line, parts[0])
		}
		m := CgroupMembership{HierarchyID: id, Path: parts[2]}
		if parts[1] != "" {
			m.Controllers = strings.Split(parts[1], ",")
		}
		out = append(out, m)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading cgroup membership: %w", err)
	}
	return out, nil
}

// UnifiedPath is the cgroup v2 path ("0::/a/b" → "/a/b") among ms; ok is false when there is
// no v2 line.
func UnifiedPath(ms []CgroupMembership) (path string, ok bool) {
	for _, m := range ms {
		if m.HierarchyID == 0 && len(m.Controllers) == 0 {
			return m.Path, true
		}
	}
	return "", false
}
