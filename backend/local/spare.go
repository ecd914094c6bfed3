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
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/backend/local/spares"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// Spares are sandboxes parked in the state dir for whichever process claims one next: a
// one-shot process (airlock run) takes a sandbox made before it started, and leaves the next
// one made after it ends, with no daemon (docs/spares.md). A spare is single-use like a pooled
// sandbox: the claimer terminates it.
//
// A spare is in one of three states, each visible on disk to every process:
//   - being made: labelled LabelSpare and LabelSpareFiller, nothing else;
//   - parked: an index file <state>/spares/<key>/<session> holds its spares.Entry;
//   - claimed: that file was renamed (atomically: one claimer wins) into the session's own
//     dir as spares.ClaimPrefix+<owner>.
//
// The index, the claim and what a claimer checks are package spares', which a one-shot
// claimer uses without this package (airlock run's lean front).
//
// Reconcile reaps a spare being made whose filler is gone and a claimed one whose claimer is
// gone; a parked one lives until its lifetime ends (it then dies, and is reaped as broken).
const (
	// LabelSpare is the template key (PoolKey) of a spare's template.
	LabelSpare = "airlock.spare"
	// LabelSpareFiller is "<pid>-<start time>" of the process that made the spare.
	LabelSpareFiller = "airlock.spare.filler"
)

// SpareOptions configure FillSpares.
type SpareOptions struct {
	// Count is how many spares of the template to keep parked (1..spares.MaxSpares).
	Count int
	// MaxAge retires a parked spare older than this (terminated by the next filler); it must
	// be shorter than the template's lifetime. Claims check the lifetime left themselves.
	MaxAge time.Duration
	// Prestart, if set, runs in each new spare after a warm-up exec; what it returns is handed
	// to the claimer (ClaimSpare). It must leave nothing that ties the sandbox to this
	// process: the filler exits and the claimer connects anew.
	Prestart func(ctx context.Context, sess *sandbox.Session, agent sandbox.Agent) ([]byte, error)
}

// SpareKey is the name of the spares of tmpl: the pool key of its template.
func SpareKey(tmpl spec.Sandbox) (string, error) { return PoolKey(tmpl) }

// SparesDir is where a state dir keeps its spares' index (and a filler's log).
func SparesDir(stateDir string) string { return spares.SparesDir(stateDir) }

func (b *Backend) spareIndex(key string) string { return spares.IndexDir(b.opts.StateDir, key) }

// FillSpares parks spares of tmpl until opts.Count are parked. Only one process fills a key at
// a time: when another holds the key's lock, FillSpares returns at once (that one fills).
func (b *Backend) FillSpares(ctx context.Context, tmpl spec.Sandbox, opts SpareOptions) error {
	tmpl.ApplyDefaults()
	if tmpl.ID == "" {
		tmpl.ID = "spare"
	}
	life := time.Duration(tmpl.Session.Lifetime()) * time.Second
	switch {
	case opts.Count < 1 || opts.Count > spares.MaxSpares:
		return fmt.Errorf("%w: spares count %d: must be 1..%d", sandbox.ErrInvalid, opts.Count, spares.MaxSpares)
	case opts.MaxAge < time.Second || opts.MaxAge >= life:
		return fmt.Errorf("%w: spares maxAge %v: must be at least 1s and shorter than the template's lifetime (%v)", sandbox.ErrInvalid, opts.MaxAge, life)
	}
	for k := range tmpl.Labels {
		if k == LabelSpare || k == LabelSpareFiller || k == LabelPool || k == LabelPoolOwner {
			return fmt.Errorf("%w: spare template label %q: set by the runtime itself", sandbox.ErrInvalid, k)
		}
	}
	key, err := SpareKey(tmpl)
	if err != nil {
		return err
	}
	owner, err := spares.SelfOwner()
	if err != nil {
		return err
	}
	idx := b.spareIndex(key)
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
	for round := 0; round < 4*opts.Count+4; round++ {
		if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil
			}
			return err
		}
		err := b.fillLocked(ctx, tmpl, key, owner, opts)
		_ = unix.Flock(int(lock.Fd()), unix.LOCK_UN)
		if err != nil {
			return err
		}
		if n, _ := b.parkedSpares(key); len(n) >= opts.Count {
			return nil
		}
	}
	return nil
}

func (b *Backend) fillLocked(ctx context.Context, tmpl spec.Sandbox, key, owner string, opts SpareOptions) error {
	for {
		parked, err := b.parkedSpares(key)
		if err != nil {
			return err
		}
		live := 0
		for _, e := range parked {
			if time.Since(e.Parked) >= opts.MaxAge {
				b.retireSpare(ctx, key, e.Session, owner)
				continue
			}
			live++
		}
		if live >= opts.Count {
			return nil
		}
		if err := b.parkOne(ctx, tmpl, key, owner, opts); err != nil {
			return err
		}
	}
}

// parkOne makes one spare, warms it, runs Prestart and parks it.
func (b *Backend) parkOne(ctx context.Context, tmpl spec.Sandbox, key, owner string, opts SpareOptions) (err error) {
	sess, err := b.Create(ctx, Instance(tmpl, map[string]string{LabelSpare: key, LabelSpareFiller: owner}))
	if err != nil {
		return fmt.Errorf("creating a spare: %w", err)
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
		return err
	}
	defer a.Close()
	// The first exec in a sandbox costs several later ones: pay it here (see Pool.warmUp).
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, _ = a.Exec(wctx, sandbox.ExecRequest{Argv: []string{"true"}, Timeout: 5 * time.Second}, io.Discard, io.Discard)
	cancel()
	e := spares.Entry{Session: sess.ID}
	if opts.Prestart != nil {
		pctx, cancel := context.WithTimeout(ctx, prestartTimeout)
		data, err := opts.Prestart(pctx, sess, a)
		cancel()
		if err != nil {
			b.log.Warn("spares: prestart failed; parking the sandbox without it", "session", sess.ID, "err", err)
		} else {
			e.Prestart = data
		}
	}
	e.Parked = time.Now()
	data, err := json.Marshal(e)
	if err != nil {
		return err
	}
	tmp := filepath.Join(SparesDir(b.opts.StateDir), ".tmp-"+sess.ID)
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(b.spareIndex(key), sess.ID)); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	b.log.Debug("spares: parked", "session", sess.ID, "key", key)
	return nil
}

// parkedSpares reads the key's index (newest first); entries it cannot read are skipped.
func (b *Backend) parkedSpares(key string) ([]spares.Entry, error) {
	return spares.Parked(b.opts.StateDir, key)
}

// takeSpare claims a parked spare's index entry: true when this process won it.
func (b *Backend) takeSpare(key, id, owner string) bool {
	return spares.Take(b.opts.StateDir, key, id, owner)
}

// retireSpare claims a parked spare and terminates it (filler: too old to hand out).
func (b *Backend) retireSpare(ctx context.Context, key, id, owner string) {
	if b.takeSpare(key, id, owner) {
		b.discardSpare(ctx, id)
	}
}

// discardSpare terminates a claimed spare that will not be used, logging failures: the next
// reconcile reaps what is left (its claimer, this process, will be gone).
func (b *Backend) discardSpare(ctx context.Context, id string) {
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := b.Terminate(tctx, id); err != nil {
		b.log.Warn("spares: terminating a spare failed", "session", id, "err", err)
	}
}

// ParkedSpares counts the parked spares of key.
func (b *Backend) ParkedSpares(key string) int {
	p, _ := b.parkedSpares(key)
	return len(p)
}

// reapableSpare reports whether a live sandbox found at reconcile is a spare nobody can ever
// use: claimed by a process that is gone, or never parked by a filler that is gone.
func (b *Backend) reapableSpare(dir string, rec *record) bool {
	key := rec.Spec.Labels[LabelSpare]
	if key == "" || checkSessionID(rec.ID) != nil {
		return false
	}
	// The index first: a claim moves the entry from there into dir, so looking in the other
	// order could miss it in both places.
	if _, err := os.Lstat(filepath.Join(b.spareIndex(key), rec.ID)); err == nil {
		return false
	}
	if owner, claimed := spares.Claimer(dir); claimed {
		if ownerAlive(owner) {
			return false
		}
		b.log.Info("reaping a claimed spare whose claimer is gone", "session", rec.ID, "owner", owner)
		return true
	}
	if ownerAlive(rec.Spec.Labels[LabelSpareFiller]) {
		return false // being made
	}
	b.log.Info("reaping a spare its filler never parked", "session", rec.ID, "filler", rec.Spec.Labels[LabelSpareFiller])
	return true
}

// sweepSpareIndex removes index entries whose session dir is gone (a spare that died parked
// and was reaped) and temporary files of fillers that are gone.
func (b *Backend) sweepSpareIndex() error {
	root := SparesDir(b.opts.StateDir)
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

// RetireSpares claims and terminates every parked spare in the state dir, whatever its
// template, and returns their session ids; with dryRun it only lists them.
func (b *Backend) RetireSpares(ctx context.Context, dryRun bool) ([]string, error) {
	keys, err := os.ReadDir(SparesDir(b.opts.StateDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	owner, err := spares.SelfOwner()
	if err != nil {
		return nil, err
	}
	var ids []string
	var errs []error
	for _, k := range keys {
		if !k.IsDir() {
			continue
		}
		parked, err := b.parkedSpares(k.Name())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, e := range parked {
			if dryRun {
				ids = append(ids, e.Session)
				continue
			}
			if !b.takeSpare(k.Name(), e.Session, owner) {
				continue // claimed meanwhile
			}
			if err := b.Terminate(ctx, e.Session); err != nil {
				errs = append(errs, fmt.Errorf("terminating spare %s: %w", e.Session, err))
				continue
			}
			ids = append(ids, e.Session)
		}
	}
	return ids, errors.Join(errs...)
}
