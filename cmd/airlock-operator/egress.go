package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/airlock-sandbox/airlock/egress"
	"github.com/airlock-sandbox/airlock/operator"
	"github.com/airlock-sandbox/airlock/spec"
)

// egressInit is the sandbox pod's privileged init step under allowDomains: it sets the pod's
// nftables (egress.InstallInPlace) and exits; nothing that holds NET_ADMIN stays in the pod.
func egressInit(args []string) error {
	fs := flag.NewFlagSet("egress-init", flag.ContinueOnError)
	proxyPort := fs.Uint("proxy-port", operator.EgressProxyPort, "the proxy's port on 127.0.0.1")
	dnsPort := fs.Uint("dns-port", operator.EgressDNSPort, "the resolver's port on 127.0.0.1")
	uid := fs.Uint("proxy-uid", operator.EgressProxyUID, "the proxy's uid, the only one whose traffic leaves the pod unredirected")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *proxyPort > 65535 || *dnsPort > 65535 || *uid > 1<<31 {
		return fmt.Errorf("-proxy-port %d, -dns-port %d: 1..65535; -proxy-uid %d: a uid", *proxyPort, *dnsPort, *uid)
	}
	return egress.InstallInPlace(egress.InPlace{ProxyPort: uint16(*proxyPort), DNSPort: uint16(*dnsPort), ProxyUID: uint32(*uid)})
}

// egressProxy is the sandbox pod's egress sidecar: airlock's resolver and proxy (package
// egress, as the local runtime runs them) on the pod's loopback, until SIGTERM.
func egressProxy(args []string) error {
	fs := flag.NewFlagSet("egress-proxy", flag.ContinueOnError)
	id := fs.String("sandbox", "", "the sandbox's id (logs)")
	domains := fs.String("domains", "", "allowed host names, comma-separated (*.example.com for subdomains)")
	upstream := fs.String("upstream", "", "DNS servers to ask, ip:port comma-separated (default: this container's /etc/resolv.conf)")
	public := fs.String("egress-public", "", "documentation prefixes to count as public (a lab's fake internet)")
	proxyPort := fs.Uint("proxy-port", operator.EgressProxyPort, "the proxy's port on 127.0.0.1")
	dnsPort := fs.Uint("dns-port", operator.EgressDNSPort, "the resolver's port on 127.0.0.1")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *proxyPort > 65535 || *dnsPort > 65535 {
		return fmt.Errorf("-proxy-port %d, -dns-port %d: 1..65535", *proxyPort, *dnsPort)
	}
	ups, err := parseUpstream(*upstream)
	if err != nil {
		return fmt.Errorf("-upstream: %w", err)
	}
	if len(ups) == 0 {
		if ups = egress.ResolvConfNameservers("/etc/resolv.conf"); len(ups) == 0 {
			return errors.New("no DNS server to ask: -upstream is empty and /etc/resolv.conf names none")
		}
	}
	extra, err := operator.ParseExtraPublic(*public)
	if err != nil {
		return fmt.Errorf("-egress-public: %w", err)
	}
	var names []string
	for d := range strings.SplitSeq(*domains, ",") {
		if d = strings.TrimSpace(d); d != "" {
			names = append(names, d)
		}
	}
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	gw, err := egress.NewGateway(egress.Options{Upstream: ups, ExtraPublic: extra, Logger: logger})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	att, err := gw.ServeInPlace(ctx, *id, egress.Policy{Mode: spec.EgressAllowDomains, Domains: names},
		egress.InPlace{ProxyPort: uint16(*proxyPort), DNSPort: uint16(*dnsPort), ProxyUID: uint32(os.Getuid())})
	if err != nil {
		gw.Close()
		return err
	}
	logger.Info("egress proxy serving", "sandbox", *id, "domains", names, "upstream", fmt.Sprint(ups))
	<-ctx.Done()
	return errors.Join(att.Close(), gw.Close())
}

func parseUpstream(v string) ([]netip.AddrPort, error) {
	var out []netip.AddrPort
	for f := range strings.SplitSeq(v, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		ap, err := netip.ParseAddrPort(f)
		if err != nil {
			return nil, fmt.Errorf("%q is not ip:port such as 10.96.0.10:53: %v", f, err)
		}
		out = append(out, ap)
	}
	return out, nil
}

// egressReady is the sidecar's startup probe: it succeeds once the resolver accepts on TCP
// (its listeners are bound after the proxy's), and closes without asking anything.
func egressReady(args []string) error {
	fs := flag.NewFlagSet("egress-ready", flag.ContinueOnError)
	dnsPort := fs.Uint("dns-port", operator.EgressDNSPort, "the resolver's port on 127.0.0.1")
	if err := fs.Parse(args); err != nil {
		return err
	}
	c, err := net.DialTimeout("tcp4", fmt.Sprintf("127.0.0.1:%d", *dnsPort), 2*time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}
