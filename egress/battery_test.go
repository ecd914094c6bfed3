package egress

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/net/dns/dnsmessage"

	"github.com/airlock-sandbox/airlock/spec"
)

// bctx is one battery case run against one sandbox under one mode.
type bctx struct {
	t     *testing.T
	e     *env
	s     *sbox
	other *sbox
	mode  spec.EgressMode
	ctx   context.Context
}

func (b *bctx) is(m spec.EgressMode) bool { return b.mode == m }

// reached: the attempt succeeded and was answered by the server at local.
func (b *bctx) reached(body string, err error, local string) {
	b.t.Helper()
	if err != nil {
		b.t.Fatalf("%s: want the request to reach %s, got %v", b.mode, local, err)
	}
	if !contains(body, "local="+local) {
		b.t.Fatalf("%s: reached the wrong server: %q (want %s)", b.mode, body, local)
	}
}

// refused: the attempt failed, the server never saw it, and the refusal was logged.
func (b *bctx) refused(err error, since int, reason Reason, name, hitKey string, hitsBefore int) {
	b.t.Helper()
	if err == nil {
		b.t.Fatalf("%s: want refusal %q, the request succeeded", b.mode, reason)
	}
	if got := b.e.hits.get(hitKey); got != hitsBefore {
		b.t.Fatalf("%s: %s was reached (%d hits, before %d)", b.mode, hitKey, got, hitsBefore)
	}
	b.s.requireRefusal(b.t, since, reason, name)
}

func (b *bctx) unreachable(err error) {
	b.t.Helper()
	if !isUnreachable(err) {
		b.t.Fatalf("%s: want network unreachable, got %v", b.mode, err)
	}
}

// control proves the target is real: the host itself reaches it.
func (b *bctx) control(dialAddr, host string, sni *string, local string) {
	b.t.Helper()
	body, err := b.e.hostRequest(b.ctx, dialAddr, host, sni)
	if err != nil || !contains(body, "local="+local) {
		b.t.Fatalf("positive control: the host cannot reach %s: %q %v", dialAddr, body, err)
	}
}

// httpCase is the common shape: one request that deny cannot send, allow refuses with
// allowReason and allowDomains with domainsReason (each lets it through to want when its
// reason is ""), and open lets through.
func (b *bctx) httpCase(dialAddr, host string, sni *string, want string, allowReason, domainsReason Reason, refusedName string) {
	b.t.Helper()
	b.httpCaseModes(dialAddr, host, sni, want, map[spec.EgressMode]Reason{spec.EgressAllow: allowReason, spec.EgressAllowDomains: domainsReason}, refusedName)
}

// httpCaseModes is httpCase with the refusal reason of every mode but deny given by mode
// (missing: let through).
func (b *bctx) httpCaseModes(dialAddr, host string, sni *string, want string, reasons map[spec.EgressMode]Reason, refusedName string) {
	b.t.Helper()
	before, m := b.e.hits.get(want), b.s.mark()
	body, err := b.s.request(b.ctx, dialAddr, host, sni)
	reason := reasons[b.mode]
	switch {
	case b.is(spec.EgressDeny):
		b.unreachable(err)
	case reason == "":
		b.reached(body, err, want)
	default:
		if !b.is(spec.EgressAllowDomains) {
			refusedName = "" // only allowDomains reads names
		}
		b.refused(err, m, reason, refusedName, want, before)
	}
}

var batteryCases = []struct {
	name string
	run  func(b *bctx)
}{
	{"Baseline/HTTP80", func(b *bctx) {
		b.httpCase("198.51.100.10:80", "allowed.example.com", nil, "198.51.100.10:80", "", "", "")
	}},
	{"Baseline/TLS443", func(b *bctx) {
		b.httpCase("198.51.100.10:443", "allowed.example.com", strp("allowed.example.com"), "198.51.100.10:443", "", "", "")
	}},
	{"IPLiteral/HTTPHost", func(b *bctx) {
		b.httpCase("198.51.100.10:80", "198.51.100.10", nil, "198.51.100.10:80", "", ReasonIPLiteral, "198.51.100.10")
	}},
	{"IPLiteral/HTTPWithoutHost", func(b *bctx) {
		b.httpCase("198.51.100.10:80", "", nil, "198.51.100.10:80", "", ReasonNoName, "")
	}},
	{"IPLiteral/TLSWithoutSNI", func(b *bctx) {
		b.httpCase("198.51.100.10:443", "198.51.100.10", strp("198.51.100.10"), "198.51.100.10:443", "", ReasonNoName, "")
	}},
	{"IPv6/NoRoute", func(b *bctx) {
		b.control("[2001:db8::10]:80", "allowed.example.com", nil, "[2001:db8::10]:80")
		before := b.e.hits.get("[2001:db8::10]:80")
		_, err := b.s.request(b.ctx, "[2001:db8::10]:80", "allowed.example.com", nil)
		b.unreachable(err)
		if b.e.hits.get("[2001:db8::10]:80") != before {
			b.t.Fatal("IPv6 server reached")
		}
	}},
	{"IPv6/SelfConfigured", func(b *bctx) { ipv6SelfConfigured(b) }},
	{"DNS/ForeignResolverUDP", func(b *bctx) {
		foreign := "198.51.100.53:53"
		if rc, addrs, err := query(b.ctx, hostDial(b.e), foreign, "udp", "allowed.example.com", dnsmessage.TypeA); err != nil || rc != dnsmessage.RCodeSuccess || len(addrs) != 1 {
			b.t.Fatalf("positive control: the foreign resolver does not answer the host: %v %v %v", rc, addrs, err)
		}
		if b.is(spec.EgressDeny) {
			_, _, err := query(b.ctx, b.s.dial, foreign, "udp", "allowed.example.com", dnsmessage.TypeA)
			b.unreachable(err)
			return
		}
		dropped, seen := b.s.att.Counters().PacketsDropped, b.e.foreign.count(foreign)
		sendUDP(b, foreign, dnsQuery(b.t, "evil-example.com"))
		b.s.waitDropped(b.t, dropped)
		if b.e.foreign.count(foreign) != seen {
			b.t.Fatal("the foreign resolver received the query")
		}
	}},
	{"DNS/OurResolverTCP", func(b *bctx) {
		rc, addrs, err := b.s.resolve(b.ctx, "tcp", "allowed.example.com")
		if b.is(spec.EgressDeny) {
			b.unreachable(err)
			return
		}
		if err != nil || rc != dnsmessage.RCodeSuccess || !slices.Equal(addrs, []netip.Addr{ipAllowed}) {
			b.t.Fatalf("allowed name over TCP: %v %v %v", rc, addrs, err)
		}
		rc, addrs, err = b.s.resolve(b.ctx, "tcp", "evil-example.com")
		if b.is(spec.EgressAllowDomains) {
			if err != nil || rc != dnsmessage.RCodeNameError || len(addrs) != 0 {
				b.t.Fatalf("disallowed name over TCP: %v %v %v", rc, addrs, err)
			}
		} else if err != nil || !slices.Equal(addrs, []netip.Addr{ipEvil}) {
			b.t.Fatalf("allow: any name over TCP: %v %v %v", rc, addrs, err)
		}
	}},
	{"DNS/ForeignResolverTCP", func(b *bctx) {
		foreign := "198.51.100.53:53"
		seen, m := b.e.foreign.count(foreign), b.s.mark()
		rc, addrs, err := query(b.ctx, b.s.dial, foreign, "tcp", "evil-example.com", dnsmessage.TypeA)
		switch b.mode {
		case spec.EgressDeny:
			b.unreachable(err)
		case spec.EgressAllow, spec.EgressOpen: // public TCP is what allow means
			if err != nil || rc != dnsmessage.RCodeSuccess || !slices.Equal(addrs, []netip.Addr{ipEvil}) {
				b.t.Fatalf("allow: DNS over TCP to a public resolver: %v %v %v", rc, addrs, err)
			}
		case spec.EgressAllowDomains:
			if err == nil {
				b.t.Fatalf("DNS over TCP to a foreign resolver answered: %v %v", rc, addrs)
			}
			if b.e.foreign.count(foreign) != seen {
				b.t.Fatal("the foreign resolver received the query")
			}
			b.s.requireRefusal(b.t, m, ReasonNotTLSOrHTTP, "")
		}
	}},
	{"Mismatch/SNI", func(b *bctx) {
		b.httpCase("203.0.113.66:443", "allowed.example.com", strp("allowed.example.com"), "203.0.113.66:443", "", ReasonAddrMismatch, "allowed.example.com")
	}},
	{"Mismatch/HostHeader", func(b *bctx) {
		b.httpCase("203.0.113.66:80", "allowed.example.com", nil, "203.0.113.66:80", "", ReasonAddrMismatch, "allowed.example.com")
	}},
	{"DNSRebinding", func(b *bctx) {
		b.control("10.0.0.5:80", "rebind.example.com", nil, "10.0.0.5:80")
		m := b.s.mark()
		rc, addrs, err := b.s.resolve(b.ctx, "udp", "rebind.example.com")
		switch b.mode {
		case spec.EgressDeny:
			b.unreachable(err)
		case spec.EgressOpen: // a name of a private address is what open is for
			if err != nil || rc != dnsmessage.RCodeSuccess || !slices.Equal(addrs, []netip.Addr{ipPrivate}) {
				b.t.Fatalf("open: private answer not passed: %v %v %v", rc, addrs, err)
			}
			if recs := b.e.logs.refusals(b.s.id)[m:]; len(recs) != 0 {
				b.t.Fatalf("open: refusals logged: %v", recs)
			}
		default:
			if err != nil || rc != dnsmessage.RCodeSuccess || len(addrs) != 0 {
				b.t.Fatalf("rebinding answer not stripped: %v %v %v", rc, addrs, err)
			}
			b.s.requireRefusal(b.t, m, ReasonNonPublicAnswer, "rebind.example.com")
		}
		b.httpCase("10.0.0.5:80", "rebind.example.com", nil, "10.0.0.5:80", ReasonNonPublicDst, ReasonNonPublicDst, "rebind.example.com")
	}},
	{"Private/Ranges", func(b *bctx) {
		// Each RFC 1918 range and CGNAT: a service of the host's network that only open reaches.
		for _, ip := range []netip.Addr{ipPrivate, ipPrivate172, ipPrivate192, ipCGNAT} {
			addr := netip.AddrPortFrom(ip, 80).String()
			b.control(addr, "svc.internal", nil, addr)
			b.httpCase(addr, "svc.internal", nil, addr, ReasonNonPublicDst, ReasonNonPublicDst, "svc.internal")
		}
	}},
	{"Metadata", func(b *bctx) {
		b.control("169.254.169.254:80", "allowed.example.com", nil, "169.254.169.254:80")
		b.httpCase("169.254.169.254:80", "allowed.example.com", nil, "169.254.169.254:80", ReasonNonPublicDst, ReasonNonPublicDst, "")
	}},
	{"HostAddress/Uplink", func(b *bctx) {
		b.control("192.0.2.2:80", "allowed.example.com", nil, "192.0.2.2:80")
		b.httpCase("192.0.2.2:80", "allowed.example.com", nil, "192.0.2.2:80", ReasonHostAddr, ReasonHostAddr, "")
	}},
	{"HostAddress/Gateway", func(b *bctx) {
		gw := b.s.att.Resolver()
		if !gw.IsValid() {
			gw = netip.MustParseAddr("10.200.0.1")
		}
		addr := netip.AddrPortFrom(gw, 80).String()
		b.httpCaseModes(addr, "allowed.example.com", nil, addr, map[spec.EgressMode]Reason{
			spec.EgressAllow: ReasonNonPublicDst, spec.EgressAllowDomains: ReasonNonPublicDst, spec.EgressOpen: ReasonSandboxLink}, "")
	}},
	{"HostAddress/UDP", func(b *bctx) {
		gw := b.s.att.Resolver()
		if !gw.IsValid() {
			gw = netip.MustParseAddr("10.200.0.1")
		}
		for _, ip := range []netip.Addr{gw, ipHost} {
			addr := netip.AddrPortFrom(ip, 9053).String()
			udpControl(b, addr, ":9053")
			udpDropped(b, addr, ":9053")
		}
	}},
	{"Spoofing/SourceAddress", func(b *bctx) { spoofedSource(b) }},
	{"OtherSandbox/TCP", func(b *bctx) {
		addr := netip.AddrPortFrom(b.other.att.SandboxAddr(), 9000).String()
		b.control(addr, "allowed.example.com", nil, addr)
		b.httpCaseModes(addr, "allowed.example.com", nil, addr, map[spec.EgressMode]Reason{
			spec.EgressAllow: ReasonNonPublicDst, spec.EgressAllowDomains: ReasonNonPublicDst, spec.EgressOpen: ReasonSandboxLink}, "")
	}},
	{"OtherSandbox/UDP", func(b *bctx) {
		addr := netip.AddrPortFrom(b.other.att.SandboxAddr(), 9001).String()
		udpControl(b, addr, addr)
		udpDropped(b, addr, addr)
	}},
	{"UDP/QUIC", func(b *bctx) {
		udpControl(b, "198.51.100.10:443", "198.51.100.10:443")
		udpDropped(b, "198.51.100.10:443", "198.51.100.10:443")
	}},
	{"Wildcard/Subdomain", func(b *bctx) {
		rc, addrs, err := b.s.resolve(b.ctx, "udp", "a.example.com")
		if b.is(spec.EgressDeny) {
			b.unreachable(err)
			return
		}
		if err != nil || rc != dnsmessage.RCodeSuccess || !slices.Equal(addrs, []netip.Addr{ipA}) {
			b.t.Fatalf("a.example.com: %v %v %v", rc, addrs, err)
		}
		b.httpCase("198.51.100.11:80", "a.example.com", nil, "198.51.100.11:80", "", "", "")
		b.httpCase("198.51.100.11:443", "a.example.com", strp("a.example.com"), "198.51.100.11:443", "", "", "")
	}},
	{"Wildcard/LookAlike", func(b *bctx) {
		m := b.s.mark()
		rc, addrs, err := b.s.resolve(b.ctx, "udp", "evil-example.com")
		switch b.mode {
		case spec.EgressDeny:
			b.unreachable(err)
		case spec.EgressAllow, spec.EgressOpen:
			if err != nil || !slices.Equal(addrs, []netip.Addr{ipEvil}) {
				b.t.Fatalf("allow: evil-example.com: %v %v %v", rc, addrs, err)
			}
		case spec.EgressAllowDomains:
			if err != nil || rc != dnsmessage.RCodeNameError || len(addrs) != 0 {
				b.t.Fatalf("look-alike resolved: %v %v %v", rc, addrs, err)
			}
			b.s.requireRefusal(b.t, m, ReasonNameNotAllowed, "evil-example.com")
		}
		b.httpCase("203.0.113.66:80", "evil-example.com", nil, "203.0.113.66:80", "", ReasonNameNotAllowed, "evil-example.com")
		b.httpCase("203.0.113.66:443", "evil-example.com", strp("evil-example.com"), "203.0.113.66:443", "", ReasonNameNotAllowed, "evil-example.com")
	}},
	{"HTTPNon80", func(b *bctx) {
		b.httpCase(resolved(b, "allowed.example.com", 8080), "allowed.example.com:8080", nil, "198.51.100.10:8080", "", "", "")
	}},
	{"TLSNon443", func(b *bctx) {
		b.httpCase(resolved(b, "allowed.example.com", 8443), "allowed.example.com:8443", strp("allowed.example.com"), "198.51.100.10:8443", "", "", "")
	}},
}

// resolved asks the sandbox's resolver, as a client would; under deny it returns the
// address the name would have had so that the attempt shows "unreachable".
func resolved(b *bctx, name string, port uint16) string {
	b.t.Helper()
	if b.is(spec.EgressDeny) {
		return netip.AddrPortFrom(ipAllowed, port).String()
	}
	rc, addrs, err := b.s.resolve(b.ctx, "udp", name)
	if err != nil || rc != dnsmessage.RCodeSuccess || len(addrs) == 0 {
		b.t.Fatalf("resolve %s: %v %v %v", name, rc, addrs, err)
	}
	return netip.AddrPortFrom(addrs[0], port).String()
}

func hostDial(e *env) func(context.Context, string, string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return e.hostRun.dial(ctx, &net.Dialer{}, network, addr)
	}
}

func dnsQuery(t *testing.T, name string) []byte {
	m := dnsmessage.Message{Header: dnsmessage.Header{ID: 99, RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: dnsmessage.MustNewName(name + "."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}}}
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sendUDP(b *bctx, addr string, payload []byte) {
	b.t.Helper()
	c, err := b.s.dial(b.ctx, "udp", addr)
	if err != nil {
		b.t.Fatalf("udp socket: %v", err)
	}
	defer c.Close()
	if _, err := c.Write(payload); err != nil {
		b.t.Fatalf("udp send: %v", err)
	}
}

// udpControl proves the UDP service answers the host.
func udpControl(b *bctx, addr, hitKey string) {
	b.t.Helper()
	seen := b.e.udpHits.get(hitKey)
	c, err := b.e.hostRun.dial(b.ctx, &net.Dialer{}, "udp", addr)
	if err != nil {
		b.t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	c.Write([]byte("ping"))
	if _, err := c.Read(make([]byte, 16)); err != nil {
		b.t.Fatalf("positive control: UDP %s does not answer the host: %v", addr, err)
	}
	if b.e.udpHits.get(hitKey) != seen+1 {
		b.t.Fatalf("positive control: hits on %s not counted", hitKey)
	}
}

// udpDropped: under deny the datagram cannot be sent; otherwise the kernel drops it and the
// service never sees it.
func udpDropped(b *bctx, addr, hitKey string) {
	b.t.Helper()
	if b.is(spec.EgressDeny) {
		c, err := b.s.dial(b.ctx, "udp", addr)
		if err == nil {
			_, err = c.Write([]byte("quic initial"))
			c.Close()
		}
		b.unreachable(err)
		return
	}
	dropped, seen := b.s.att.Counters().PacketsDropped, b.e.udpHits.get(hitKey)
	sendUDP(b, addr, []byte("quic initial"))
	b.s.waitDropped(b.t, dropped)
	if b.e.udpHits.get(hitKey) != seen {
		b.t.Fatalf("UDP to %s was delivered", addr)
	}
}

// ipv6SelfConfigured: a sandbox with CAP_NET_ADMIN in its namespace gives itself an IPv6
// address and a route through the host's link, and the host would even route the answer
// back. Only the rules stop it.
func ipv6SelfConfigured(b *bctx) {
	t := b.t
	sh, err := netlink.NewHandleAt(b.s.ns)
	must(t, err, "netlink sandbox")
	defer sh.Close()
	links, err := sh.LinkList()
	must(t, err, "links")
	if b.is(spec.EgressDeny) {
		if len(links) != 1 || links[0].Attrs().Name != "lo" {
			t.Fatalf("deny: the sandbox must have only lo, has %d links", len(links))
		}
		return
	}
	hh, err := netlink.NewHandleAt(b.e.host)
	must(t, err, "netlink host")
	defer hh.Close()
	hostLink, err := hh.LinkByName(hostIfName(b.s.id))
	must(t, err, "host link")
	eth0, err := sh.LinkByName("eth0")
	must(t, err, "eth0")
	must(t, sh.LinkSetIP6AddrGenMode(eth0, 0), "addrgen")
	addAddr(t, sh, eth0, "fd00:5b::2/64")
	ll := net.ParseIP("fe80::1")
	must(t, sh.NeighAdd(&netlink.Neigh{LinkIndex: eth0.Attrs().Index, IP: ll, HardwareAddr: hostLink.Attrs().HardwareAddr, State: netlink.NUD_PERMANENT, Family: netlink.FAMILY_V6}), "neigh")
	must(t, sh.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: ll, Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}}), "v6 default route")
	must(t, hh.RouteAdd(&netlink.Route{LinkIndex: hostLink.Attrs().Index, Dst: ipNet(rogue6Net.Addr(), rogue6Net.Bits())}), "host route to rogue v6")
	defer func() {
		hh.RouteDel(&netlink.Route{LinkIndex: hostLink.Attrs().Index, Dst: ipNet(rogue6Net.Addr(), rogue6Net.Bits())})
		sh.RouteDel(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: ll, Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}})
	}()

	before, dropped := b.e.hits.get("[2001:db8::10]:80"), b.s.att.Counters().PacketsDropped
	ctx, cancel := context.WithTimeout(b.ctx, 3*time.Second)
	defer cancel()
	_, err = b.s.request(ctx, "[2001:db8::10]:80", "allowed.example.com", nil)
	if err == nil {
		t.Fatal("IPv6 connection from a self-configured address succeeded")
	}
	b.s.waitDropped(t, dropped)
	if b.e.hits.get("[2001:db8::10]:80") != before {
		t.Fatal("IPv6 server reached")
	}
}

// spoofedSource: a sandbox that gives itself another address cannot use it to reach the
// host (the resolver here), even with the one port that is open to it.
func spoofedSource(b *bctx) {
	t := b.t
	sh, err := netlink.NewHandleAt(b.s.ns)
	must(t, err, "netlink sandbox")
	defer sh.Close()
	if b.is(spec.EgressDeny) {
		links, err := sh.LinkList()
		must(t, err, "links")
		if len(links) != 1 {
			t.Fatalf("deny: the sandbox must have only lo, has %d links", len(links))
		}
		return
	}
	eth0, err := sh.LinkByName("eth0")
	must(t, err, "eth0")
	spoof := netip.MustParseAddr("10.200.77.7")
	addAddr(t, sh, eth0, spoof.String()+"/32")
	defer sh.AddrDel(eth0, &netlink.Addr{IPNet: ipNet(spoof, 32)})
	var c net.Conn
	err = b.s.run.do(func() error {
		var err error
		c, err = (&net.Dialer{LocalAddr: net.UDPAddrFromAddrPort(netip.AddrPortFrom(spoof, 0))}).DialContext(b.ctx, "udp", netip.AddrPortFrom(b.s.att.Resolver(), 53).String())
		return err
	})
	must(t, err, "spoofed socket")
	defer c.Close()
	before, dropped := b.s.att.Counters(), b.s.att.Counters().PacketsDropped
	c.Write(dnsQuery(t, "allowed.example.com"))
	b.s.waitDropped(t, dropped)
	if after := b.s.att.Counters(); after.DNSAllowed != before.DNSAllowed || after.DNSDenied != before.DNSDenied {
		t.Fatalf("the resolver answered a spoofed source: %+v", after)
	}
}

func TestBattery(t *testing.T) {
	e := newEnv(t)
	other := e.newSandbox("other", Policy{Mode: spec.EgressAllow})
	e.serveHTTP(other.run, netip.AddrPortFrom(other.att.SandboxAddr(), 9000).String(), false)
	e.serveUDP(other.run, netip.AddrPortFrom(other.att.SandboxAddr(), 9001).String())
	for _, p := range []Policy{
		{Mode: spec.EgressDeny},
		{Mode: spec.EgressAllow},
		{Mode: spec.EgressAllowDomains, Domains: []string{"*.example.com"}},
		{Mode: spec.EgressOpen},
	} {
		t.Run(string(p.Mode), func(t *testing.T) {
			s := e.newSandbox("bat-"+string(p.Mode), p)
			for _, c := range append(batteryCases, keepAliveCases...) {
				t.Run(c.name, func(t *testing.T) {
					c.run(&bctx{t: t, e: e, s: s, other: other, mode: p.Mode, ctx: ctx10(t)})
				})
			}
		})
	}
}
