package idrange

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"

	"github.com/airlock-sandbox/airlock/sandbox"
)

// Sandbox id ranges must not hold a host id something else on the host uses: a sandbox whose
// code ran as another tenant's id could read and write that tenant's files and signal its
// processes. useradd hands out subordinate ids (/etc/subuid, /etc/subgid: rootless podman and
// docker map their containers there) from 100000 upwards in blocks of 65536 — exactly
// defaultUIDBase's neighbourhood — and /etc/passwd and /etc/group may name ids that high too.
// Ranges that overlap any of them are never handed out (Allocator.excluded).

// span is the host ids [first, first+count); owner is the user an /etc/subuid line gives
// them to (its name or uid as written).
type span struct {
	first, count int64
	owner        string
}

func (s span) overlaps(first, count int64) bool {
	return s.first < first+count && first < s.first+s.count
}

// parseSubIDs reads /etc/subuid or /etc/subgid ("name:first:count" per line); malformed lines
// are skipped, as shadow-utils does.
func parseSubIDs(r io.Reader) ([]span, error) {
	var out []span
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Split(strings.TrimSpace(sc.Text()), ":")
		if len(f) != 3 || strings.HasPrefix(f[0], "#") {
			continue
		}
		first, err1 := strconv.ParseInt(f[1], 10, 64)
		count, err2 := strconv.ParseInt(f[2], 10, 64)
		if err1 != nil || err2 != nil || first < 0 || count < 1 {
			continue
		}
		out = append(out, span{first, count, f[0]})
	}
	return out, sc.Err()
}

// parseIDColumn reads the numeric id (third field) of /etc/passwd or /etc/group lines.
func parseIDColumn(r io.Reader) ([]span, error) {
	var out []span
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20) // /etc/group lines list members
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), ":", 4)
		if len(f) < 3 {
			continue
		}
		if id, err := strconv.ParseInt(f[2], 10, 64); err == nil && id >= 0 {
			out = append(out, span{first: id, count: 1})
		}
	}
	return out, sc.Err()
}

// hostIDFiles are what hostIDSpans reads, with their parsers.
var hostIDFiles = []struct {
	path  string
	parse func(io.Reader) ([]span, error)
}{
	{"/etc/subuid", parseSubIDs},
	{"/etc/subgid", parseSubIDs},
	{"/etc/passwd", parseIDColumn},
	{"/etc/group", parseIDColumn},
}

// hostIDSpans are the host ids this host's account files give to someone; a missing file
// gives none.
func hostIDSpans(root string) ([]span, error) {
	var out []span
	for _, f := range hostIDFiles {
		r, err := os.Open(root + f.path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		spans, err := f.parse(r)
		r.Close()
		if err != nil {
			return nil, err
		}
		out = append(out, spans...)
	}
	return out, nil
}

// excludedRanges returns the sandbox ranges of a that overlap any span.
func (a *Allocator) excludedRanges(spans []span) map[int]bool {
	out := map[int]bool{}
	for _, s := range spans {
		// Only the ranges s can touch: k from the one holding s.first to the one holding its end.
		lo := max(0, int((s.first-int64(a.base))/Size)-1)
		hi := min(a.ranges-1, int((s.first+s.count-1-int64(a.base))/Size))
		for k := lo; k <= hi; k++ {
			if s.overlaps(int64(a.hostBase(k)), Size) {
				out[k] = true
			}
		}
	}
	return out
}

// excludeHostIDs keeps the allocator off every range that overlaps an id the account files
// under root ("" for the host's) give out.
func (a *Allocator) excludeHostIDs(root string) error {
	spans, err := hostIDSpans(root)
	if err != nil {
		return fmt.Errorf("reading the host's id assignments: %w", err)
	}
	a.excluded = a.excludedRanges(spans)
	if len(a.excluded) >= a.ranges {
		return fmt.Errorf("%w: uidBase %d, uidRanges %d: every sandbox id range overlaps ids /etc/subuid, /etc/subgid, /etc/passwd or /etc/group give out; choose another uidBase", sandbox.ErrInvalid, a.base, a.ranges)
	}
	return nil
}
