package local

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/backend/local/nsinit"
	"github.com/airlock-sandbox/airlock/backend/local/sessions"
	"github.com/airlock-sandbox/airlock/spec"
)

// A host-image sandbox sees a generated /etc: the chosen host files (sessions.HostEtc) and the
// runtime's own (nsinit.GeneratedEtc). Bound entry by entry that was ~25 bind mounts (and as
// many mount_setattr calls) per sandbox, built and torn down each time. Instead the host copies
// them once into a directory under the state dir and every sandbox binds that one directory
// read-only. A copy is rebuilt as soon as any source changes: each create compares the
// sources' identity (device, inode, mode, size, mtime, ctime) with the copy's manifest, so a
// new sandbox never sees stale files. Symlinks inside a copied directory are not compared one
// by one: replacing or adding one changes its directory, which is. The manifest and the check
// are package parked sandboxes' (a claimer checks a parked sandbox's copy without this package).

// etcCacheDir is the state dir's subdirectory that holds the copies.
const etcCacheDir = sessions.EtcCacheDir

// etcFormat versions the copy's layout: a change here rebuilds every copy. 2: files keep
// their modification times.
const etcFormat = "2"

// etcCache finds or builds the /etc copy for a workdir (the sandbox user's home is in passwd).
type etcCache struct {
	dir   string          // <state dir>/etc
	src   string          // the host's /etc
	names func() []string // the entries of src to copy (sessions.HostEtc)

	mu    sync.Mutex
	known map[string]*sessions.EtcManifest // by workdir
	// names() as last listed, and src's identity then: listing /etc (sessions.HostEtc globs
	// /etc/python3.*) was half of a create's freshness check, and adding, removing or renaming
	// an entry there changes the directory, so it is listed again only then.
	namesID  string
	namesMem []string
}

func newEtcCache(stateDir string) *etcCache {
	return &etcCache{dir: filepath.Join(stateDir, etcCacheDir), src: "/etc", names: sessions.HostEtc, known: map[string]*sessions.EtcManifest{}}
}

// get returns the host path of an up-to-date /etc copy for workdir, building one if needed.
func (c *etcCache) get(workdir string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	names := c.hostNames()
	m := c.known[workdir]
	if m == nil {
		m = c.readManifest(workdir)
	}
	if m != nil && m.Fresh(workdir, names) {
		if _, err := os.Lstat(filepath.Join(c.dir, m.Dir)); err == nil {
			c.known[workdir] = m
			return filepath.Join(c.dir, m.Dir), nil
		}
	}
	m, err := c.build(workdir, names)
	if err != nil {
		return "", fmt.Errorf("prepare /etc for host-image sandboxes: %w", err)
	}
	c.known[workdir] = m
	return filepath.Join(c.dir, m.Dir), nil
}

// hostNames returns c.names(), listed again only when c.src changed since the last listing
// (its identity is read before listing, so a change during the listing lists again next time).
// Called with c.mu held.
func (c *etcCache) hostNames() []string {
	id := sessions.SourceID(c.src)
	if id != "" && id == c.namesID {
		return c.namesMem
	}
	c.namesID, c.namesMem = id, c.names()
	return c.namesMem
}

func (c *etcCache) manifestPath(workdir string) string {
	return sessions.EtcManifestPath(c.dir, workdir)
}

func (c *etcCache) readManifest(workdir string) *sessions.EtcManifest {
	return sessions.ReadEtcManifest(c.dir, workdir)
}

// build copies the sources into a new directory, named by what it was made from, and records
// the manifest. Another process building the same copy at the same time is harmless: the first
// rename wins and the other copy is dropped.
func (c *etcCache) build(workdir string, names []string) (*sessions.EtcManifest, error) {
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return nil, err
	}
	if err := os.Chmod(c.dir, 0o755); err != nil { // umask
		return nil, err
	}
	tmp, err := os.MkdirTemp(c.dir, "tmp-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp) // a no-op once renamed
	m := &sessions.EtcManifest{Workdir: workdir, Names: names}
	for _, name := range names {
		src := filepath.Join(c.src, name)
		if err := copyEtcEntry(src, filepath.Join(tmp, name), &m.Sources); err != nil {
			return nil, err
		}
	}
	for name, content := range nsinit.GeneratedEtc(nil, nil, workdir) {
		if err := writeFileMode(filepath.Join(tmp, name), content, 0o644); err != nil {
			return nil, err
		}
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00", etcFormat, workdir)
	for _, s := range m.Sources {
		fmt.Fprintf(h, "%s\x00%s\x00", s.Path, s.ID)
	}
	m.Dir = "v" + etcFormat + "-" + hex.EncodeToString(h.Sum(nil)[:8])
	final := filepath.Join(c.dir, m.Dir)
	if err := os.Rename(tmp, final); err != nil {
		if _, serr := os.Lstat(filepath.Join(final, "passwd")); serr != nil {
			return nil, err
		}
		// Built by someone else meanwhile.
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	mp := c.manifestPath(workdir)
	if err := writeFileMode(mp+".tmp", b, 0o644); err != nil {
		return nil, err
	}
	if err := os.Rename(mp+".tmp", mp); err != nil {
		return nil, err
	}
	return m, nil
}

// copyEtcEntry copies src to dst the way a read-only bind would show it: symlinks as
// symlinks, regular files with their permission bits (owned by root, so what the sandbox's
// users may read is unchanged: the host owner is unmapped there either way), directories
// recursively; other file types are left out. Every directory and regular file is recorded in
// sources; so is src itself, even when absent (its appearing is a change).
func copyEtcEntry(src, dst string, sources *[]sessions.EtcSource) error {
	_, err := os.Lstat(src)
	if errors.Is(err, fs.ErrNotExist) {
		*sources = append(*sources, sessions.EtcSource{Path: src})
		return nil
	}
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	top := true
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		record := func() { *sources = append(*sources, sessions.EtcSource{Path: p, ID: sessions.SourceID(p)}) }
		mode := info.Mode()
		switch {
		case mode&fs.ModeSymlink != 0:
			if top {
				record() // a top-level symlink is replaced in /etc, which is not compared
			}
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			top = false
			return os.Symlink(link, target)
		case mode.IsDir():
			record()
			top = false
			if err := os.Mkdir(target, 0o700); err != nil {
				return err
			}
			return os.Chmod(target, mode.Perm())
		case mode.IsRegular():
			record()
			top = false
			return copyEtcFile(p, target, mode.Perm(), info.ModTime())
		}
		top = false
		return nil
	})
}

// copyEtcFile copies one file with its permission bits and its modification time: a bind
// shows the host's, and what reads /etc may compare it (python recompiles a module whose
// source is newer than its cached bytecode on every start, e.g. sitecustomize.py, which
// Debian links into /etc, when the read-only /usr keeps it from writing the new cache).
func copyEtcFile(src, dst string, perm fs.FileMode, mtime time.Time) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Chmod(perm); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Chtimes(dst, time.Time{}, mtime) // access time left as it is
}

// gc removes the copies no manifest names and no live sandbox uses (inUse: names), and
// builds left half done. Call it only under the state dir's exclusive lock: no create is
// building then.
func (c *etcCache) gc(inUse map[string]bool) error {
	entries, err := os.ReadDir(c.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, e := range entries {
		if filepath.Ext(e.Name()) != ".json" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(c.dir, e.Name()))
		if err != nil {
			return err
		}
		var m sessions.EtcManifest
		if json.Unmarshal(b, &m) == nil {
			keep[m.Dir] = true
		}
	}
	var errs []error
	for _, e := range entries {
		if !e.IsDir() || keep[e.Name()] || inUse[e.Name()] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(c.dir, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func writeFileMode(p string, b []byte, perm fs.FileMode) error {
	if err := os.WriteFile(p, b, perm); err != nil {
		return err
	}
	return os.Chmod(p, perm) // umask
}

// etcCurrent refuses a pooled host-image sandbox (made ahead) whose /etc copy is no
// longer the host's: a sandbox created now would get a new copy, and one handed out must not
// show older files than that.
func (b *Backend) etcCurrent(s *session) error {
	rec := &s.rec
	if rec.EtcDir == "" {
		return nil
	}
	workdir := rec.Spec.Workdir
	if workdir == "" {
		workdir = spec.DefaultWorkdir // sessions.DefaultWorkdir
	}
	cur, err := b.etc.get(workdir)
	if err != nil {
		return err
	}
	if filepath.Base(cur) != rec.EtcDir {
		return fmt.Errorf("its /etc copy %s is stale (now %s)", rec.EtcDir, filepath.Base(cur))
	}
	return nil
}
