// Package idrange gives each sandbox host ids of its own: per-sandbox ranges, the host ids they avoid, a rootless user's subordinate ids.
package idrange

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// Every native sandbox maps its ids 0..65535 onto a host range of its own, so code in two
// sandboxes never shares a host uid (RLIMIT_NPROC, files on a shared mount, signals). Range k
// (0 <= k < UIDRanges) is UIDBase+(k+1)*65536 onwards; UIDBase..UIDBase+65535 itself owns the
// unpacked images and is mapped by no sandbox, so no sandbox process can ever own an image's
// file on the host; a sandbox sees the image through a mount idmapped onto its own range
// (idmap.go), with the owners the image gave its files.
//
// A range is claimed by a symlink <state dir>/uids/<k> -> <session id>: symlink(2) fails when
// the name exists, so creates in any number of processes sharing the state dir (all under its
// shared lock) never get the same range. Terminate removes the claim once the sandbox's
// cgroup is empty and its state gone; reconcile (under the exclusive lock, no create in
// flight) removes claims whose session dir is gone, keeps those of adopted sandboxes.

// Size is how many ids a sandbox's user namespace maps (0..65535): one range.
const Size = 65536

// Dir is the state dir's subdirectory of range claims.
const Dir = "uids"

// DefaultRanges is how many sandboxes may live at once per state dir by default.
const DefaultRanges = 4096

// Allocator hands out id ranges from one state dir.
type Allocator struct {
	dir    string // <state dir>/uids
	base   int    // Options.UIDBase
	ranges int    // Options.UIDRanges
	next   atomic.Int64
	// excluded ranges overlap host ids someone else has (subids.go): never handed out. Read
	// from the account files under hostRoot ("" for the host's) at the first claim, not in New:
	// a process that never creates (one claiming a parked sandbox, a reconcile) does not pay ~0.1 ms.
	hostRoot     string
	excludedOnce sync.Once
	excludedErr  error
	excluded     map[int]bool
}

// NewAllocator is an allocator of ranges claimed under stateDir: ranges of them, range k's
// host ids from base+(k+1)*Size on.
func NewAllocator(stateDir string, base, ranges int) (*Allocator, error) {
	a := &Allocator{dir: filepath.Join(stateDir, Dir), base: base, ranges: ranges}
	if err := os.Mkdir(a.dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	return a, nil
}

// hostBase is the host id sandbox id 0 maps to in range k.
func (a *Allocator) hostBase(k int) int { return a.base + (k+1)*Size }

// Claim takes a free range for session id and returns its index and host base.
func (a *Allocator) Claim(id string) (int, int, error) {
	a.excludedOnce.Do(func() { a.excludedErr = a.excludeHostIDs(a.hostRoot) })
	if a.excludedErr != nil {
		return 0, 0, a.excludedErr
	}
	// Start after the last range this process took: a just-freed range is not handed out
	// again at once while others are free, and creates in one process do not all probe the
	// same taken names first.
	start := int(a.next.Load() % int64(a.ranges))
	for i := range a.ranges {
		k := (start + i) % a.ranges
		if a.excluded[k] {
			continue
		}
		err := os.Symlink(id, filepath.Join(a.dir, strconv.Itoa(k)))
		if err == nil {
			a.next.Store(int64(k + 1))
			return k, a.hostBase(k), nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return 0, 0, fmt.Errorf("claim id range %d: %w", k, err)
		}
	}
	return 0, 0, fmt.Errorf("%w: uidRanges %d: every id range (host ids %d..%d) belongs to a live sandbox (%d overlap host accounts' ids and are not used); terminate one or configure more ranges", sandbox.ErrRefused, a.ranges, a.hostBase(0), a.hostBase(a.ranges)-1, len(a.excluded))
}

// Release frees range k if session id holds it.
func (a *Allocator) Release(k int, id string) error {
	p := filepath.Join(a.dir, strconv.Itoa(k))
	if owner, err := os.Readlink(p); err != nil || owner != id {
		return nil // never claimed by id, or freed already
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("release id range %d: %w", k, err)
	}
	return nil
}

// ReleaseAll frees every range session id holds: a session whose record never got written.
func (a *Allocator) ReleaseAll(id string) error {
	entries, err := os.ReadDir(a.dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		k, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		errs = append(errs, a.Release(k, id))
	}
	return errors.Join(errs...)
}

// Sweep frees the claims whose session has no state dir any more (a process that died
// between claiming and making it, or between removing it and freeing the claim). It runs
// under the state dir's exclusive lock, when no create is in flight.
func (a *Allocator) Sweep(stateDir string) error {
	entries, err := os.ReadDir(a.dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		p := filepath.Join(a.dir, e.Name())
		owner, err := os.Readlink(p)
		if err == nil && statedir.CheckSessionID(owner) == nil {
			if _, err := os.Lstat(filepath.Join(stateDir, owner)); !errors.Is(err, fs.ErrNotExist) {
				continue // a live (or not yet reaped) session keeps its range
			}
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
