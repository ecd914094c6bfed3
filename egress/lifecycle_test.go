package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/net/dns/dnsmessage"

	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

func TestNewGatewayOptions(t *testing.T) {
	bad := []Options{
		{Pool: netip.MustParsePrefix("8.8.0.0/16")},
		{Pool: netip.MustParsePrefix("fd00::/64")},
		{Pool: netip.MustParsePrefix("10.1.0.0/31")},
		{Pool: netip.MustParsePrefix("169.254.0.0/16")},
		{Upstream: []netip.AddrPort{netip.AddrPortFrom(netip.MustParseAddr("192.0.2.53"), 0)}},
		{ExtraPublic: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}},
		{SandboxInterface: "a-name-longer-than-15"},
	}
	for _, o := range bad {
		if g, err := NewGateway(o); !errors.Is(err, sandbox.ErrInvalid) {
			if g != nil {
				g.Close()
			}
			t.Errorf("%+v: want ErrInvalid, got %v", o, err)
		}
	}
	g, err := NewGateway(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if g.opts.Pool != DefaultPool || g.opts.SandboxInterface != "eth0" {
		t.Fatalf("defaults: %+v", g.opts)
	}
	// Without upstream resolvers only deny can be set up; checked before touching anything.
	if _, err := g.Setup(context.Background(), "x", netns.None(), Policy{Mode: spec.EgressAllow}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("allow without Upstream: want ErrInvalid, got %v", err)
	}
	if _, err := g.Setup(context.Background(), "bad id!", netns.None(), Policy{Mode: spec.EgressDeny}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("bad id: want ErrInvalid, got %v", err)
	}
	if _, err := g.Setup(context.Background(), "x", netns.None(), Policy{Mode: "wide"}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("bad policy: want ErrInvalid, got %v", err)
	}
	if _, err := g.Setup(context.Background(), "x", netns.None(), Policy{Mode: spec.EgressDeny}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("closed netns handle: want ErrInvalid, got %v", err)
	}
}

// keepAlive is an HTTP/1.1 connection that stays open between requests.
type keepAlive struct {
	c  net.Conn
	br *bufio.Reader
}

func (k *keepAlive) get(host string) (string, error) {
	k.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(k.c, "GET / HTTP/1.1\r\nHost: "+host+"\r\n\r\n"); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(k.br, nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func TestSetPolicyLive(t *testing.T) {
	e := newEnv(t)
	s := e.newSandbox("live", Policy{Mode: spec.EgressAllowDomains, Domains: []string{"allowed.example.com"}})
	ctx := ctx10(t)
	set := func(p Policy) {
		t.Helper()
		if err := s.att.SetPolicy(ctx, p); err != nil {
			t.Fatalf("SetPolicy(%+v): %v", p, err)
		}
	}
	reach := func(dial, host, local string) {
		t.Helper()
		body, err := s.request(ctx, dial, host, nil)
		if err != nil || !contains(body, "local="+local) {
			t.Fatalf("%s via %s: want reached %s, got %q %v", host, dial, local, body, err)
		}
	}
	refuse := func(dial, host string, reason Reason) {
		t.Helper()
		m := s.mark()
		if body, err := s.request(ctx, dial, host, nil); err == nil {
			t.Fatalf("%s via %s: want refused, got %q", host, dial, body)
		}
		s.requireRefusal(t, m, reason, "")
	}
	rcode := func(name string) dnsmessage.RCode {
		t.Helper()
		rc, _, err := s.resolve(ctx, "udp", name)
		if err != nil {
			t.Fatalf("resolve %s: %v", name, err)
		}
		return rc
	}

	reach("198.51.100.10:80", "allowed.example.com", "198.51.100.10:80")
	refuse("198.51.100.11:80", "a.example.com", ReasonNameNotAllowed)
	if rcode("a.example.com") != dnsmessage.RCodeNameError {
		t.Fatal("a.example.com resolved before widening")
	}
	c, err := s.dial(ctx, "tcp", "198.51.100.10:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ka := &keepAlive{c: c, br: bufio.NewReader(c)}
	if body, err := ka.get("allowed.example.com"); err != nil || !contains(body, "198.51.100.10:80") {
		t.Fatalf("keep-alive: %q %v", body, err)
	}

	// Widen.
	set(Policy{Mode: spec.EgressAllowDomains, Domains: []string{"allowed.example.com", "*.example.com"}})
	reach("198.51.100.11:80", "a.example.com", "198.51.100.11:80")
	if rcode("a.example.com") != dnsmessage.RCodeSuccess {
		t.Fatal("a.example.com does not resolve after widening")
	}

	// Tighten: new connections and queries follow at once; the open connection lives on.
	set(Policy{Mode: spec.EgressAllowDomains, Domains: []string{"a.example.com"}})
	refuse("198.51.100.10:80", "allowed.example.com", ReasonNameNotAllowed)
	if rcode("allowed.example.com") != dnsmessage.RCodeNameError {
		t.Fatal("allowed.example.com still resolves after tightening")
	}
	reach("198.51.100.11:80", "a.example.com", "198.51.100.11:80")
	if body, err := ka.get("allowed.example.com"); err != nil || !contains(body, "198.51.100.10:80") {
		t.Fatalf("an established connection must survive tightening (documented): %q %v", body, err)
	}

	// allow: names no longer matter, addresses still do.
	set(Policy{Mode: spec.EgressAllow})
	reach("198.51.100.10:80", "198.51.100.10", "198.51.100.10:80")
	refuse("10.0.0.5:80", "allowed.example.com", ReasonNonPublicDst)
	refuse("169.254.169.254:80", "allowed.example.com", ReasonNonPublicDst)
	if _, addrs, _ := s.resolve(ctx, "udp", "rebind.example.com"); len(addrs) != 0 {
		t.Fatalf("allow: a private answer passed: %v", addrs)
	}

	// open: private and metadata addresses too, and private answers pass; a connection
	// opened under allow lives on.
	set(Policy{Mode: spec.EgressOpen})
	reach("10.0.0.5:80", "private.internal", "10.0.0.5:80")
	reach("169.254.169.254:80", "metadata", "169.254.169.254:80")
	reach("198.51.100.10:80", "allowed.example.com", "198.51.100.10:80")
	if _, addrs, err := s.resolve(ctx, "udp", "rebind.example.com"); err != nil || !slices.Equal(addrs, []netip.Addr{ipPrivate}) {
		t.Fatalf("open: rebind.example.com resolves to %v (%v), want %v", addrs, err, ipPrivate)
	}
	if body, err := ka.get("allowed.example.com"); err != nil || !contains(body, "198.51.100.10:80") {
		t.Fatalf("an established connection must survive allow → open: %q %v", body, err)
	}
	// And back to allow: the private address is refused again at once.
	set(Policy{Mode: spec.EgressAllow})
	refuse("10.0.0.5:80", "private.internal", ReasonNonPublicDst)
	set(Policy{Mode: spec.EgressOpen})
	reach("10.0.0.5:80", "private.internal", "10.0.0.5:80")

	// deny: the link goes, and the open connection with it.
	hostIf := hostIfName(s.id)
	set(Policy{Mode: spec.EgressDeny})
	if _, err := ka.get("allowed.example.com"); err == nil {
		t.Fatal("an open connection survived deny")
	}
	if _, err := s.request(ctx, "198.51.100.10:80", "allowed.example.com", nil); !isUnreachable(err) {
		t.Fatalf("deny: want unreachable, got %v", err)
	}
	if s.att.Resolver().IsValid() || strings.Contains(string(s.att.ResolvConf()), "nameserver") {
		t.Fatalf("deny: resolver %v, resolv.conf %q", s.att.Resolver(), s.att.ResolvConf())
	}
	requireNoTrace(t, e, s, hostIf)

	// And back to open from deny: the link is rebuilt.
	set(Policy{Mode: spec.EgressOpen})
	reach("10.0.0.5:80", "private.internal", "10.0.0.5:80")

	// And to allowDomains.
	set(Policy{Mode: spec.EgressAllowDomains, Domains: []string{"*.example.com"}})
	refuse("10.0.0.5:80", "private.internal", ReasonNonPublicDst)
	if got := string(s.att.ResolvConf()); !strings.Contains(got, "nameserver "+s.att.Resolver().String()+"\n") {
		t.Fatalf("resolv.conf %q", got)
	}
	reach("198.51.100.11:80", "a.example.com", "198.51.100.11:80")

	// A bad policy changes nothing.
	if err := s.att.SetPolicy(ctx, Policy{Mode: spec.EgressAllowDomains}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("want ErrInvalid, got %v", err)
	}
	if p := s.att.Policy(); p.Mode != spec.EgressAllowDomains || len(p.Domains) != 1 {
		t.Fatalf("policy changed by a failed SetPolicy: %+v", p)
	}
}

func TestCounters(t *testing.T) {
	e := newEnv(t)
	s := e.newSandbox("count", Policy{Mode: spec.EgressAllow})
	ctx := ctx10(t)
	if c := s.att.Counters(); c != (Counters{}) {
		t.Fatalf("fresh counters not zero: %+v", c)
	}

	// Exact bytes through the echo server.
	const n = 3<<20 + 123
	c, err := s.dial(ctx, "tcp", "198.51.100.10:7")
	if err != nil {
		t.Fatal(err)
	}
	payload := make([]byte, n)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	go func() {
		c.Write(payload)
		c.(*net.TCPConn).CloseWrite()
	}()
	back, err := io.ReadAll(c)
	c.Close()
	if err != nil || len(back) != n || string(back) != string(payload) {
		t.Fatalf("echo: %d bytes, %v", len(back), err)
	}
	waitCounters(t, s, func(c Counters) bool { return c.BytesSent == n && c.BytesReceived == n })

	// A refused connection, a dropped datagram, an answered and a stripped query.
	if _, err := s.request(ctx, "10.0.0.5:80", "x", nil); err == nil {
		t.Fatal("private destination reached")
	}
	u, err := s.dial(ctx, "udp", "198.51.100.10:443")
	if err != nil {
		t.Fatal(err)
	}
	u.Write([]byte("x"))
	u.Close()
	if _, _, err := s.resolve(ctx, "udp", "allowed.example.com"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.resolve(ctx, "udp", "rebind.example.com"); err != nil {
		t.Fatal(err)
	}
	waitCounters(t, s, func(c Counters) bool { return c.PacketsDropped >= 1 })
	got := s.att.Counters()
	want := Counters{ConnsAllowed: 1, ConnsDenied: 1, BytesSent: n, BytesReceived: n, DNSAllowed: 1, DNSDenied: 1, PacketsDropped: got.PacketsDropped}
	if got != want {
		t.Fatalf("counters %+v, want %+v", got, want)
	}

	// Under allowDomains the peeked head is counted too: exactly what the client sent.
	if err := s.att.SetPolicy(ctx, Policy{Mode: spec.EgressAllowDomains, Domains: []string{"allowed.example.com"}}); err != nil {
		t.Fatal(err)
	}
	before := s.att.Counters()
	req := "GET / HTTP/1.1\r\nHost: allowed.example.com\r\nConnection: close\r\n\r\n"
	hc, err := s.dial(ctx, "tcp", "198.51.100.10:80")
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(hc, req)
	resp, err := io.ReadAll(hc)
	hc.Close()
	if err != nil || !strings.Contains(string(resp), "local=198.51.100.10:80") {
		t.Fatalf("%q %v", resp, err)
	}
	waitCounters(t, s, func(c Counters) bool {
		return c.BytesSent == before.BytesSent+uint64(len(req)) && c.BytesReceived == before.BytesReceived+uint64(len(resp))
	})
	// A target that accepts nothing: allowed by policy, counted as a dial failure.
	if _, err := s.request(ctx, "198.51.100.10:81", "allowed.example.com", nil); err == nil {
		t.Fatal("port 81 answered")
	}
	if c := s.att.Counters(); c.DialFailures != 1 || c.ConnsAllowed != before.ConnsAllowed+2 {
		t.Fatalf("dial failure not counted: %+v", c)
	}
	// Counters survive a trip through deny, which tears the kernel counter down.
	dropped := s.att.Counters().PacketsDropped
	if err := s.att.SetPolicy(ctx, Policy{Mode: spec.EgressDeny}); err != nil {
		t.Fatal(err)
	}
	if c := s.att.Counters(); c.PacketsDropped != dropped || c.BytesSent == 0 {
		t.Fatalf("counters lost across deny: %+v (dropped before %d)", c, dropped)
	}
}

func waitCounters(t *testing.T, s *sbox, ok func(Counters) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok(s.att.Counters()) {
		if time.Now().After(deadline) {
			t.Fatalf("counters never got there: %+v", s.att.Counters())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// requireNoTrace checks that nothing of s's link is left: no host link, no table, nothing
// but lo in the sandbox, nothing listening on its old gateway address.
func requireNoTrace(t *testing.T, e *env, s *sbox, hostIf string) {
	t.Helper()
	hh, err := netlink.NewHandleAt(e.host)
	must(t, err, "netlink host")
	defer hh.Close()
	links, err := hh.LinkList()
	must(t, err, "host links")
	for _, l := range links {
		if l.Attrs().Name == hostIf {
			t.Errorf("host link %s left behind", l.Attrs().Name)
		}
	}
	addrs, err := hh.AddrList(nil, netlink.FAMILY_V4)
	must(t, err, "host addrs")
	for _, a := range addrs {
		if ip, _ := netip.AddrFromSlice(a.IP.To4()); DefaultPool.Contains(ip) && !otherLive(e, ip) {
			t.Errorf("pool address %s left behind", ip)
		}
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(e.host)))
	must(t, err, "nftables")
	tables, err := c.ListTables()
	must(t, err, "list tables")
	for _, tb := range tables {
		if tb.Name == tableName(s.id) {
			t.Errorf("nftables table %s left behind", tb.Name)
		}
	}
	sh, err := netlink.NewHandleAt(s.ns)
	must(t, err, "netlink sandbox")
	defer sh.Close()
	sl, err := sh.LinkList()
	must(t, err, "sandbox links")
	if len(sl) != 1 || sl[0].Attrs().Name != "lo" {
		var names []string
		for _, l := range sl {
			names = append(names, l.Attrs().Name)
		}
		t.Errorf("sandbox links left: %v", names)
	}
}

// socketsOn counts live TCP and UDP sockets in the host namespace whose local address is ip, from
// /proc/thread-self/net/{tcp,udp} read inside that namespace.
func socketsOn(t *testing.T, e *env, ip netip.Addr) int {
	t.Helper()
	b := ip.As4()
	want := strings.ToUpper(fmt.Sprintf("%02x%02x%02x%02x:", b[3], b[2], b[1], b[0]))
	n := 0
	err := e.hostRun.do(func() error {
		for _, f := range []string{"/proc/thread-self/net/tcp", "/proc/thread-self/net/udp"} {
			data, err := os.ReadFile(f)
			if err != nil {
				return err
			}
			for _, line := range strings.Split(string(data), "\n")[1:] {
				fields := strings.Fields(line)
				// UDP sockets, and TCP ones that are listening or established (an open fd);
				// closed connections linger in FIN_WAIT/TIME_WAIT without any fd of ours.
				if len(fields) > 3 && strings.HasPrefix(fields[1], want) &&
					(strings.HasSuffix(f, "udp") || fields[3] == "0A" || fields[3] == "01") {
					n++
				}
			}
		}
		return nil
	})
	must(t, err, "read socket tables")
	return n
}

// otherLive reports whether ip belongs to a sandbox still attached to e's gateway.
func otherLive(e *env, ip netip.Addr) bool {
	e.gw.mu.Lock()
	defer e.gw.mu.Unlock()
	for blk := range e.gw.blocks {
		if blk.Contains(ip) {
			return true
		}
	}
	return false
}

func TestCloseLeavesNothing(t *testing.T) {
	e := newEnv(t)
	ctx := ctx10(t)
	s1 := e.newSandbox("close-a", Policy{Mode: spec.EgressAllow})
	s2 := e.newSandbox("close-b", Policy{Mode: spec.EgressAllowDomains, Domains: []string{"*.example.com"}})
	gw1 := s1.att.Resolver()

	// An open proxied connection and an open DNS-over-TCP connection must end with Close.
	echo, err := s1.dial(ctx, "tcp", "198.51.100.10:7")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	io.WriteString(echo, "ping")
	if _, err := io.ReadFull(echo, make([]byte, 4)); err != nil {
		t.Fatal(err)
	}
	dnsConn, err := s1.dial(ctx, "tcp", netip.AddrPortFrom(gw1, 53).String())
	if err != nil {
		t.Fatal(err)
	}
	defer dnsConn.Close()

	if n := socketsOn(t, e, gw1); n < 3 { // resolver udp+tcp, proxy listener, the DNS connection
		t.Fatalf("socket table check sees only %d sockets on %s before Close", n, gw1)
	}
	if err := e.gw.Close(); !errors.Is(err, sandbox.ErrConflict) {
		t.Fatalf("gateway close with live attachments: want ErrConflict, got %v", err)
	}
	for _, s := range []*sbox{s1, s2} {
		if err := s.att.Close(); err != nil {
			t.Fatalf("close %s: %v", s.id, err)
		}
		if err := s.att.Close(); err != nil {
			t.Fatalf("second close %s: %v", s.id, err)
		}
		requireNoTrace(t, e, s, hostIfName(s.id))
		if err := s.att.SetPolicy(ctx, Policy{Mode: spec.EgressAllow}); !errors.Is(err, sandbox.ErrInvalid) {
			t.Fatalf("SetPolicy after Close: want ErrInvalid, got %v", err)
		}
	}
	echo.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := echo.Read(make([]byte, 1)); err == nil || errors.Is(err, net.ErrClosed) {
		t.Fatalf("proxied connection still open after Close: %v", err)
	}
	dnsConn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := dnsConn.Read(make([]byte, 1)); err == nil {
		t.Fatal("DNS connection still open after Close")
	}
	// No socket of the resolver or the proxy is left on the old gateway address.
	if n := socketsOn(t, e, gw1); n != 0 {
		t.Fatalf("%d sockets still bound to %s after Close", n, gw1)
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(e.host)))
	must(t, err, "nftables")
	tables, err := c.ListTables()
	must(t, err, "list tables")
	for _, tb := range tables {
		if strings.HasPrefix(tb.Name, "airlock_") {
			t.Errorf("table %s left behind", tb.Name)
		}
	}
}

func TestPoolAndLeftovers(t *testing.T) {
	e := newEnv(t)
	hostNS := e.host
	g, err := NewGateway(Options{HostNetns: &hostNS, Pool: netip.MustParsePrefix("10.201.0.0/29"),
		Upstream: []netip.AddrPort{netip.AddrPortFrom(ipUpstream, 53)}})
	must(t, err, "gateway")
	defer g.Close()
	ctx := ctx10(t)
	allow := Policy{Mode: spec.EgressAllow}

	ns1, ns2, ns3 := newNetns(t), newNetns(t), newNetns(t)
	a1, err := g.Setup(ctx, "p1", ns1, allow)
	must(t, err, "p1")
	a2, err := g.Setup(ctx, "p2", ns2, allow)
	must(t, err, "p2")
	if a1.SandboxAddr() != netip.MustParseAddr("10.201.0.2") || a2.SandboxAddr() != netip.MustParseAddr("10.201.0.6") || a1.Resolver() != netip.MustParseAddr("10.201.0.1") {
		t.Fatalf("numbering: %v %v %v", a1.SandboxAddr(), a2.SandboxAddr(), a1.Resolver())
	}
	if _, err := g.Setup(ctx, "p1", ns3, allow); !errors.Is(err, sandbox.ErrConflict) {
		t.Fatalf("duplicate id: want ErrConflict, got %v", err)
	}
	if _, err := g.Setup(ctx, "p3", ns3, allow); !errors.Is(err, sandbox.ErrConflict) {
		t.Fatalf("full pool: want ErrConflict, got %v", err)
	}
	must(t, a1.Close(), "close p1")
	a3, err := g.Setup(ctx, "p3", ns3, allow)
	must(t, err, "p3 after a block was freed")
	if a3.SandboxAddr() != netip.MustParseAddr("10.201.0.2") {
		t.Fatalf("freed block not reused: %v", a3.SandboxAddr())
	}
	must(t, a3.Close(), "close p3")

	// A sandbox that already has the interface name we would use: refused, nothing left.
	sh, err := netlink.NewHandleAt(ns1)
	must(t, err, "netlink")
	defer sh.Close()
	must(t, sh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth1"}), "veth in sandbox")
	if _, err := g.Setup(ctx, "p4", ns1, allow); !errors.Is(err, sandbox.ErrConflict) {
		t.Fatalf("existing eth0: want ErrConflict, got %v", err)
	}
	l, _ := sh.LinkByName("eth0")
	sh.LinkDel(l)
	requireNoTrace(t, e, &sbox{id: "p4", ns: ns1}, hostIfName("p4"))

	// Leftovers of a crashed process (a host link and a table) block Setup until Cleanup.
	hh, err := netlink.NewHandleAt(e.host)
	must(t, err, "netlink host")
	defer hh.Close()
	must(t, hh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostIfName("crashed")}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns1))}), "leftover veth")
	_, err = g.installDrops(tableName("crashed"), hostIfName("crashed"))
	must(t, err, "leftover table")
	if _, err := g.Setup(ctx, "crashed", ns1, allow); !errors.Is(err, sandbox.ErrConflict) {
		t.Fatalf("leftover link: want ErrConflict, got %v", err)
	}
	if _, err := hh.LinkByName(hostIfName("crashed")); err != nil {
		t.Fatal("a refused Setup removed a link it did not make")
	}
	if err := g.Cleanup(ctx, "p2"); !errors.Is(err, sandbox.ErrConflict) {
		t.Fatalf("Cleanup of a live attachment: want ErrConflict, got %v", err)
	}
	must(t, g.Cleanup(ctx, "crashed"), "cleanup")
	requireNoTrace(t, e, &sbox{id: "crashed", ns: ns1}, hostIfName("crashed"))
	a5, err := g.Setup(ctx, "crashed", ns1, allow)
	must(t, err, "setup after cleanup")
	must(t, a5.Close(), "close")
	must(t, a2.Close(), "close p2")
}

// TestDenyIsLoopbackOnly: deny creates nothing and leaves the sandbox its loopback.
func TestDenyIsLoopbackOnly(t *testing.T) {
	e := newEnv(t)
	s := e.newSandbox("deny-lo", Policy{Mode: spec.EgressDeny})
	requireNoTrace(t, e, s, hostIfName(s.id))
	ln, err := s.run.listen(context.Background(), "tcp", "127.0.0.1:0")
	must(t, err, "listen on sandbox loopback")
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := s.dial(ctx10(t), "tcp", ln.Addr().String())
	must(t, err, "loopback inside the sandbox works under deny")
	c.Close()
	for _, addr := range []string{"198.51.100.10:80", "169.254.169.254:80", "10.0.0.5:80", "192.0.2.2:80"} {
		if _, err := s.dial(ctx10(t), "tcp", addr); !isUnreachable(err) {
			t.Errorf("%s: want unreachable, got %v", addr, err)
		}
	}
}

// TestProxyServesOnlyItsSandbox: a host process that connects to a sandbox's proxy port is
// not relayed under that sandbox's policy.
func TestProxyServesOnlyItsSandbox(t *testing.T) {
	e := newEnv(t)
	s := e.newSandbox("relay", Policy{Mode: spec.EgressAllow})
	s.att.mu.Lock()
	proxy := s.att.net.proxyLn.Addr().String()
	s.att.mu.Unlock()
	before, m := e.hits.get("198.51.100.10:80"), s.mark()
	if body, err := e.hostRequest(ctx10(t), proxy, "allowed.example.com", nil); err == nil {
		t.Fatalf("the proxy relayed a host connection: %q", body)
	}
	if e.hits.get("198.51.100.10:80") != before {
		t.Fatal("destination reached")
	}
	s.requireRefusal(t, m, ReasonUnexpectedSource, "")
}

func TestProbe(t *testing.T) {
	testutil.RequireRoot(t)
	if err := Probe(); err != nil {
		t.Fatalf("this machine has veth and nftables (DESIGN.md), probe says: %v", err)
	}
}

func TestMaxConns(t *testing.T) {
	e := newEnv(t)
	hostNS := e.host
	g, err := NewGateway(Options{HostNetns: &hostNS, Pool: netip.MustParsePrefix("10.202.0.0/24"),
		Upstream: []netip.AddrPort{netip.AddrPortFrom(ipUpstream, 53)}, ExtraPublic: e.gw.opts.ExtraPublic,
		Logger: e.gw.log, MaxConns: 2})
	must(t, err, "gateway")
	defer g.Close()
	ns := newNetns(t)
	a, err := g.Setup(ctx10(t), "maxc", ns, Policy{Mode: spec.EgressAllow})
	must(t, err, "setup")
	defer a.Close()
	s := &sbox{e: e, id: "maxc", ns: ns, run: nsRunner{ns: ns}, att: a}
	ctx := ctx10(t)
	echo := func() (net.Conn, error) {
		c, err := s.dial(ctx, "tcp", "198.51.100.10:7")
		if err != nil {
			return nil, err
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		got := make([]byte, 1)
		_, err = io.WriteString(c, "x")
		if err == nil {
			_, err = io.ReadFull(c, got)
		}
		if err == nil && got[0] != 'x' {
			err = fmt.Errorf("echo returned %q", got)
		}
		if err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
	c1, err := echo()
	must(t, err, "first")
	defer c1.Close()
	c2, err := echo()
	must(t, err, "second")
	m := s.mark()
	if c3, err := echo(); err == nil {
		c3.Close()
		t.Fatal("a third simultaneous connection was proxied with MaxConns 2")
	}
	s.requireRefusal(t, m, ReasonTooManyConns, "")
	c2.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		a.mu.Lock()
		n := a.net.active.Load()
		a.mu.Unlock()
		if n < 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("closed connection still counted (%d active)", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	c4, err := echo()
	must(t, err, "after one closed")
	c4.Close()
}
