package local

// Snapshots (capability snapshot).
//
// What is captured: the sandbox's whole writable layer, which is one tmpfs (the disk limit):
// the workdir and /tmp. Nothing else in a native sandbox is writable except /dev/shm (not
// captured: shared memory of running processes, not files) and the runtime's own
// /.airlock. The layer keeps directories (empty ones too), regular files, symlinks (never
// followed: their targets are stored as written), hard links within the layer, permission
// and sticky bits, ownership mapped back to the sandbox's ids, and mtimes to the second.
// Sockets, fifos and device nodes are skipped; setuid/setgid bits and extended attributes are
// dropped, as on image unpack.
//
// Consistency: the sandbox is frozen (the cgroup freezer of pause.go) while its files are
// read and thawed right after; a sandbox the caller had paused stays paused. Processes keep
// running state (memory, open files) that a snapshot does not hold: a snapshot is files only.
//
// Storage: an OCI image per snapshot, its base image's layers plus the snapshot layer, in
// one OCI layout under <ImageCacheDir>/snapshots (image.SnapshotStore), so a snapshot can be
// exported with any OCI tool. A host or directory base has no image: the snapshot image is
// the layer alone and its record names the base (a directory base is referenced, not copied).
//
// A new sandbox from a snapshot (spec image.snapshot) runs on the snapshot's base and starts
// with the snapshot's files: the host remaps the layer (workdir content into the new
// sandbox's workdir, /tmp into /tmp) into a tar in the session directory, and the sandbox's
// init unpacks it into its tmpfs before the agent starts (nsinit/restore.go), as the
// sandbox's root, so ownership is the sandbox's own. A snapshot larger than the new sandbox's
// disk limit fails the create. Deleting a snapshot does not touch sandboxes made from it.

import (
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/backend/local/nsinit"
	"github.com/airlock-sandbox/airlock/backend/local/pause"
	"github.com/airlock-sandbox/airlock/image"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

var _ sandbox.Snapshotter = (*Backend)(nil)

// MaxFork bounds how many sandboxes one Fork makes.
const MaxFork = 64

const (
	// snapshotBaseFile, in a session directory, records the base of a sandbox made from a
	// snapshot, so that it can be snapshotted in turn after that snapshot is deleted.
	snapshotBaseFile = "snapshot-base.json"
	// restoreFile, in a session directory, is the remapped layer init unpacks.
	restoreFile = "restore.tar"
)

func (b *Backend) snapshotStore() (*image.SnapshotStore, error) {
	return image.OpenSnapshotStore(filepath.Join(b.opts.ImageCacheDir, "snapshots"))
}

// Snapshot captures the session's writable layer as the snapshot name (1 to 64 letters,
// digits, '_' and '-'; sandbox.ErrConflict if taken).
func (b *Backend) Snapshot(ctx context.Context, sessionID, name string) (sandbox.SnapshotInfo, error) {
	snap, err := b.snapshot(ctx, sessionID, name)
	if err != nil {
		return sandbox.SnapshotInfo{}, err
	}
	return snapshotInfo(snap), nil
}

// snapshotInfo is what the contract says of a stored snapshot.
func snapshotInfo(s image.Snapshot) sandbox.SnapshotInfo {
	return sandbox.SnapshotInfo{
		Name: s.Name, CreatedAt: s.CreatedAt, SessionID: s.SessionID, SandboxID: s.SandboxID,
		Base: s.Base.Kind, Digest: s.Digest, Size: s.Size, Files: s.Stats.Files,
	}
}

// snapshot is Snapshot with the store's whole record.
func (b *Backend) snapshot(ctx context.Context, sessionID, name string) (image.Snapshot, error) {
	if err := image.CheckSnapshotName(name); err != nil {
		return image.Snapshot{}, err
	}
	s, err := b.lookup(ctx, sessionID)
	if err != nil {
		return image.Snapshot{}, err
	}
	if s.rec.Runtime != "" {
		return image.Snapshot{}, fmt.Errorf("%w: snapshots of %s sandboxes are not implemented (native only)", sandbox.ErrUnsupported, s.rec.Runtime)
	}
	store, err := b.snapshotStore()
	if err != nil {
		return image.Snapshot{}, err
	}
	if _, err := store.Get(name); err == nil {
		return image.Snapshot{}, fmt.Errorf("%w: snapshot %q already exists", sandbox.ErrConflict, name)
	}
	base, baseImg, err := b.snapshotBase(ctx, s, store)
	if err != nil {
		return image.Snapshot{}, err
	}
	raw, err := os.CreateTemp(store.Dir(), ".capture-*.tar")
	if err != nil {
		return image.Snapshot{}, err
	}
	defer os.Remove(raw.Name())
	defer raw.Close()
	stats, err := b.capture(ctx, s, raw)
	if err != nil {
		return image.Snapshot{}, err
	}
	// Compressed once, after the sandbox runs again.
	gzPath := raw.Name() + ".gz"
	defer os.Remove(gzPath)
	if err := gzipFile(raw, gzPath); err != nil {
		return image.Snapshot{}, err
	}
	workdir := s.rec.Spec.Workdir
	if workdir == "" {
		workdir = spec.DefaultWorkdir
	}
	info, err := store.Put(ctx, image.Snapshot{
		Name: name, SessionID: s.rec.ID, SandboxID: s.rec.SandboxID, Workdir: workdir, Base: base, Stats: stats,
	}, baseImg, gzPath)
	if err != nil {
		return image.Snapshot{}, err
	}
	b.log.Debug("snapshot taken", "session", sessionID, "snapshot", name, "files", stats.Files, "bytes", stats.Bytes)
	return info, nil
}

// capture writes the sandbox's writable layer to w (uncompressed), the sandbox frozen meanwhile.
func (b *Backend) capture(ctx context.Context, s *session, w io.Writer) (image.LayerStats, error) {
	var stats image.LayerStats
	// Under the session's lock: no pause, resume or terminate while the files are read.
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone || s.exited() {
		return stats, fmt.Errorf("%w: session %s has ended", sandbox.ErrNotFound, s.rec.ID)
	}
	fz := s.freezer()
	wasPaused, err := fz.Paused()
	if err != nil {
		return stats, fmt.Errorf("%w: session %s: its cgroup is gone: %v", sandbox.ErrNotFound, s.rec.ID, err)
	}
	if !wasPaused {
		if err := setFrozen(ctx, fz, true); err != nil {
			tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pause.Timeout)
			defer cancel()
			if terr := setFrozen(tctx, fz, false); terr != nil {
				return stats, fmt.Errorf("%w: snapshot %s: freeze: %v (and thawing again failed: %v)", sandbox.ErrOutcomeUnknown, s.rec.ID, err, terr)
			}
			return stats, fmt.Errorf("snapshot %s: freeze: %w", s.rec.ID, err)
		}
	}
	stats, cerr := b.readWritable(ctx, s, w)
	if !wasPaused {
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pause.Timeout)
		defer cancel()
		if err := setFrozen(tctx, fz, false); err != nil {
			return stats, fmt.Errorf("%w: snapshot %s: thaw after capture: %v", sandbox.ErrOutcomeUnknown, s.rec.ID, err)
		}
	}
	return stats, cerr
}

// readWritable opens the sandbox's writable tmpfs through its init's root (never following a
// symlink on the way) and writes the layer: the workdir's content at the workdir's path, /tmp
// at tmp.
func (b *Backend) readWritable(ctx context.Context, s *session, w io.Writer) (image.LayerStats, error) {
	pid := s.rec.InitPID
	root, err := os.Open(fmt.Sprintf("/proc/%d/root", pid))
	if err != nil {
		return image.LayerStats{}, fmt.Errorf("%w: session %s: %v", sandbox.ErrNotFound, s.rec.ID, err)
	}
	defer root.Close()
	// The root was opened through the pid: it is the sandbox's only if init is still the
	// process that started at InitStart.
	if !alive(pid, s.rec.InitStart) {
		return image.LayerStats{}, fmt.Errorf("%w: session %s has ended", sandbox.ErrNotFound, s.rec.ID)
	}
	rwfd, err := unix.Openat2(int(root.Fd()), strings.TrimPrefix(nsinit.RWDir, "/"), &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return image.LayerStats{}, fmt.Errorf("%w: session %s: open its writable layer: %v", sandbox.ErrRefused, s.rec.ID, err)
	}
	rw := os.NewFile(uintptr(rwfd), nsinit.RWDir)
	defer rw.Close()
	var fst unix.Statfs_t
	if err := unix.Fstatfs(rwfd, &fst); err != nil || fst.Type != unix.TMPFS_MAGIC {
		return image.LayerStats{}, fmt.Errorf("%w: session %s: %s is not the sandbox's tmpfs", sandbox.ErrRefused, s.rec.ID, nsinit.RWDir)
	}
	workdir := s.rec.Spec.Workdir
	if workdir == "" {
		workdir = spec.DefaultWorkdir
	}
	return image.WriteLayer(ctx, w, rw, []image.LayerSource{
		{Path: "workspace", Name: strings.TrimPrefix(workdir, "/")},
		{Path: "tmp", Name: "tmp"},
	}, image.LayerOptions{IDBase: b.idBaseOf(&s.rec), IDCount: idRange})
}

func gzipFile(src *os.File, dst string) error {
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	zw, err := gzip.NewWriterLevel(out, gzip.BestSpeed)
	if err != nil {
		out.Close()
		return err
	}
	_, err = io.Copy(zw, src)
	if cerr := zw.Close(); err == nil {
		err = cerr
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// snapshotBase says what the session's files sit on, and loads its image for an image base.
func (b *Backend) snapshotBase(ctx context.Context, s *session, store *image.SnapshotStore) (image.SnapshotBase, v1.Image, error) {
	if data, err := os.ReadFile(filepath.Join(s.dir, snapshotBaseFile)); err == nil {
		var base image.SnapshotBase
		if err := json.Unmarshal(data, &base); err != nil {
			return base, nil, fmt.Errorf("%s: %w", snapshotBaseFile, err)
		}
		if base.Kind != image.BaseImage {
			return base, nil, nil
		}
		img, err := store.StoredBase(base.Manifest)
		if err == nil {
			return base, img, nil
		}
		if base.Source == nil {
			return base, nil, err
		}
		// The snapshot it came from is gone with its stored base: load the original.
		img, lerr := image.Load(ctx, *base.Source)
		if lerr != nil {
			return base, nil, fmt.Errorf("%w: the base image of session %s is no longer stored (%v) and its source cannot be loaded: %v", sandbox.ErrNotFound, s.rec.ID, err, lerr)
		}
		if c, err := img.ConfigName(); err != nil || c.String() != base.Config {
			return base, nil, fmt.Errorf("%w: the base image of session %s is no longer stored and %s now holds another image", sandbox.ErrConflict, s.rec.ID, base.Source)
		}
		return base, img, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return image.SnapshotBase{}, nil, err
	}
	src := s.rec.Spec.Image
	switch src.Kind() {
	case spec.ImageHost:
		return image.SnapshotBase{Kind: image.BaseHost}, nil, nil
	case spec.ImageDir:
		d, err := filepath.Abs(src.Dir)
		if err != nil {
			return image.SnapshotBase{}, nil, err
		}
		return image.SnapshotBase{Kind: image.BaseDir, Dir: d}, nil, nil
	case spec.ImageOCILayout, spec.ImageTarball, spec.ImageRef:
		img, err := image.Load(ctx, src)
		if err != nil {
			return image.SnapshotBase{}, nil, fmt.Errorf("snapshot: loading the base image: %w", err)
		}
		dir, err := image.ResolveImage(ctx, img, src.String(), b.opts.ImageCacheDir, b.imageResolveOptions())
		if err != nil {
			return image.SnapshotBase{}, nil, err
		}
		if !runsOn(s.rec.InitPID, dir) {
			return image.SnapshotBase{}, nil, fmt.Errorf("%w: the image at %s is not the one session %s started from: it changed since", sandbox.ErrConflict, src, s.rec.ID)
		}
		cfg, err := img.ConfigName()
		if err != nil {
			return image.SnapshotBase{}, nil, err
		}
		srcCopy := src
		return image.SnapshotBase{Kind: image.BaseImage, Source: &srcCopy, Config: cfg.String()}, img, nil
	}
	return image.SnapshotBase{}, nil, fmt.Errorf("%w: session %s was made from a snapshot but has no record of its base", sandbox.ErrNotFound, s.rec.ID)
}

func (b *Backend) imageResolveOptions() image.ResolveOptions {
	if b.rootless != nil {
		// The user's own files: the sandbox's root's (rootless.go).
		return image.ResolveOptions{NoChown: true, Progress: b.opts.ImageProgress, Logger: b.log}
	}
	return image.ResolveOptions{UIDBase: b.opts.UIDBase, IDCount: idRange, Progress: b.opts.ImageProgress, Logger: b.log}
}

// runsOn reports whether the sandbox of init pid has rootfs dir as its root: its top-level
// entries are binds of dir's, so the same inodes. An image with nothing comparable at its top
// (only symlinks) cannot be told apart and counts as the same.
func runsOn(pid int, dir string) bool {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range ents {
		if e.Type()&fs.ModeSymlink != 0 || e.Name() == "proc" || e.Name() == "dev" || e.Name() == "sys" || e.Name() == "tmp" {
			continue
		}
		var want, got unix.Stat_t
		if unix.Lstat(filepath.Join(dir, e.Name()), &want) != nil {
			continue
		}
		if unix.Stat(fmt.Sprintf("/proc/%d/root/%s", pid, e.Name()), &got) != nil {
			return false
		}
		return want.Dev == got.Dev && want.Ino == got.Ino
	}
	return true
}

// snapshotRestore is a create's snapshot: what prepareSnapshot remaps for init.
type snapshotRestore struct {
	snap image.Snapshot
}

// resolveSnapshot is resolve's part for spec image.snapshot: the root is the snapshot's base.
func (b *Backend) resolveSnapshot(ctx context.Context, decl spec.Sandbox, r *resolved) (imageEnv []string, err error) {
	if r.gvisor {
		return nil, fmt.Errorf("%w: image.snapshot: sandboxes from snapshots run on the native runtime only", sandbox.ErrUnsupported)
	}
	store, err := b.snapshotStore()
	if err != nil {
		return nil, err
	}
	snap, err := store.Get(decl.Image.Snapshot)
	if err != nil {
		return nil, err
	}
	switch snap.Base.Kind {
	case image.BaseHost:
		r.rootKind = nsinit.RootHost
	case image.BaseDir:
		if fi, err := os.Stat(snap.Base.Dir); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("%w: image.snapshot %q: its base directory %s is gone", sandbox.ErrNotFound, snap.Name, snap.Base.Dir)
		}
		r.rootKind, r.rootSrc = nsinit.RootDir, snap.Base.Dir
	case image.BaseImage:
		img, err := store.BaseImage(snap)
		if err != nil {
			return nil, err
		}
		opts := b.imageResolveOptions()
		dir, err := image.ResolveImage(ctx, img, "snapshot "+snap.Name+" base", b.opts.ImageCacheDir, opts)
		if err != nil {
			return nil, err
		}
		r.rootKind, r.rootSrc, r.imageIDs = nsinit.RootDir, dir, opts.UIDBase
		if entry, err := image.Inspect(dir); err == nil {
			imageEnv = entry.Config.Env
		}
	default:
		return nil, fmt.Errorf("%w: image.snapshot %q: unknown base kind %q", sandbox.ErrInvalid, snap.Name, snap.Base.Kind)
	}
	r.snapshot = &snapshotRestore{snap: snap}
	return imageEnv, nil
}

// prepareSnapshot, for a sandbox made from a snapshot, writes the remapped layer init unpacks
// (cfg.Restore) and the base record into the session directory; the returned func removes the
// layer once init has used it.
func (b *Backend) prepareSnapshot(ctx context.Context, dir string, r *resolved, cfg *nsinit.Config, idBase int) (func(), error) {
	if r.snapshot == nil {
		return func() {}, nil
	}
	snap := r.snapshot.snap
	base, err := json.Marshal(snap.Base)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, snapshotBaseFile), base, 0o600); err != nil {
		return nil, err
	}
	store, err := b.snapshotStore()
	if err != nil {
		return nil, err
	}
	rc, err := store.OpenLayer(snap)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	p := filepath.Join(dir, restoreFile)
	out, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o400)
	if err != nil {
		return nil, err
	}
	done := func() { os.Remove(p) }
	// Init reads it as the sandbox's root, mapped to idBase (idrange).
	err = out.Chown(idBase, idBase)
	if err == nil {
		_, err = image.RemapLayer(ctx, out, rc, []image.LayerMapping{
			{From: strings.TrimPrefix(snap.Workdir, "/"), To: "workspace"},
			{From: "tmp", To: "tmp"},
		}, idRange)
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		done()
		return nil, fmt.Errorf("image.snapshot %q: %w", snap.Name, err)
	}
	cfg.Restore = p
	return done, nil
}

// ListSnapshots returns every stored snapshot, oldest first.
func (b *Backend) ListSnapshots(ctx context.Context) ([]sandbox.SnapshotInfo, error) {
	store, err := b.snapshotStore()
	if err != nil {
		return nil, err
	}
	list, err := store.List()
	if err != nil {
		return nil, err
	}
	out := make([]sandbox.SnapshotInfo, len(list))
	for i, x := range list {
		out[i] = snapshotInfo(x)
	}
	return out, nil
}

// DeleteSnapshot removes a snapshot (sandbox.ErrNotFound if there is none). Sandboxes made
// from it keep running with their own copy.
func (b *Backend) DeleteSnapshot(ctx context.Context, name string) error {
	store, err := b.snapshotStore()
	if err != nil {
		return err
	}
	return store.Delete(name)
}

// Fork snapshots the session and starts n sandboxes from that snapshot (the parent's
// declaration with image.snapshot set to it), all or none: if one fails, the others are
// terminated. Each child starts with the parent's files and nothing else of it: no
// processes, and a write in one is seen by no other. The snapshot stays in the store, named
// in each child's spec.image.snapshot, for more children later; DeleteSnapshot removes it.
func (b *Backend) Fork(ctx context.Context, sessionID string, n int) ([]*sandbox.Session, error) {
	if n < 1 || n > MaxFork {
		return nil, fmt.Errorf("%w: fork count %d: must be 1..%d", sandbox.ErrInvalid, n, MaxFork)
	}
	if err := checkSessionID(sessionID); err != nil {
		return nil, err
	}
	var rnd [4]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, err
	}
	name := "fork-" + strings.TrimPrefix(sessionID, "s-") + "-" + hex.EncodeToString(rnd[:])
	if _, err := b.Snapshot(ctx, sessionID, name); err != nil {
		return nil, err
	}
	parent, err := b.Get(ctx, sessionID)
	if err != nil {
		return nil, err
	}
	decl := parent.Spec
	decl.Image = spec.Image{Snapshot: name}
	out := make([]*sandbox.Session, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := decl
			if decl.Labels != nil {
				d.Labels = make(map[string]string, len(decl.Labels))
				for k, v := range decl.Labels {
					d.Labels[k] = v
				}
			}
			out[i], errs[i] = b.Create(ctx, d)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		for _, s := range out {
			if s != nil {
				if terr := b.Terminate(cctx, s.ID); terr != nil {
					err = errors.Join(err, terr)
				}
			}
		}
		return nil, fmt.Errorf("fork %s: %w", sessionID, err)
	}
	return out, nil
}
