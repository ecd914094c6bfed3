package egresswire

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/backend/local/nsinit"
	"github.com/airlock-sandbox/airlock/sandbox"
)

// Init binds <session>/run/resolv.conf, naming the gateway's resolver, over the sandbox's
// /etc/resolv.conf; the gateway asks the host's nameservers.

// HostNameservers reads the nameserver lines of a resolv.conf; unreadable or none: nil.
func HostNameservers(path string) []netip.AddrPort {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	return parseNameservers(f)
}

// parseNameservers reads the nameserver lines of a resolv.conf, each on port 53.
func parseNameservers(r io.Reader) []netip.AddrPort {
	var out []netip.AddrPort
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[0] != "nameserver" {
			continue
		}
		if a, err := netip.ParseAddr(f[1]); err == nil {
			out = append(out, netip.AddrPortFrom(a, 53))
		}
	}
	return out
}

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
