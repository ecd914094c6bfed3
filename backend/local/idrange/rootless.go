package idrange

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
)

// A rootless sandbox maps id 0 to the user itself (it owns the state dir, the delegated
// cgroups and the session's run dir, which the sandbox's root must reach) and ids 1..65535 to
// the user's subordinate ids from /etc/subuid and /etc/subgid, mapped by the setuid helpers
// newuidmap and newgidmap (shadow's uidmap package). The code runs as id 1000, a subordinate
// id: not the user, so it cannot touch the user's files or processes. Every sandbox of the
// user maps the same subordinate ids (no per-sandbox ranges without root); pid namespaces
// still keep them from seeing each other.

// SubIDsNeeded is how many subordinate ids a rootless sandbox maps: its ids 1..65535.
const SubIDsNeeded = Size - 1

// Subordinate is what a rootless backend maps and with what: the user's own ids, the first
// of its subordinate uids and gids, and the helpers that write the maps.
type Subordinate struct {
	UID, GID             int
	SubUID, SubGID       int
	newuidmap, newgidmap string
}

// ProbeSubordinate finds this user's subordinate ids and the helpers that map them. The error
// says what the host lacks and how root provides it.
func ProbeSubordinate() (*Subordinate, error) {
	s := &Subordinate{UID: os.Geteuid(), GID: os.Getegid()}
	var err error
	if s.newuidmap, err = exec.LookPath("newuidmap"); err != nil {
		return nil, fmt.Errorf("rootless mode needs newuidmap and newgidmap (the uidmap package): %w", err)
	}
	if s.newgidmap, err = exec.LookPath("newgidmap"); err != nil {
		return nil, fmt.Errorf("rootless mode needs newuidmap and newgidmap (the uidmap package): %w", err)
	}
	name := strconv.Itoa(s.UID)
	if u, err := user.LookupId(name); err == nil {
		name = u.Username
	}
	if s.SubUID, err = subIDStart("/etc/subuid", name, s.UID); err != nil {
		return nil, err
	}
	if s.SubGID, err = subIDStart("/etc/subgid", name, s.GID); err != nil {
		return nil, err
	}
	return s, nil
}

// subIDStart finds the first range of at least SubIDsNeeded ids for name (or its id) in an
// /etc/subuid-format file.
func subIDStart(file, name string, id int) (int, error) {
	f, err := os.Open(file)
	if err != nil {
		return 0, fmt.Errorf("rootless mode needs %d subordinate ids for %s in %s: %w", SubIDsNeeded, name, file, err)
	}
	defer f.Close()
	start, err := ownSubIDs(f, name, id)
	if err != nil {
		return 0, fmt.Errorf("rootless mode needs %d subordinate ids for %s in %s (as root: usermod --add-subuids/--add-subgids): %w", SubIDsNeeded, name, file, err)
	}
	return start, nil
}

// ownSubIDs returns the start of the first of name's (by name or by id) ranges in an
// /etc/subuid-format file with at least SubIDsNeeded ids.
func ownSubIDs(r io.Reader, name string, id int) (int, error) {
	spans, err := parseSubIDs(r)
	if err != nil {
		return 0, err
	}
	for _, sp := range spans {
		if (sp.owner == name || sp.owner == strconv.Itoa(id)) && sp.first > 0 && sp.count >= SubIDsNeeded && sp.first+sp.count <= 1<<32-1 {
			return int(sp.first), nil
		}
	}
	return 0, errors.New("no such range")
}

// MapIDs writes a rootless init's uid and gid maps: 0 is the user, 1.. its subordinate ids.
func (s *Subordinate) MapIDs(pid int) error {
	for _, m := range []struct {
		helper   string
		own, sub int
	}{{s.newuidmap, s.UID, s.SubUID}, {s.newgidmap, s.GID, s.SubGID}} {
		args := []string{strconv.Itoa(pid), "0", strconv.Itoa(m.own), "1", "1", strconv.Itoa(m.sub), strconv.Itoa(SubIDsNeeded)}
		if out, err := exec.Command(m.helper, args...).CombinedOutput(); err != nil {
			return fmt.Errorf("%s %s: %v: %s", m.helper, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}
