package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/backend/local/sessions"
	sbstats "github.com/airlock-sandbox/airlock/backend/local/stats"
	"github.com/airlock-sandbox/airlock/internal/sched"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// Parked sandboxes are sandboxes parked in the state dir for whichever process claims one next: a
// one-shot process (airlock run) takes a sandbox made before it started, and leaves the next
// one made after it ends, with no daemon (docs/pool.md#parked-sandboxes-airlock-run). A parked sandbox is single-use like a pooled
// sandbox: the claimer terminates it.
//
// A parked sandbox is in one of three states, each visible on disk to every process:
//   - being made: labelled LabelParked and labelParkedFiller, nothing else;
//   - parked: an index file <state>/spares/<key>/<session> holds its sessions.Entry;
//   - claimed: that file was renamed (atomically: one claimer wins) into the session's own
//     dir as sessions.ClaimPrefix+<owner>.
//
// The index, the claim and what a claimer checks are package parked sandboxes', which a one-shot
// claimer uses without this package (airlock run's lean front).
//
// Reconcile reaps a parked sandbox being made whose filler is gone and a claimed one whose claimer is
// gone; a parked one lives until its lifetime ends (it then dies, and is reaped as broken).
const (
	// LabelParked is the template key (PoolKey) of a parked sandbox's template.
	LabelParked = "airlock.spare"
	// labelParkedFiller is "<pid>-<start time>" of the process that made the parked sandbox.
	labelParkedFiller = "airlock.spare.filler"

	// MaxParked bounds ParkOptions.Count.
	MaxParked = 8
	// MaxParkedGrown bounds how far misses grow a key's parked count past Count (within
	// ParkOptions.Memory).
	MaxParkedGrown = 64
)

// ParkOptions configure FillParked.
type ParkOptions struct {
	// Count is how many parked sandboxes of the template to keep parked (1..MaxParked).
	Count int
	// MaxAge retires a parked sandbox older than this (terminated by the next filler); it must
	// be shorter than the template's lifetime. Claims check the lifetime left themselves.
	MaxAge time.Duration
	// Prestart, if set, runs in each new parked sandbox after a warm-up exec; what it returns is handed
	// to the claimer (ClaimParked). It must leave nothing that ties the sandbox to this
	// process: the filler exits and the claimer connects anew.
	Prestart func(ctx context.Context, sess *sandbox.Session, agent sandbox.Agent) ([]byte, error)
	// Memory (the pool memory, as PoolOptions.Memory) lets the parked count grow past Count
	// with the run rate: a filler started by a run that found nothing parked (Missed) raises
	// the key's target by one while target+1 sandboxes of the most memory a parked one was
	// measured to hold fit in it (at most MaxParkedGrown); a parked sandbox retired unclaimed
	// lowers it by one, down to Count. 0: Count alone.
	Memory int64
	// Missed: the run that started this filler found nothing parked.
	Missed bool
	// Raise: this process runs idle (SCHED_IDLE, set by the run that started it, which ran
	// under normal scheduling at nice 0), so the sandboxes it makes start idle too; each is put
	// back to normal scheduling at nice 0, every thread of every process in it, before it is
	// parked (internal/sched). Needs root.
	Raise bool
}

// parkedTarget is a key's grown parked count, kept in <state>/spares/<key>.target and
// changed only under the key's lock.
type parkedTarget struct {
	Target int `json:"target"`
	// SandboxMemory is the most host memory a parked sandbox of the key was measured to hold.
	SandboxMemory int64 `json:"sandboxMemory"`
}

func (b *Backend) readParkedTarget(key string) parkedTarget {
	var t parkedTarget
	if data, err := os.ReadFile(b.parkedIndex(key) + ".target"); err == nil {
		_ = json.Unmarshal(data, &t) // unreadable: start over from Count
	}
	return t
}

func (b *Backend) writeParkedTarget(key string, t parkedTarget) {
	data, _ := json.Marshal(t)
	path := b.parkedIndex(key) + ".target"
	if err := os.WriteFile(path+".tmp", data, 0o600); err == nil {
		err = os.Rename(path+".tmp", path)
		if err != nil {
			b.log.Warn("parked sandboxes: recording the parked count failed", "err", err)
		}
	}
}

// fits reports whether n parked sandboxes of t's measured size fit in opts.Memory (none
// measured yet: one past Count may be tried, to measure it).
func (t parkedTarget) fits(n int, opts ParkOptions) bool {
	switch {
	case n <= opts.Count:
		return true
	case opts.Memory == 0 || n > MaxParkedGrown:
		return false
	case t.SandboxMemory == 0:
		return n <= opts.Count+1
	}
	return int64(n)*t.SandboxMemory <= opts.Memory
}

// count is how many to keep parked: Count, or the grown target within the pool memory.
func (t parkedTarget) count(opts ParkOptions) int {
	n := max(opts.Count, t.Target)
	for n > opts.Count && !t.fits(n, opts) {
		n--
	}
	return n
}

// ParkedDir is where a state dir keeps its parked sandboxes' index (and a filler's log).
func ParkedDir(stateDir string) string { return sessions.ParkedDir(stateDir) }

func (b *Backend) parkedIndex(key string) string { return sessions.IndexDir(b.opts.StateDir, key) }

// FillParked parks parked sandboxes of tmpl until opts.Count are parked. Only one process fills a key at
// a time: when another holds the key's lock, FillParked returns at once (that one fills).
func (b *Backend) FillParked(ctx context.Context, tmpl spec.Sandbox, opts ParkOptions) error {
	tmpl.ApplyDefaults()
	if tmpl.ID == "" {
		tmpl.ID = "parked"
	}
	life := time.Duration(tmpl.Session.Lifetime()) * time.Second
	switch {
	case opts.Count < 1 || opts.Count > MaxParked:
		return fmt.Errorf("%w: parked sandboxes count %d: must be 1..%d", sandbox.ErrInvalid, opts.Count, MaxParked)
	case opts.Memory < 0:
		return fmt.Errorf("%w: parked sandboxes memory %d: must be 0 (no bound) or a number of bytes", sandbox.ErrInvalid, opts.Memory)
	case opts.MaxAge < time.Second || opts.MaxAge >= life:
		return fmt.Errorf("%w: parked sandboxes maxAge %v: must be at least 1s and shorter than the template's lifetime (%v)", sandbox.ErrInvalid, opts.MaxAge, life)
	}
	for k := range tmpl.Labels {
		if k == LabelParked || k == labelParkedFiller || k == LabelPool || k == labelPoolFiller {
			return fmt.Errorf("%w: parked sandbox template label %q: set by the runtime itself", sandbox.ErrInvalid, k)
		}
	}
	key, err := PoolKey(tmpl)
	if err != nil {
		return err
	}
	self, err := sessions.SelfProc()
	if err != nil {
		return err
	}
	idx := b.parkedIndex(key)
	if err := os.MkdirAll(idx, 0o700); err != nil {
		return err
	}
	lock, err := os.OpenFile(idx+".lock", os.O_CREATE|os.O_RDWR|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	// A claim between our last count and our unlock starts a filler that finds the lock held
	// and leaves: so count again after unlocking, and go on while short (bounded).
	if opts.Missed {
		b.recordParkedMiss(key) // whichever filler holds the lock grows the count
	}
	for round := 0; round < 4*MaxParkedGrown+4; round++ {
		if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil
			}
			return err
		}
		err := b.fillLocked(ctx, tmpl, key, self, opts)
		_ = unix.Flock(int(lock.Fd()), unix.LOCK_UN)
		if err != nil {
			return err
		}
		if n, _ := b.parkedEntries(key); len(n) >= b.readParkedTarget(key).count(opts) && !sessions.UsedPending(b.opts.StateDir, key) {
			return nil
		}
	}
	return nil
}

// recordParkedMiss records one miss of key for the filler holding its lock (fillLocked): a
// run's filler never waits for that lock.
func (b *Backend) recordParkedMiss(key string) {
	if err := sessions.RecordMiss(b.opts.StateDir, key); err != nil {
		b.log.Warn("parked sandboxes: recording a miss failed", "err", err)
	}
}

func (b *Backend) fillLocked(ctx context.Context, tmpl spec.Sandbox, key, self string, opts ParkOptions) error {
	t := b.readParkedTarget(key)
	defer func() { b.writeParkedTarget(key, t) }()
	if err := sessions.MarkFiller(b.opts.StateDir, key); err != nil {
		return err
	}
	for {
		// Runs coming back to back (claims closer than ParkQuiet) are left the machine while
		// something is still parked: the refill and the used sandboxes' terminates wait for a
		// pause (sessions/filling.go). A SCHED_IDLE filler takes no processor from them, but
		// the work still slows them (caches, the other hardware thread, kernel locks).
		quiet := time.Since(sessions.LastClaim(b.opts.StateDir, key)) >= sessions.ParkQuiet
		if quiet {
			for _, id := range sessions.TakeUsed(b.opts.StateDir, key) {
				b.discardParked(ctx, id)
			}
		}
		for range sessions.TakeMisses(b.opts.StateDir, key) {
			if n := max(opts.Count, t.Target) + 1; t.fits(n, opts) {
				t.Target = n
			}
		}
		parked, err := b.parkedEntries(key)
		if err != nil {
			return err
		}
		live := 0
		for _, e := range parked {
			if time.Since(e.Parked) >= opts.MaxAge {
				b.retireParked(ctx, key, e.Session, self)
				if t.Target > opts.Count {
					t.Target-- // runs come slower than this one was parked for
				}
				continue
			}
			live++
		}
		if (live >= t.count(opts) && !sessions.UsedPending(b.opts.StateDir, key)) || ctx.Err() != nil {
			return ctx.Err()
		}
		if !quiet && live > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(sessions.ParkQuiet / 4):
			}
			continue
		}
		if live >= t.count(opts) {
			continue // quiet now: the used ones are terminated at the top
		}
		// As many at once as there are processors: an idle filler (SCHED_IDLE) takes only
		// what they leave idle, and in the pause between a caller's bursts that is every core.
		n := min(t.count(opts)-live, runtime.NumCPU())
		mems := make([]int64, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { mems[i], errs[i] = b.parkOne(ctx, tmpl, key, self, opts) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
		t.SandboxMemory = max(t.SandboxMemory, slices.Max(mems))
	}
}

// parkOne makes one parked sandbox, warms it, runs Prestart and parks it; mem is the host
// memory it holds once parked (0: not measured, ParkOptions.Memory unset).
func (b *Backend) parkOne(ctx context.Context, tmpl spec.Sandbox, key, self string, opts ParkOptions) (mem int64, err error) {
	sess, err := b.Create(ctx, Instance(tmpl, map[string]string{LabelParked: key, labelParkedFiller: self}))
	if err != nil {
		return 0, fmt.Errorf("creating a parked sandbox: %w", err)
	}
	defer func() {
		if err != nil {
			tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if terr := b.Terminate(tctx, sess.ID); terr != nil {
				err = errors.Join(err, terr)
			}
		}
	}()
	a, err := b.Connect(ctx, sess.ID)
	if err != nil {
		return 0, err
	}
	defer a.Close()
	// The first exec in a sandbox costs several later ones: pay it here (see Pool.warmUp).
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, _ = a.Exec(wctx, sandbox.ExecRequest{Argv: []string{"true"}, Timeout: 5 * time.Second}, io.Discard, io.Discard)
	cancel()
	e := sessions.Entry{Session: sess.ID}
	if opts.Prestart != nil {
		pctx, cancel := context.WithTimeout(ctx, prestartTimeout)
		data, err := opts.Prestart(pctx, sess, a)
		cancel()
		if err != nil {
			b.log.Warn("parked sandboxes: prestart failed; parking the sandbox without it", "session", sess.ID, "err", err)
		} else {
			e.Prestart = data
		}
	}
	s := b.sessionOf(sess.ID)
	if s == nil {
		return 0, fmt.Errorf("parked sandbox %s: not this process's", sess.ID)
	}
	if opts.Raise {
		if err := sched.Restore(s.cg.procs, 0); err != nil {
			return 0, fmt.Errorf("putting parked sandbox %s back to normal scheduling: %w", sess.ID, err)
		}
	}
	e.Parked = time.Now()
	if e.Token, err = sessions.MintExecute(s.key, s.rec.RecordCore, e.Parked, s.rec.ExpiresAt); err != nil {
		return 0, err
	}
	if opts.Memory > 0 {
		if st, err := sbstats.Read(s.rec.CgroupVersion, s.rec.Cgroup); err == nil {
			mem = st.MemoryBytes
		}
	}
	data, err := json.Marshal(e)
	if err != nil {
		return 0, err
	}
	tmp := filepath.Join(ParkedDir(b.opts.StateDir), ".tmp-"+sess.ID)
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return 0, err
	}
	if err := os.Rename(tmp, filepath.Join(b.parkedIndex(key), sess.ID)); err != nil {
		_ = os.Remove(tmp)
		return 0, err
	}
	b.log.Debug("parked sandboxes: parked", "session", sess.ID, "key", key)
	return mem, nil
}

// sessionOf is this backend's record of a session it created, nil if none.
func (b *Backend) sessionOf(id string) *session {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sessions[id]
}

// parkedEntries reads the key's index (newest first); entries it cannot read are skipped.
func (b *Backend) parkedEntries(key string) ([]sessions.Entry, error) {
	return sessions.Parked(b.opts.StateDir, key)
}

// takeParked claims a parked sandbox's index entry: true when this process won it.
func (b *Backend) takeParked(key, id, self string) bool {
	return sessions.Take(b.opts.StateDir, key, id, self)
}

// retireParked claims a parked sandbox and terminates it (filler: too old to hand out).
func (b *Backend) retireParked(ctx context.Context, key, id, self string) {
	if b.takeParked(key, id, self) {
		b.discardParked(ctx, id)
	}
}

// discardParked terminates a claimed parked sandbox that will not be used, logging failures: the next
// reconcile reaps what is left (its claimer, this process, will be gone).
func (b *Backend) discardParked(ctx context.Context, id string) {
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := b.Terminate(tctx, id); err != nil {
		b.log.Warn("parked sandboxes: terminating a parked sandbox failed", "session", id, "err", err)
	}
}

// ParkedCount counts the parked sandboxes of key.
func (b *Backend) ParkedCount(key string) int {
	p, _ := b.parkedEntries(key)
	return len(p)
}

// reapableParked reports whether a live sandbox found at reconcile is a parked sandbox nobody can ever
// use: claimed by a process that is gone, or never parked by a filler that is gone.
func (b *Backend) reapableParked(dir string, rec *record) bool {
	key := rec.Spec.Labels[LabelParked]
	if key == "" || checkSessionID(rec.ID) != nil {
		return false
	}
	// The index first: a claim moves the entry from there into dir, so looking in the other
	// order could miss it in both places.
	if _, err := os.Lstat(filepath.Join(b.parkedIndex(key), rec.ID)); err == nil {
		return false
	}
	if claimer, claimed := sessions.Claimer(dir); claimed {
		if procAlive(claimer) {
			return false
		}
		b.log.Info("reaping a claimed parked sandbox whose claimer is gone", "session", rec.ID, "claimer", claimer)
		return true
	}
	if procAlive(rec.Spec.Labels[labelParkedFiller]) {
		return false // being made
	}
	b.log.Info("reaping a parked sandbox its filler never parked", "session", rec.ID, "filler", rec.Spec.Labels[labelParkedFiller])
	return true
}

// sweepParkedIndex removes index entries whose session dir is gone (a parked sandbox that died parked
// and was reaped) and temporary files of fillers that are gone.
func (b *Backend) sweepParkedIndex() error {
	root := ParkedDir(b.opts.StateDir)
	keys, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	gone := func(id string) bool {
		_, err := os.Lstat(filepath.Join(b.opts.StateDir, id))
		return checkSessionID(id) != nil || errors.Is(err, fs.ErrNotExist)
	}
	for _, k := range keys {
		if id, ok := strings.CutPrefix(k.Name(), ".tmp-"); ok && gone(id) {
			if err := os.Remove(filepath.Join(root, k.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
		if !k.IsDir() {
			continue
		}
		ents, err := os.ReadDir(filepath.Join(root, k.Name()))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, e := range ents {
			if gone(e.Name()) {
				if err := os.Remove(filepath.Join(root, k.Name(), e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
					errs = append(errs, err)
				}
			}
		}
	}
	return errors.Join(errs...)
}

// RetireParked claims and terminates every parked sandbox in the state dir, whatever its
// template, and returns their session ids; with dryRun it only lists them.
func (b *Backend) RetireParked(ctx context.Context, dryRun bool) ([]string, error) {
	keys, err := os.ReadDir(ParkedDir(b.opts.StateDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	self, err := sessions.SelfProc()
	if err != nil {
		return nil, err
	}
	var ids []string
	var errs []error
	for _, k := range keys {
		if !k.IsDir() {
			continue
		}
		parked, err := b.parkedEntries(k.Name())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, e := range parked {
			if dryRun {
				ids = append(ids, e.Session)
				continue
			}
			if !b.takeParked(k.Name(), e.Session, self) {
				continue // claimed meanwhile
			}
			if err := b.Terminate(ctx, e.Session); err != nil {
				errs = append(errs, fmt.Errorf("terminating parked sandbox %s: %w", e.Session, err))
				continue
			}
			ids = append(ids, e.Session)
		}
	}
	return ids, errors.Join(errs...)
}
