package nsinit

import (
	"archive/tar"
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// restoreSnapshot fills the writable tmpfs (dir, its "workspace" and "tmp" already made) from
// the tar at tarPath: a snapshot layer the host has already checked and remapped onto the
// tmpfs's own names (image.RemapLayer). It runs before anything else in the sandbox does, as
// the namespace's root, so ownership lands on the sandbox's own ids. Every write goes through
// os.Root: no entry, and no symlink an earlier entry made, reaches outside the tmpfs. The
// image package's unpacker is not used here because it would bring the registry client into
// the agent binary; this needs only directories, files, symlinks and hard links.
func restoreSnapshot(tarPath, dir string) error {
	if !filepath.IsAbs(tarPath) {
		return fmt.Errorf("snapshot: restore %q is not an absolute path", tarPath)
	}
	f, err := os.Open(tarPath)
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	defer f.Close()
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	defer root.Close()
	type dirMeta struct {
		mode  fs.FileMode
		mtime time.Time
	}
	dirs := map[string]dirMeta{}
	tr := tar.NewReader(bufio.NewReaderSize(f, 64<<10))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
		name := strings.TrimSuffix(hdr.Name, "/")
		if !fs.ValidPath(name) || name == "." {
			return fmt.Errorf("snapshot entry %q: not a path below the writable layer", hdr.Name)
		}
		mode := fs.FileMode(hdr.Mode) & fs.ModePerm
		if hdr.Mode&0o1000 != 0 {
			mode |= fs.ModeSticky
		}
		if err := restoreEntry(root, tr, hdr, name, mode); err != nil {
			if errors.Is(err, unix.ENOSPC) {
				return fmt.Errorf("snapshot entry %q: the snapshot does not fit the sandbox's disk limit: %w", hdr.Name, err)
			}
			return fmt.Errorf("snapshot entry %q: %w", hdr.Name, err)
		}
		if hdr.Typeflag == tar.TypeDir {
			dirs[name] = dirMeta{mode, hdr.ModTime}
		}
	}
	// Modes and times last, deepest first: children change a directory's mtime.
	names := make([]string, 0, len(dirs))
	for n := range dirs {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return strings.Count(names[i], "/") > strings.Count(names[j], "/") })
	for _, n := range names {
		if err := root.Chmod(n, dirs[n].mode); err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
		if err := root.Chtimes(n, dirs[n].mtime, dirs[n].mtime); err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
	}
	return nil
}

func restoreEntry(root *os.Root, r io.Reader, hdr *tar.Header, name string, mode fs.FileMode) error {
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := root.Mkdir(name, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		fi, err := root.Lstat(name)
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return errors.New("exists and is not a directory")
		}
		return root.Lchown(name, hdr.Uid, hdr.Gid)
	case tar.TypeReg:
		// O_EXCL: never an existing file, never through a symlink at the last component.
		out, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(out, r)
		if err == nil {
			err = out.Chown(hdr.Uid, hdr.Gid)
		}
		if err == nil {
			err = out.Chmod(mode)
		}
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		return root.Chtimes(name, hdr.ModTime, hdr.ModTime)
	case tar.TypeSymlink:
		if err := root.Symlink(hdr.Linkname, name); err != nil {
			return err
		}
		return root.Lchown(name, hdr.Uid, hdr.Gid)
	case tar.TypeLink:
		target := strings.TrimSuffix(hdr.Linkname, "/")
		if !fs.ValidPath(target) || target == "." || path.Clean(target) != target {
			return fmt.Errorf("hard link target %q is not a path below the writable layer", hdr.Linkname)
		}
		return root.Link(target, name)
	}
	return fmt.Errorf("entry type %q is not restored", string(hdr.Typeflag))
}
