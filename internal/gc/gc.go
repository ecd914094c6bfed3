// Package gc reaps what killed airlock processes leave: empty airlock-* cgroups and stale session records.
package gc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/internal/kernfile"
	"github.com/airlock-sandbox/airlock/internal/statedir"
)

// Options say what to look at and what to spare.
type Options struct {
	// StateDirs are the local runtime's state dirs: their stale session records are reaped by
	// the backend's own reconcile, and every session they hold keeps its cgroups. A dir that
	// does not exist is skipped (never created).
	StateDirs []string
	// CgroupRoot defaults to kernfile.CgroupRoot.
	CgroupRoot string
	// Match picks the top-level cgroups to look at, by name; nil means "airlock-*". It can
	// only narrow that: a name without the prefix is never touched.
	Match func(name string) bool
	// KeepTops leaves the matched airlock-* cgroups themselves in place, only their children
	// go: a rootless user's airlock-user-<uid> is root's, delegated (docs/rootless.md).
	KeepTops bool
	// MinAge spares a cgroup tree changed more recently than this (a sandbox being created
	// has an empty cgroup for an instant).
	MinAge time.Duration
	// DryRun reports what would go and changes nothing.
	DryRun bool
	// Reconcile reaps one state dir's stale sessions and returns their ids; nil means
	// ReconcileLocal. Tests and the dry run never call it.
	Reconcile func(ctx context.Context, stateDir string) ([]string, error)
}

// Report is what was removed (or, in a dry run, would be).
type Report struct {
	DryRun bool `json:"dryRun"`
	// Sessions are stale session records, as "<state dir>/<session id>".
	Sessions []string `json:"sessions"`
	// Cgroups are cgroup directories, deepest first.
	Cgroups []string `json:"cgroups"`
	// Kept are airlock-* cgroups left in place, with why.
	Kept []string `json:"kept,omitempty"`
}

const prefix = "airlock-"

// Run reaps stale session records first (so their cgroups are gone or empty), then empty
// cgroup trees. Errors are collected; what could be done is done and reported.
func Run(ctx context.Context, o Options) (Report, error) {
	rep := Report{DryRun: o.DryRun, Sessions: []string{}, Cgroups: []string{}}
	var errs []error
	live := map[string]bool{}
	for _, sd := range o.StateDirs {
		if _, err := os.Stat(sd); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		var stale []string
		var err error
		if o.DryRun {
			stale, err = local.StaleSessions(sd)
		} else {
			rc := o.Reconcile
			if rc == nil {
				rc = ReconcileLocal
			}
			stale, err = rc(ctx, sd)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("state dir %s: %w", sd, err))
		}
		for _, id := range stale {
			rep.Sessions = append(rep.Sessions, filepath.Join(sd, id))
		}
		ids, err := sessionDirs(sd)
		if err != nil {
			errs = append(errs, err)
		}
		for _, id := range ids {
			if !o.DryRun || !slices.Contains(stale, id) {
				live[id] = true
			}
		}
	}
	err := reapCgroups(&rep, o, func(name string) bool { return live[name] })
	return rep, errors.Join(append(errs, err)...)
}

// ReconcileLocal runs the local runtime's own reconcile over stateDir (the work local.New
// does: adopt live sandboxes, reap broken ones and orphan cgroups under its parent) and
// returns the sessions it reaped, those before a failure included.
func ReconcileLocal(ctx context.Context, stateDir string) ([]string, error) {
	b, err := local.New(ctx, local.Options{StateDir: stateDir, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		var re *local.ReconcileError
		if errors.As(err, &re) {
			return re.Reaped, err
		}
		return nil, err
	}
	return b.Reaped(), b.Close()
}

func sessionDirs(stateDir string) ([]string, error) {
	entries, err := os.ReadDir(stateDir)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range entries {
		if e.IsDir() && statedir.CheckSessionID(e.Name()) == nil {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// hierarchies lists the mounted cgroup hierarchies under root: root itself when cgroup v2 is
// mounted there, else each directory of it that is a hierarchy (symlinked aliases once).
func hierarchies(root string) ([]string, error) {
	if isCgroupDir(root) {
		return []string{root}, nil
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	var out []string
	seen := map[string]bool{}
	for _, e := range entries {
		p := filepath.Join(root, e.Name())
		real, err := filepath.EvalSymlinks(p)
		if err != nil || seen[real] || !isCgroupDir(real) {
			continue
		}
		seen[real] = true
		out = append(out, real)
	}
	return out, nil
}

func isCgroupDir(p string) bool {
	_, err := os.Stat(filepath.Join(p, "cgroup.procs"))
	return err == nil
}

// reapCgroups removes, under every airlock-* cgroup (in every hierarchy), each child tree
// that holds no process in any hierarchy, names no live session and has not changed for
// MinAge; then the airlock-* cgroup itself once nothing is left in it. Removal is rmdir,
// which the kernel refuses for a cgroup with tasks or children, so a process that arrives
// after the check keeps its cgroup.
func reapCgroups(rep *Report, o Options, live func(string) bool) error {
	root := o.CgroupRoot
	if root == "" {
		root = kernfile.CgroupRoot
	}
	hs, err := hierarchies(root)
	if err != nil {
		return err
	}
	tops := map[string][]string{} // name → its directory in each hierarchy
	var names []string
	for _, h := range hs {
		entries, err := os.ReadDir(h)
		if err != nil {
			return err
		}
		for _, e := range entries {
			n := e.Name()
			if !e.IsDir() || !strings.HasPrefix(n, prefix) || (o.Match != nil && !o.Match(n)) {
				continue
			}
			if tops[n] == nil {
				names = append(names, n)
			}
			tops[n] = append(tops[n], filepath.Join(h, n))
		}
	}
	slices.Sort(names)
	now := time.Now()
	var errs []error
	for _, n := range names {
		dirs := tops[n]
		// Judged before its children go: removing them changes its mtime.
		topWhy := busy(dirs, false, true, o.MinAge, now)
		children := map[string][]string{}
		var cnames []string
		for _, d := range dirs {
			for _, c := range subdirs(d) {
				if children[c] == nil {
					cnames = append(cnames, c)
				}
				children[c] = append(children[c], filepath.Join(d, c))
			}
		}
		slices.Sort(cnames)
		left := false
		for _, c := range cnames {
			if why := busy(children[c], live(c), false, o.MinAge, now); why != "" {
				rep.Kept = append(rep.Kept, n+"/"+c+": "+why)
				left = true
				continue
			}
			removed, err := removeTrees(children[c], o.DryRun)
			rep.Cgroups = append(rep.Cgroups, removed...)
			if err != nil {
				errs = append(errs, err)
				left = true
			}
		}
		switch {
		case o.KeepTops:
			rep.Kept = append(rep.Kept, n+": kept (delegated)")
		case topWhy != "":
			rep.Kept = append(rep.Kept, n+": "+topWhy)
		case left:
			rep.Kept = append(rep.Kept, n+": holds cgroups that stay")
		default:
			removed, err := removeDirs(dirs, o.DryRun)
			rep.Cgroups = append(rep.Cgroups, removed...)
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func subdirs(d string) []string {
	entries, _ := os.ReadDir(d)
	var out []string
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out
}

// busy says why the trees at dirs (one cgroup in several hierarchies) must stay, or "": a
// live session, a process anywhere in them, or a change younger than minAge. With shallow,
// only the directories themselves are looked at. Anything unreadable counts as busy.
func busy(dirs []string, isLive, shallow bool, minAge time.Duration, now time.Time) string {
	if isLive {
		return "a session of a state dir"
	}
	for _, d := range dirs {
		why := ""
		err := filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !e.IsDir() {
				return nil
			}
			if shallow && p != d {
				return fs.SkipDir
			}
			procs, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			if err != nil {
				return err
			}
			if len(bytes.TrimSpace(procs)) > 0 {
				why = "has processes (" + p + ")"
				return fs.SkipAll
			}
			fi, err := e.Info()
			if err != nil {
				return err
			}
			if age := now.Sub(fi.ModTime()); minAge > 0 && age < minAge {
				why = fmt.Sprintf("changed %s ago (%s), under --min-age %s", age.Round(time.Second), p, minAge)
				return fs.SkipAll
			}
			return nil
		})
		if err != nil {
			return "unreadable: " + err.Error()
		}
		if why != "" {
			return why
		}
	}
	return ""
}

// removeTrees removes each tree bottom-up and returns what went, deepest first.
func removeTrees(dirs []string, dryRun bool) ([]string, error) {
	var all []string
	for _, d := range dirs {
		var tree []string
		filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				tree = append(tree, p)
			}
			return nil
		})
		slices.Reverse(tree) // children after their parent in walk order: reversed, deepest first
		all = append(all, tree...)
	}
	return removeDirs(all, dryRun)
}

// removeDirs rmdirs each directory in order; it stops at the first failure.
func removeDirs(dirs []string, dryRun bool) ([]string, error) {
	if dryRun {
		return dirs, nil
	}
	var done []string
	for _, d := range dirs {
		// ENOENT: the same hierarchy mounted twice (co-mounted controllers) already lost it.
		if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return done, fmt.Errorf("remove cgroup %s: %w", d, err)
		}
		done = append(done, d)
	}
	return done, nil
}
