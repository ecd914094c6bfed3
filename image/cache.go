//go:build linux

package image

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// DefaultIDCount is the size of the id range a sandbox maps when ResolveOptions.UIDBase is set.
const DefaultIDCount = 65536

// ResolveOptions tune how an image lands in the cache. Each distinct ownership mapping is its own
// cache entry, since the files on disk differ.
type ResolveOptions struct {
	// UIDBase is added to every uid and gid in the image: the local runtime maps sandbox ids
	// 0..65535 to host 100000..165535, so it unpacks with UIDBase 100000. Zero keeps the ids.
	UIDBase int
	// IDCount bounds the image ids accepted when UIDBase is set (default DefaultIDCount): a file
	// owned by an id the sandbox does not map is refused rather than left unowned.
	IDCount int
	// NoChown leaves every file owned by the caller, for a rootless runtime that maps the
	// caller to the sandbox's root. It cannot be combined with UIDBase.
	NoChown bool
	// Progress, if set, is called with layer bytes read so far (as stored: compressed for
	// compressed layers) and their total, while unpacking.
	Progress func(done, total int64)
	Logger   *slog.Logger

	// onUnpack, for tests, is called when a cache miss starts unpacking.
	onUnpack func(key string)
}

// CacheEntry describes one unpacked root filesystem, stored next to it as <Dir>.json.
type CacheEntry struct {
	// Key names the entry: the config digest's hex, plus the ownership variant.
	Key string `json:"key"`
	// Digest is the image config digest ("sha256:..."), which commits to every layer.
	Digest  string    `json:"digest"`
	Source  string    `json:"source"`
	UIDBase int       `json:"uidBase,omitempty"`
	NoChown bool      `json:"noChown,omitempty"`
	Created time.Time `json:"created"`
	// Files and Bytes count what was unpacked; SkippedDevices the device nodes and fifos dropped.
	Files          int         `json:"files"`
	Bytes          int64       `json:"bytes"`
	SkippedDevices int         `json:"skippedDevices,omitempty"`
	Config         ImageConfig `json:"config"`
	// Dir is the root filesystem directory (not stored; derived from where the entry lives).
	Dir string `json:"-"`
}

// Resolve returns a read-only unpacked root filesystem directory for an OCI source (spec.Image
// with OCILayout, Tarball or Ref set), with the image's own ids. Layers are unpacked once into a
// content-addressed cache under cacheDir, keyed by the image config digest; a second Resolve of
// the same image is a cache hit with no unpacking. progress (may be nil) is called with bytes
// done/total while unpacking.
//
// Callers must not write into the returned directory: mount it read-only or as an overlay's
// lower layer.
func Resolve(ctx context.Context, src spec.Image, cacheDir string, progress func(done, total int64)) (string, error) {
	return ResolveWith(ctx, src, cacheDir, ResolveOptions{Progress: progress})
}

// ResolveWith is Resolve with options: ownership mapping (see ResolveOptions), progress, logger.
//
// While unpacking: paths are confined to the new root (absolute names, ".." and writes through
// symlinks are refused as sandbox.ErrInvalid naming the entry); OCI whiteouts and opaque
// directories are applied layer by layer; modes, symlinks, hard links and mtimes are kept;
// setuid/setgid bits, extended attributes (file capabilities included) and device nodes are
// dropped. Every layer's content is checked against the config's diff_ids. The tree is built in
// a temporary directory and renamed into place when complete, under a per-image lock, so a crash
// never leaves a partial entry and concurrent resolvers unpack once.
func ResolveWith(ctx context.Context, src spec.Image, cacheDir string, opts ResolveOptions) (string, error) {
	base, err := rootfsBase(cacheDir, opts)
	if err != nil {
		return "", err
	}
	s, err := load(ctx, src)
	if err != nil {
		return "", err
	}
	return resolve(ctx, s, base, opts)
}

// rootfsBase checks opts and cacheDir before any image is read, and returns the absolute
// directory that holds the cache's root filesystems.
func rootfsBase(cacheDir string, opts ResolveOptions) (string, error) {
	if err := opts.validate(); err != nil {
		return "", err
	}
	if cacheDir == "" {
		return "", fmt.Errorf("%w: image cache directory is empty", sandbox.ErrInvalid)
	}
	cacheDir, err := filepath.Abs(cacheDir)
	if err != nil {
		return "", err
	}
	return filepath.Join(cacheDir, "rootfs"), nil
}

// resolve returns the cache entry of s under base (from rootfsBase), unpacking it on a miss
// under the key's lock: ResolveWith and ResolveImage share it.
func resolve(ctx context.Context, s *source, base string, opts ResolveOptions) (string, error) {
	cfgName, err := s.img.ConfigName()
	if err != nil {
		return "", s.fail(err, "config digest")
	}
	key := opts.key(cfgName)
	dir := filepath.Join(base, key)
	if isDir(dir) {
		return dir, nil
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return "", fmt.Errorf("image cache: %w", err)
	}
	unlock, err := lockKey(ctx, base, key, true)
	if err != nil {
		return "", err
	}
	defer unlock()
	if isDir(dir) {
		return dir, nil // another resolver finished while we waited
	}
	if err := checkPlatform(s); err != nil {
		return "", err
	}
	if opts.onUnpack != nil {
		opts.onUnpack(key)
	}
	if err := unpack(ctx, s, cfgName, base, key, opts); err != nil {
		return "", err
	}
	return dir, nil
}

func (o *ResolveOptions) validate() error {
	switch {
	case o.UIDBase < 0:
		return fmt.Errorf("%w: ResolveOptions.UIDBase %d is negative", sandbox.ErrInvalid, o.UIDBase)
	case o.IDCount < 0:
		return fmt.Errorf("%w: ResolveOptions.IDCount %d is negative", sandbox.ErrInvalid, o.IDCount)
	case o.NoChown && o.UIDBase != 0:
		return fmt.Errorf("%w: ResolveOptions.NoChown cannot be combined with UIDBase %d", sandbox.ErrInvalid, o.UIDBase)
	}
	return nil
}

func (o *ResolveOptions) key(cfg v1.Hash) string {
	switch {
	case o.NoChown:
		return cfg.Hex + "-nochown"
	case o.UIDBase != 0:
		return cfg.Hex + "-u" + strconv.Itoa(o.UIDBase)
	}
	return cfg.Hex
}

func (o *ResolveOptions) extractOptions() extractOptions {
	eo := extractOptions{chown: !o.NoChown, idBase: o.UIDBase, log: o.Logger}
	if o.UIDBase != 0 {
		eo.idCount = o.IDCount
		if eo.idCount == 0 {
			eo.idCount = DefaultIDCount
		}
	}
	return eo
}

func isDir(p string) bool {
	fi, err := os.Lstat(p)
	return err == nil && fi.IsDir()
}

// lockKey takes the per-image lock file. Prune deletes lock files while holding them, so after
// locking we check the path still names the file we hold, and retry if not.
func lockKey(ctx context.Context, base, key string, wait bool) (func(), error) {
	p := filepath.Join(base, key+".lock")
	for {
		f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("image cache lock: %w", err)
		}
		for {
			err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
			if err == nil || !errors.Is(err, unix.EWOULDBLOCK) {
				break
			}
			if !wait {
				f.Close()
				return nil, errBusy
			}
			select {
			case <-ctx.Done():
				f.Close()
				return nil, ctx.Err()
			case <-time.After(25 * time.Millisecond):
			}
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("image cache lock %s: %w", p, err)
		}
		held, err1 := f.Stat()
		now, err2 := os.Stat(p)
		if err1 == nil && err2 == nil && os.SameFile(held, now) {
			return func() { f.Close() }, nil
		}
		f.Close()
	}
}

var errBusy = errors.New("locked by another process")

// counter reports progress, at most every 256 KiB.
type counter struct {
	done, total, last int64
	fn                func(done, total int64)
}

func (c *counter) add(n int) {
	c.done += int64(n)
	if c.fn != nil && c.done-c.last >= 256<<10 {
		c.report()
	}
}

func (c *counter) report() {
	if c.fn != nil {
		c.last = c.done
		c.fn(c.done, c.total)
	}
}

type countingReader struct {
	io.ReadCloser
	c *counter
}

func (r *countingReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	r.c.add(n)
	return n, err
}

// countedLayer counts the stored (compressed) bytes; partial.CompressedToLayer then decompresses
// them, so progress follows what is actually read from disk or network.
type countedLayer struct {
	v1.Layer
	c *counter
}

func (l countedLayer) Compressed() (io.ReadCloser, error) {
	rc, err := l.Layer.Compressed()
	if err != nil {
		return nil, err
	}
	return &countingReader{rc, l.c}, nil
}

func openLayer(s *source, i int, l v1.Layer, c *counter) (io.ReadCloser, error) {
	if s.stored != nil && !s.stored[i].compressed {
		rc, err := l.Uncompressed()
		if err != nil {
			return nil, err
		}
		return &countingReader{rc, c}, nil
	}
	cl, err := partial.CompressedToLayer(countedLayer{l, c})
	if err != nil {
		return nil, err
	}
	return cl.Uncompressed()
}

func unpack(ctx context.Context, s *source, cfgName v1.Hash, base, key string, opts ResolveOptions) (err error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	removeStale(base, key)
	tmp, err := os.MkdirTemp(base, ".tmp-"+key+"-")
	if err != nil {
		return fmt.Errorf("image cache: %w", err)
	}
	defer func() {
		if err != nil {
			if rerr := forceRemoveAll(tmp); rerr != nil {
				log.Warn("image cache: removing failed unpack", "dir", tmp, "err", rerr)
			}
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}

	raw, err := s.img.RawConfigFile()
	if err != nil {
		return s.fail(err, "config")
	}
	if h, _, _ := v1.SHA256(bytes.NewReader(raw)); h != cfgName {
		return fmt.Errorf("%w: %s: config content is %s, manifest says %s", sandbox.ErrInvalid, s.desc, h, cfgName)
	}
	cf, err := s.img.ConfigFile()
	if err != nil {
		return fmt.Errorf("%w: %s: config: %v", sandbox.ErrInvalid, s.desc, err)
	}
	layers, err := s.img.Layers()
	if err != nil {
		return s.fail(err, "layers")
	}
	if len(layers) != len(cf.RootFS.DiffIDs) {
		return fmt.Errorf("%w: %s: %d layers but config lists %d diff_ids", sandbox.ErrInvalid, s.desc, len(layers), len(cf.RootFS.DiffIDs))
	}
	if s.stored != nil && len(s.stored) != len(layers) {
		return fmt.Errorf("%w: %s: archive lists %d layers, image has %d", sandbox.ErrInvalid, s.desc, len(s.stored), len(layers))
	}
	c := &counter{fn: opts.Progress}
	for i, l := range layers {
		if s.stored != nil {
			c.total += s.stored[i].size
			continue
		}
		n, err := l.Size()
		if err != nil {
			return s.fail(err, "layer %d size", i)
		}
		c.total += n
	}
	c.report()

	x, err := newExtractor(tmp, opts.extractOptions())
	if err != nil {
		return err
	}
	defer x.close()
	for i, l := range layers {
		if err := applyVerified(ctx, s, x, i, l, cf.RootFS.DiffIDs[i], c); err != nil {
			return err
		}
	}
	if err := x.finalize(); err != nil {
		return err
	}
	c.report()
	if x.stats.Skipped > 0 {
		log.Info("image: skipped device nodes and fifos (the runtime provides /dev)", "image", s.desc, "count", x.stats.Skipped)
	}

	icfg, err := Config(s.img)
	if err != nil {
		return err
	}
	entry := CacheEntry{
		Key: key, Digest: cfgName.String(), Source: s.desc, UIDBase: opts.UIDBase, NoChown: opts.NoChown,
		Created: time.Now().UTC(), Files: x.stats.Files, Bytes: x.stats.Bytes, SkippedDevices: x.stats.Skipped,
		Config: icfg,
	}
	return publish(base, key, tmp, entry)
}

func applyVerified(ctx context.Context, s *source, x *extractor, i int, l v1.Layer, want v1.Hash, c *counter) error {
	rc, err := openLayer(s, i, l, c)
	if err != nil {
		return s.fail(err, "layer %d", i)
	}
	defer rc.Close()
	// A failed read surfaces from the tar reader as a format error; keep the read error itself
	// so a registry that went away is reported as unreachable, not as a malformed image.
	src := &trackingReader{r: rc}
	h, err := v1.Hasher(want.Algorithm)
	if err != nil {
		return fmt.Errorf("%w: %s: layer %d diff_id %s: %v", sandbox.ErrInvalid, s.desc, i, want, err)
	}
	r := io.TeeReader(src, h)
	if err := x.applyLayer(ctx, r); err != nil {
		if src.err != nil {
			return s.fail(src.err, "layer %d", i)
		}
		return fmt.Errorf("%s: layer %d: %w", s.desc, i, err)
	}
	// Anything after the tar's end marker still counts toward the digest.
	if _, err := io.Copy(io.Discard, r); err != nil {
		return s.fail(err, "layer %d", i)
	}
	got := v1.Hash{Algorithm: want.Algorithm, Hex: fmt.Sprintf("%x", h.Sum(nil))}
	if got != want {
		return fmt.Errorf("%w: %s: layer %d content is %s, config says %s", sandbox.ErrInvalid, s.desc, i, got, want)
	}
	return nil
}

type trackingReader struct {
	r   io.Reader
	err error
}

func (t *trackingReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if err != nil && err != io.EOF && t.err == nil {
		t.err = err
	}
	return n, err
}

// publish makes the entry visible: metadata first, then the tree by rename, so a directory at
// its final name is always complete and always has its metadata.
func publish(base, key, tmp string, entry CacheEntry) error {
	b, err := json.MarshalIndent(entry, "", "  ")
	if err != nil {
		return err
	}
	metaTmp := filepath.Join(base, ".meta-"+key+".json")
	if err := os.WriteFile(metaTmp, b, 0o644); err != nil {
		return fmt.Errorf("image cache: %w", err)
	}
	if err := os.Rename(metaTmp, filepath.Join(base, key+".json")); err != nil {
		return fmt.Errorf("image cache: %w", err)
	}
	// One syncfs instead of an fsync per file: the rename must not reach the disk before the
	// tree does, or a power loss could leave a complete-looking entry with empty files.
	if d, err := os.Open(tmp); err == nil {
		serr := unix.Syncfs(int(d.Fd()))
		d.Close()
		if serr != nil {
			return fmt.Errorf("image cache: syncfs: %w", serr)
		}
	}
	if err := os.Rename(tmp, filepath.Join(base, key)); err != nil {
		return fmt.Errorf("image cache: publishing %s: %w", key, err)
	}
	if d, err := os.Open(base); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// removeStale deletes leftovers of earlier unpacks of key; the caller holds key's lock, so no
// live unpack owns them.
func removeStale(base, key string) {
	m, _ := filepath.Glob(filepath.Join(base, ".tmp-"+key+"-*"))
	for _, p := range m {
		// The glob also matches other variants' keys ("<hex>-u100000"); only a purely numeric
		// suffix (os.MkdirTemp's) belongs to this key.
		if _, err := strconv.ParseUint(strings.TrimPrefix(filepath.Base(p), ".tmp-"+key+"-"), 10, 64); err == nil {
			forceRemoveAll(p)
		}
	}
	os.Remove(filepath.Join(base, ".meta-"+key+".json"))
}

// forceRemoveAll removes a tree even where unpacked directories are read-only to a non-root caller.
func forceRemoveAll(p string) error {
	err := os.RemoveAll(p)
	if err == nil || !errors.Is(err, fs.ErrPermission) {
		return err
	}
	filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(q, 0o700)
		}
		return nil
	})
	return os.RemoveAll(p)
}

// Inspect returns the metadata of a root filesystem directory that Resolve returned.
func Inspect(rootfsDir string) (CacheEntry, error) {
	rootfsDir = filepath.Clean(rootfsDir)
	b, err := os.ReadFile(rootfsDir + ".json")
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return CacheEntry{}, fmt.Errorf("%w: %s is not an image cache entry", sandbox.ErrNotFound, rootfsDir)
		}
		return CacheEntry{}, err
	}
	var e CacheEntry
	if err := json.Unmarshal(b, &e); err != nil {
		return CacheEntry{}, fmt.Errorf("%w: cache metadata %s.json: %v", sandbox.ErrInvalid, rootfsDir, err)
	}
	e.Dir = rootfsDir
	return e, nil
}

// List returns the complete entries in cacheDir, ordered by key. A missing cache is empty.
func List(cacheDir string) ([]CacheEntry, error) {
	base := filepath.Join(cacheDir, "rootfs")
	ents, err := os.ReadDir(base)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []CacheEntry
	for _, d := range ents {
		if !d.IsDir() || strings.HasPrefix(d.Name(), ".") {
			continue
		}
		e, err := Inspect(filepath.Join(base, d.Name()))
		if err != nil {
			continue // not ours
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// Prune removes every entry of cacheDir not named in keep, plus leftovers of crashed unpacks.
// keep items are entry keys, config digests ("sha256:<hex>" or "<hex>", matching every ownership
// variant), or directories returned by Resolve. Entries being unpacked right now are left alone.
// Removing an entry a running sandbox still uses is the caller's mistake to avoid.
func Prune(cacheDir string, keep []string) error {
	base, err := filepath.Abs(filepath.Join(cacheDir, "rootfs"))
	if err != nil {
		return err
	}
	ents, err := os.ReadDir(base)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	keepSet := map[string]bool{}
	for _, k := range keep {
		keepSet[k] = true
		keepSet[strings.TrimPrefix(k, "sha256:")] = true
		if filepath.IsAbs(k) {
			keepSet[filepath.Clean(k)] = true
		}
	}
	kept := func(key string) bool {
		hex, _, _ := strings.Cut(key, "-")
		return keepSet[key] || keepSet[hex] || keepSet[filepath.Join(base, key)]
	}
	keys := map[string]bool{}
	var stale []string
	for _, d := range ents {
		n := d.Name()
		switch {
		case strings.HasPrefix(n, ".trash-"):
			stale = append(stale, n)
		case strings.HasPrefix(n, ".tmp-"):
			if k, _, ok := cutLast(strings.TrimPrefix(n, ".tmp-"), "-"); ok {
				keys[k] = true
			}
		case strings.HasPrefix(n, ".meta-") && strings.HasSuffix(n, ".json"):
			keys[strings.TrimSuffix(strings.TrimPrefix(n, ".meta-"), ".json")] = true
		case strings.HasPrefix(n, "."):
		case d.IsDir():
			keys[n] = true
		case strings.HasSuffix(n, ".json"):
			keys[strings.TrimSuffix(n, ".json")] = true
		case strings.HasSuffix(n, ".lock"):
			keys[strings.TrimSuffix(n, ".lock")] = true
		}
	}
	var errs []error
	for key := range keys {
		unlock, err := lockKey(context.Background(), base, key, false)
		if errors.Is(err, errBusy) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		removeStale(base, key)
		if !kept(key) {
			errs = append(errs, removeEntry(base, key))
		}
		unlock()
	}
	for _, n := range stale {
		errs = append(errs, forceRemoveAll(filepath.Join(base, n)))
	}
	return errors.Join(errs...)
}

// removeEntry unpublishes an entry (rename away first, so no reader sees a half-deleted tree),
// then deletes it. The caller holds the key's lock.
func removeEntry(base, key string) error {
	dir := filepath.Join(base, key)
	var errs []error
	if isDir(dir) {
		trash, err := os.MkdirTemp(base, ".trash-"+key+"-")
		if err != nil {
			return err
		}
		if err := os.Rename(dir, filepath.Join(trash, "root")); err != nil {
			os.Remove(trash)
			return fmt.Errorf("image cache: removing %s: %w", key, err)
		}
		errs = append(errs, forceRemoveAll(trash))
	}
	for _, suffix := range []string{".json", ".lock"} {
		if err := os.Remove(filepath.Join(base, key+suffix)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func cutLast(s, sep string) (string, string, bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}
