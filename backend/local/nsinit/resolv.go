package nsinit

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ResolvConfFile is the file in the session's run directory (SessionDir/run on the host) that
// is bound read-only over the sandbox's /etc/resolv.conf. It lives outside the sandbox's
// read-only root so that the host can rewrite it in place when a live egress change moves the
// resolver (from deny, or after the creating process died and another one took the sandbox's
// network over). Its existence tells the host the bind is there.
const ResolvConfFile = "resolv.conf"

// ResolvConf is the /etc/resolv.conf of a sandbox whose only DNS server is nameserver, and
// an empty file without one (egress deny: there is no resolver to ask).
func ResolvConf(nameserver netip.Addr) []byte {
	if !nameserver.IsValid() {
		return nil
	}
	return []byte("nameserver " + nameserver.String() + "\noptions edns0\n")
}

// bindResolvConf writes the resolver file into the run directory and binds it over
// root/etc/resolv.conf. An /etc/resolv.conf that cannot be covered (a symlink, or missing in
// an image's read-only /etc) is an error only when there is a nameserver to announce: under
// deny the image's file, or the generated empty one, is as good as ours.
func bindResolvConf(cfg *Config, r *inRoot) error {
	var ns netip.Addr
	if cfg.Nameserver != "" {
		var err error
		if ns, err = netip.ParseAddr(cfg.Nameserver); err != nil {
			return fmt.Errorf("nameserver %q: %w", cfg.Nameserver, err)
		}
	}
	const target = "/etc/resolv.conf"
	st, err := r.lstat(target)
	switch {
	case errors.Is(err, unix.ENOENT):
		if err := r.create(target, nil, 0o644, false); err != nil {
			if ns.IsValid() {
				return fmt.Errorf("egress needs /etc/resolv.conf for its resolver %s, and the image has none in its read-only /etc: %w", ns, err)
			}
			return nil
		}
	case err != nil:
		return err
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		if ns.IsValid() {
			return fmt.Errorf("egress needs /etc/resolv.conf for its resolver %s, and the image's is not a regular file (mode %#o); a bind would follow it", ns, st.Mode&unix.S_IFMT)
		}
		return nil
	}
	src := filepath.Join(cfg.SessionDir, "run", ResolvConfFile)
	if err := os.WriteFile(src, ResolvConf(ns), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", src, err)
	}
	if err := r.mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return err
	}
	return r.setRO(target, false)
}
