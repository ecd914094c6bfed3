package egresswire

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/backend/local/nsinit"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// Init binds <session>/run/resolv.conf, naming the gateway's resolver, over the sandbox's
// /etc/resolv.conf; the gateway asks the host's nameservers.

// WriteResolvConf rewrites the file init bound over /etc/resolv.conf, in place (the bind
// holds the inode).
func WriteResolvConf(dir string, resolver netip.Addr) error {
	if err := ResolvConfBound(dir); err != nil {
		if !resolver.IsValid() {
			return nil // no resolver to announce, and the sandbox's own file says none
		}
		return err
	}
	// run/ belongs to the sandbox's root: open without following a link it may have put in
	// place of the file (O_NOFOLLOW) or blocking on a FIFO (O_NONBLOCK), and write only into a
	// regular file, truncated after the check rather than by the open.
	f, err := os.OpenFile(filepath.Join(dir, "run", nsinit.ResolvConfFile), os.O_WRONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("the sandbox's resolv.conf: %w", err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return err
	} else if !fi.Mode().IsRegular() {
		return fmt.Errorf("the sandbox's resolv.conf is a %v, not a regular file: not written", fi.Mode().Type())
	}
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err = f.Write(nsinit.ResolvConf(resolver))
	return errors.Join(err, f.Close())
}

// ResolvConfBound says whether init bound our file over /etc/resolv.conf (it writes the file
// only then).
func ResolvConfBound(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, "run", nsinit.ResolvConfFile)); err != nil {
		return fmt.Errorf("%w: the sandbox's /etc/resolv.conf could not be covered when it was created (a symlink, or missing in a read-only image /etc), so it cannot be told its resolver", sandbox.ErrUnsupported)
	}
	return nil
}
