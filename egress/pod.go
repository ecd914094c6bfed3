//go:build linux

package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// In-place egress (a Kubernetes pod): the sandbox shares one network namespace with the proxy,
// so there is no link to put the gateway on. Instead, the namespace's own output path sends
// every packet of every process but the proxy's uid to the proxy and resolver on loopback,
// and drops what they cannot take. The table (family inet, in the pod's namespace):
//
//	chain nat { type nat hook output priority dstnat
//	  meta skuid <proxy uid> accept                                # the proxy dials out itself
//	  oifname "lo" accept                                          # the pod's own addresses
//	  meta nfproto ipv4 udp dport 53 redirect to :<dns>           # DNS to any server: ours
//	  meta nfproto ipv4 tcp dport 53 redirect to :<dns>
//	  meta nfproto ipv4 meta l4proto tcp redirect to :<proxy>     # every other TCP
//	}
//	chain filter { type filter hook output priority filter
//	  oifname "lo" accept
//	  ip daddr 127.0.0.0/8 accept                                  # what nat redirected
//	  meta skuid <proxy uid> accept
//	  ct state established,related accept                          # replies to inbound (the agent)
//	  counter name dropped drop                                    # UDP, ICMP, IPv6, the rest
//	}
//
// The table is set by a privileged step before anything else runs in the namespace (an init
// container holding NET_ADMIN); the proxy and the code hold no capability and cannot change it.

// PodTable is the nftables table InstallInPlace sets.
const PodTable = "airlock_pod"

// InPlace is the layout of in-place egress in one network namespace.
type InPlace struct {
	ProxyPort uint16 // on 127.0.0.1: every TCP connection out
	DNSPort   uint16 // on 127.0.0.1: every DNS query, UDP or TCP, to any server
	ProxyUID  uint32 // the proxy's uid: the only one whose packets leave unchanged
}

func (ip InPlace) validatePorts() error {
	if ip.ProxyPort == 0 || ip.DNSPort == 0 || ip.ProxyPort == ip.DNSPort {
		return fmt.Errorf("%w: in-place egress ports proxy %d and dns %d: two different ports 1..65535", sandbox.ErrInvalid, ip.ProxyPort, ip.DNSPort)
	}
	return nil
}

func matchSkuid(uid uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeySKUID, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(uid)},
	}
}

func matchIPv4() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}
}

func redirectTo(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.Redir{RegisterProtoMin: 1, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED},
	}
}

// InstallInPlace sets PodTable in the calling thread's network namespace (needs CAP_NET_ADMIN
// there), replacing one left from before, in one transaction.
func InstallInPlace(ip InPlace) error {
	if err := ip.validatePorts(); err != nil {
		return err
	}
	if ip.ProxyUID == 0 {
		// The agent runs as root in the same namespace.
		return fmt.Errorf("%w: in-place egress proxy uid 0: the proxy must not run as root (root's traffic would pass unredirected)", sandbox.ErrInvalid)
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("egress: nftables: %w", err)
	}
	return installInPlace(c, ip)
}

// installInPlace sets PodTable over c; InstallInPlace has validated ip.
func installInPlace(c *nftables.Conn, ip InPlace) error {
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("egress: list nftables tables: %w", err)
	}
	for _, t := range tables {
		if t.Name == PodTable {
			c.DelTable(t)
		}
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: PodTable})
	c.AddObj(&nftables.NamedObj{Table: t, Name: droppedCounter, Type: nftables.ObjTypeCounter, Obj: &expr.Counter{}})
	accept := nftables.ChainPolicyAccept
	nat := c.AddChain(&nftables.Chain{Name: "nat", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest, Policy: &accept})
	filter := c.AddChain(&nftables.Chain{Name: "filter", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	loopback4 := []expr.Any{ // ip daddr 127.0.0.0/8
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{127}},
	}
	for _, r := range [][]expr.Any{
		cat(matchSkuid(ip.ProxyUID), verdictAccept),
		cat(matchOif("lo"), verdictAccept),
		cat(matchIPv4(), matchL4(unix.IPPROTO_UDP), matchDport(53), redirectTo(ip.DNSPort)),
		cat(matchIPv4(), matchL4(unix.IPPROTO_TCP), matchDport(53), redirectTo(ip.DNSPort)),
		cat(matchIPv4(), matchL4(unix.IPPROTO_TCP), redirectTo(ip.ProxyPort)),
	} {
		c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: r})
	}
	for _, r := range [][]expr.Any{
		cat(matchOif("lo"), verdictAccept),
		cat(matchIPv4(), loopback4, verdictAccept),
		cat(matchSkuid(ip.ProxyUID), verdictAccept),
		cat(matchCtState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), verdictAccept),
		countDropped(),
	} {
		c.AddRule(&nftables.Rule{Table: t, Chain: filter, Exprs: r})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("egress: install nftables table %s: %w", PodTable, err)
	}
	return nil
}

// ServeInPlace runs the resolver and the proxy for sandbox id with policy p on loopback of
// the gateway's namespace (ports from ip; its ProxyUID is InstallInPlace's business), for the sandbox that shares that namespace and
// whose traffic InstallInPlace sends there. The gateway's namespace is the proxy's own: it
// has no link or table to make, and accepts a connection from any local address (only
// processes of the namespace reach loopback). Close the attachment to stop.
func (g *Gateway) ServeInPlace(ctx context.Context, id string, p Policy, ip InPlace) (*Attachment, error) {
	if !spec.IsValidID(id) {
		return nil, fmt.Errorf("%w: sandbox id %q: 1 to 64 of [A-Za-z0-9_-]", sandbox.ErrInvalid, id)
	}
	if err := ip.validatePorts(); err != nil {
		return nil, err
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if p.Mode == spec.EgressDeny {
		return nil, fmt.Errorf("%w: in-place egress under deny: there is nothing to serve (deny needs no proxy)", sandbox.ErrInvalid)
	}
	if len(g.opts.Upstream) == 0 {
		return nil, fmt.Errorf("%w: egress mode %q needs Options.Upstream (the DNS servers to forward to)", sandbox.ErrInvalid, p.Mode)
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil, fmt.Errorf("%w: egress gateway is closed", sandbox.ErrInvalid)
	}
	if _, dup := g.attached[id]; dup {
		g.mu.Unlock()
		return nil, fmt.Errorf("%w: sandbox %q is already attached", sandbox.ErrConflict, id)
	}
	a := &Attachment{g: g, id: id, sbNS: netns.None(), log: g.log.With("sandbox", id), answers: newAnswerMemory(), inPlace: true}
	g.attached[id] = a
	g.mu.Unlock()
	pc := p.clone()
	a.pol.Store(&pc)

	lo := netip.AddrFrom4([4]byte{127, 0, 0, 1})
	n := &network{a: a, gw: lo, conns: map[net.Conn]struct{}{}}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	var err error
	if n.proxyLn, err = g.host.listen(ctx, "tcp4", netip.AddrPortFrom(lo, ip.ProxyPort).String()); err == nil {
		if n.dnsUDP, err = g.host.listenPacket(ctx, "udp4", netip.AddrPortFrom(lo, ip.DNSPort).String()); err == nil {
			n.dnsTCP, err = g.host.listen(ctx, "tcp4", netip.AddrPortFrom(lo, ip.DNSPort).String())
		}
	}
	if err != nil {
		err = fmt.Errorf("egress: in-place listeners on %s (proxy %d, dns %d): %w", lo, ip.ProxyPort, ip.DNSPort, err)
		err = errors.Join(err, n.teardown())
		g.mu.Lock()
		delete(g.attached, id)
		g.mu.Unlock()
		return nil, err
	}
	n.serve()
	a.mu.Lock()
	a.net = n
	a.mu.Unlock()
	return a, nil
}

// ResolvConfNameservers reads the nameserver lines of a resolv.conf (port 53 each); an
// unreadable file or none: nil.
func ResolvConfNameservers(path string) []netip.AddrPort {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	return parseNameservers(f)
}

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
