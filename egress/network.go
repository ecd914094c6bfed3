//go:build linux

package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/sandbox"
)

// network is one sandbox's link with its rules, resolver and proxy. Its fields are fixed
// once built; teardown is the only way out.
type network struct {
	a      *Attachment
	hostIf string
	block  netip.Prefix // the /30
	gw, sb netip.Addr
	table  string

	proxyLn net.Listener
	dnsUDP  net.PacketConn
	dnsTCP  net.Listener

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	connMu sync.Mutex
	conns  map[net.Conn]struct{}
	done   bool
	active atomic.Int64 // proxied connections being handled
}

// allocate reserves a free /30 in the pool: free of live reservations and of any address
// already present in the host namespace (so numbering survives a restart of this process).
func (g *Gateway) allocate(h *netlink.Handle, id string) (netip.Prefix, error) {
	addrs, err := h.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("egress: list host addresses: %w", err)
	}
	used := map[netip.Prefix]bool{}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok && g.opts.Pool.Contains(ip) {
			blk, _ := ip.Prefix(30)
			used[blk] = true
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for b := g.opts.Pool.Addr(); g.opts.Pool.Contains(b); {
		blk := netip.PrefixFrom(b, 30)
		if !used[blk] && g.blocks[blk] == "" {
			g.blocks[blk] = id
			return blk, nil
		}
		for range 4 {
			b = b.Next()
		}
	}
	return netip.Prefix{}, fmt.Errorf("%w: egress pool %s has no free /30 left", sandbox.ErrConflict, g.opts.Pool)
}

func (g *Gateway) release(blk netip.Prefix) {
	g.mu.Lock()
	delete(g.blocks, blk)
	g.mu.Unlock()
}

// buildNetwork makes the link, rules and listeners for a; on error it undoes what it made.
func (g *Gateway) buildNetwork(ctx context.Context, a *Attachment) (_ *network, err error) {
	hh, err := g.hostHandle()
	if err != nil {
		return nil, fmt.Errorf("egress: netlink in host netns: %w", err)
	}
	defer hh.Close()
	sh, err := netlink.NewHandleAt(a.sbNS)
	if err != nil {
		return nil, fmt.Errorf("egress: netlink in sandbox netns: %w", err)
	}
	defer sh.Close()

	n := &network{a: a, hostIf: hostIfName(a.id), table: tableName(a.id), conns: map[net.Conn]struct{}{}}
	if _, err := hh.LinkByName(n.hostIf); err == nil {
		return nil, fmt.Errorf("%w: host link %s for sandbox %q already exists (a leftover? see Gateway.Cleanup)", sandbox.ErrConflict, n.hostIf, a.id)
	}
	if _, err := sh.LinkByName(g.opts.SandboxInterface); err == nil {
		return nil, fmt.Errorf("%w: sandbox %q already has a link named %s", sandbox.ErrConflict, a.id, g.opts.SandboxInterface)
	}
	if n.block, err = g.allocate(hh, a.id); err != nil {
		return nil, err
	}
	n.gw = n.block.Addr().Next()
	n.sb = n.gw.Next()
	n.ctx, n.cancel = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			err = errors.Join(err, n.teardown())
		}
	}()

	nt, err := g.installDrops(n.table, n.hostIf)
	if err != nil {
		return n, err
	}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: n.hostIf},
		PeerName:      g.opts.SandboxInterface,
		PeerNamespace: netlink.NsFd(int(a.sbNS)),
	}
	if err := hh.LinkAdd(veth); err != nil {
		return n, fmt.Errorf("egress: create veth %s: %w", n.hostIf, err)
	}
	hostLink, err := hh.LinkByName(n.hostIf)
	if err != nil {
		return n, fmt.Errorf("egress: find veth %s: %w", n.hostIf, err)
	}
	sbLink, err := sh.LinkByName(g.opts.SandboxInterface)
	if err != nil {
		return n, fmt.Errorf("egress: find sandbox link: %w", err)
	}
	// No IPv6 link-local on either end: the sandbox is IPv4-only and must not be able to
	// talk to the host over fe80::. Best effort: the rules drop IPv6 regardless.
	_ = hh.LinkSetIP6AddrGenMode(hostLink, 1 /* IN6_ADDR_GEN_MODE_NONE */)
	_ = sh.LinkSetIP6AddrGenMode(sbLink, 1)

	if err := hh.AddrAdd(hostLink, &netlink.Addr{IPNet: ipNet(n.gw, 30)}); err != nil {
		return n, fmt.Errorf("egress: address %s on %s: %w", n.gw, n.hostIf, err)
	}
	if err := sh.AddrAdd(sbLink, &netlink.Addr{IPNet: ipNet(n.sb, 30)}); err != nil {
		return n, fmt.Errorf("egress: sandbox address %s: %w", n.sb, err)
	}
	if err := hh.LinkSetUp(hostLink); err != nil {
		return n, fmt.Errorf("egress: up %s: %w", n.hostIf, err)
	}

	if err := n.listen(ctx); err != nil {
		return n, err
	}
	port := uint16(n.proxyLn.Addr().(*net.TCPAddr).Port)
	if err := g.installAccepts(nt, n.hostIf, n.gw, n.sb, port); err != nil {
		return n, err
	}

	if err := sh.LinkSetUp(sbLink); err != nil {
		return n, fmt.Errorf("egress: up sandbox link: %w", err)
	}
	if err := sh.RouteAdd(&netlink.Route{LinkIndex: sbLink.Attrs().Index, Gw: n.gw.AsSlice(), Family: netlink.FAMILY_V4}); err != nil {
		return n, fmt.Errorf("egress: sandbox default route via %s: %w", n.gw, err)
	}
	n.serve()
	return n, nil
}

func ipNet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, a.BitLen())}
}

func (n *network) listen(ctx context.Context) error {
	g := n.a.g
	var err error
	if n.proxyLn, err = g.host.listen(ctx, "tcp4", netip.AddrPortFrom(n.gw, 0).String()); err != nil {
		return fmt.Errorf("egress: proxy listener on %s: %w", n.gw, err)
	}
	if n.dnsUDP, err = g.host.listenPacket(ctx, "udp4", netip.AddrPortFrom(n.gw, 53).String()); err != nil {
		return fmt.Errorf("egress: resolver (udp) on %s: %w", n.gw, err)
	}
	if n.dnsTCP, err = g.host.listen(ctx, "tcp4", netip.AddrPortFrom(n.gw, 53).String()); err != nil {
		return fmt.Errorf("egress: resolver (tcp) on %s: %w", n.gw, err)
	}
	return nil
}

func (n *network) serve() {
	n.wg.Add(3)
	go func() { defer n.wg.Done(); n.serveProxy() }()
	go func() { defer n.wg.Done(); n.serveDNSUDP() }()
	go func() { defer n.wg.Done(); n.serveDNSTCP() }()
}

// track registers a connection so teardown can end it; false means teardown has begun.
func (n *network) track(c net.Conn) bool {
	n.connMu.Lock()
	defer n.connMu.Unlock()
	if n.done {
		return false
	}
	n.conns[c] = struct{}{}
	return true
}

// accept returns the next connection on ln, tracked; false means the listener is closed or
// teardown has begun.
func (n *network) accept(ln net.Listener) (net.Conn, bool) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || n.ctx.Err() != nil {
				return nil, false
			}
			continue
		}
		if !n.track(c) {
			c.Close()
			return nil, false
		}
		return c, true
	}
}

func (n *network) untrack(c net.Conn) {
	n.connMu.Lock()
	delete(n.conns, c)
	n.connMu.Unlock()
}

// teardown stops the listeners, ends every connection, deletes the table and the link (its
// peer goes with it) and frees the /30. It keeps going past errors and reports them all.
func (n *network) teardown() error {
	g := n.a.g
	if n.cancel != nil {
		n.cancel()
	}
	var errs []error
	for _, c := range []interface{ Close() error }{n.proxyLn, n.dnsTCP, n.dnsUDP} {
		if c != nil {
			if err := c.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
				errs = append(errs, err)
			}
		}
	}
	n.connMu.Lock()
	n.done = true
	for c := range n.conns {
		c.Close()
	}
	n.connMu.Unlock()
	n.wg.Wait()

	if n.table == "" { // in place: nothing of ours outside this process
		return errors.Join(errs...)
	}
	if d, err := g.readDropped(n.table); err == nil {
		n.a.ctr.droppedBase.Add(d)
	}
	errs = append(errs, g.deleteTable(n.table), g.deleteLink(n.hostIf))
	if n.block.IsValid() {
		g.release(n.block)
	}
	return errors.Join(errs...)
}

func (g *Gateway) deleteLink(name string) error {
	h, err := g.hostHandle()
	if err != nil {
		return fmt.Errorf("egress: netlink in host netns: %w", err)
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("egress: find link %s: %w", name, err)
	}
	if err := h.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("egress: delete link %s: %w", name, err)
	}
	return nil
}
