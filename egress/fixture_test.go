package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// The fake world every root test builds, entirely inside namespaces it creates:
//
//	sandbox netns ──veth (Setup)── "host" netns ──up0/up1── "internet" netns
//	                                 10.0.0.5 private svc        198.51.100.10 allowed.example.com
//	                                 172.16.0.5, 192.168.0.5,
//	                                 100.64.0.5 private too
//	                                 169.254.169.254 metadata    198.51.100.11 a.example.com
//	                                 192.0.2.2 the host itself   203.0.113.66  evil-example.com
//	                                 forwarding on (worst case)  203.0.113.53  our upstream DNS
//	                                                             198.51.100.53 a foreign resolver
//	                                                             2001:db8::10  IPv6 web
//
// The internet routes the sandbox pool and fd00:5b::/64 back to the host, so that anything
// the host forwarded would get an answer: only our rules stand in the way.

var (
	ipAllowed    = netip.MustParseAddr("198.51.100.10")
	ipA          = netip.MustParseAddr("198.51.100.11")
	ipForeign    = netip.MustParseAddr("198.51.100.53")
	ipEvil       = netip.MustParseAddr("203.0.113.66")
	ipUpstream   = netip.MustParseAddr("203.0.113.53")
	ipWeb6       = netip.MustParseAddr("2001:db8::10")
	ipPrivate    = netip.MustParseAddr("10.0.0.5")
	ipPrivate172 = netip.MustParseAddr("172.16.0.5")
	ipPrivate192 = netip.MustParseAddr("192.168.0.5")
	ipCGNAT      = netip.MustParseAddr("100.64.0.5")
	ipMetadata   = netip.MustParseAddr("169.254.169.254")
	ipHost       = netip.MustParseAddr("192.0.2.2")
	ipInetUp     = netip.MustParseAddr("192.0.2.1")
	ipHost6      = netip.MustParseAddr("2001:db8:1::2")
	ipInet6      = netip.MustParseAddr("2001:db8:1::1")
	rogue6Net    = netip.MustParsePrefix("fd00:5b::/64")
)

type env struct {
	tb         testing.TB
	host, inet netns.NsHandle
	hostRun    nsRunner
	inetRun    nsRunner
	gw         *Gateway
	logs       *logCapture
	upstream   *fakeDNS
	foreign    *fakeDNS
	pki        *testPKI
	hits       *hitCounter
	udpHits    *hitCounter
}

type hitCounter struct {
	mu sync.Mutex
	m  map[string]int
}

func (h *hitCounter) add(k string) {
	h.mu.Lock()
	h.m[k]++
	h.mu.Unlock()
}

func (h *hitCounter) get(k string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.m[k]
}

// newNetns creates an anonymous network namespace that lives until the test ends.
func newNetns(tb testing.TB) netns.NsHandle {
	tb.Helper()
	h, err := newThrowawayNetns()
	if err != nil {
		tb.Fatalf("new netns: %v", err)
	}
	tb.Cleanup(func() { h.Close() })
	return h
}

func must(tb testing.TB, err error, what string) {
	tb.Helper()
	if err != nil {
		tb.Fatalf("%s: %v", what, err)
	}
}

func addAddr(tb testing.TB, h *netlink.Handle, l netlink.Link, cidr string) {
	tb.Helper()
	a, err := netlink.ParseAddr(cidr)
	must(tb, err, cidr)
	a.Flags = unix.IFA_F_NODAD
	must(tb, h.AddrAdd(l, a), "addr "+cidr)
}

func linkUp(tb testing.TB, h *netlink.Handle, name string) netlink.Link {
	tb.Helper()
	l, err := h.LinkByName(name)
	must(tb, err, name)
	must(tb, h.LinkSetUp(l), "up "+name)
	return l
}

func newEnv(tb testing.TB) *env {
	tb.Helper()
	testutil.RequireRoot(tb)
	e := &env{tb: tb, logs: newLogCapture(), hits: &hitCounter{m: map[string]int{}}, udpHits: &hitCounter{m: map[string]int{}}}
	e.host, e.inet = newNetns(tb), newNetns(tb)
	e.hostRun, e.inetRun = nsRunner{ns: e.host}, nsRunner{ns: e.inet}

	hh, err := netlink.NewHandleAt(e.host)
	must(tb, err, "netlink host")
	defer hh.Close()
	ih, err := netlink.NewHandleAt(e.inet)
	must(tb, err, "netlink inet")
	defer ih.Close()

	must(tb, hh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "up0"}, PeerName: "up1", PeerNamespace: netlink.NsFd(int(e.inet))}), "uplink veth")
	// Service addresses live on lo (this kernel has no dummy links).
	priv0 := linkUp(tb, hh, "lo")
	web0 := linkUp(tb, ih, "lo")
	up0 := linkUp(tb, hh, "up0")
	up1 := linkUp(tb, ih, "up1")
	addAddr(tb, hh, up0, ipHost.String()+"/24")
	addAddr(tb, hh, up0, ipHost6.String()+"/64")
	addAddr(tb, ih, up1, ipInetUp.String()+"/24")
	addAddr(tb, ih, up1, ipInet6.String()+"/64")
	addAddr(tb, hh, priv0, ipPrivate.String()+"/32")
	addAddr(tb, hh, priv0, ipMetadata.String()+"/32")
	for _, a := range []netip.Addr{ipPrivate172, ipPrivate192, ipCGNAT} {
		addAddr(tb, hh, priv0, a.String()+"/32")
	}
	for _, a := range []netip.Addr{ipAllowed, ipA, ipForeign, ipEvil, ipUpstream} {
		addAddr(tb, ih, web0, a.String()+"/32")
	}
	addAddr(tb, ih, web0, ipWeb6.String()+"/128")
	must(tb, hh.RouteAdd(&netlink.Route{LinkIndex: up0.Attrs().Index, Gw: ipInetUp.AsSlice()}), "host default route")
	must(tb, hh.RouteAdd(&netlink.Route{LinkIndex: up0.Attrs().Index, Gw: ipInet6.AsSlice(), Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}}), "host default route v6")
	must(tb, ih.RouteAdd(&netlink.Route{LinkIndex: up1.Attrs().Index, Gw: ipHost.AsSlice(), Dst: ipNet(DefaultPool.Addr(), DefaultPool.Bits())}), "inet route to pool")
	must(tb, ih.RouteAdd(&netlink.Route{LinkIndex: up1.Attrs().Index, Gw: ipHost6.AsSlice(), Dst: ipNet(rogue6Net.Addr(), rogue6Net.Bits())}), "inet route to rogue v6")
	// Worst case host: it routes, like a host running Docker does.
	must(tb, e.hostRun.writeSysctl("/proc/sys/net/ipv4/ip_forward", "1"), "ip_forward")
	must(tb, e.hostRun.writeSysctl("/proc/sys/net/ipv6/conf/all/forwarding", "1"), "ipv6 forwarding")

	names := []string{"allowed.example.com", "a.example.com", "evil-example.com", "rebind.example.com"}
	e.pki = newTestPKI(tb, names, []netip.Addr{ipAllowed, ipA, ipEvil, ipWeb6})
	e.startWeb()
	e.upstream = e.startDNS(ipUpstream)
	e.foreign = e.startDNS(ipForeign)

	// Warm the host's neighbour entries: the first ARP on a link that just came up can be
	// lost, which costs a one-second retry in whatever runs first.
	for _, a := range []string{"198.51.100.10:80", "[2001:db8::10]:80"} {
		c, err := e.hostRun.dial(ctx10(tb), &net.Dialer{}, "tcp", a)
		must(tb, err, "warm-up "+a)
		c.Close()
	}

	hostNS := e.host
	e.gw, err = NewGateway(Options{
		HostNetns:   &hostNS,
		Upstream:    []netip.AddrPort{netip.AddrPortFrom(ipUpstream, 53)},
		ExtraPublic: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("2001:db8::/32")},
		Logger:      slog.New(e.logs),
		PeekTimeout: 3 * time.Second,
	})
	must(tb, err, "gateway")
	tb.Cleanup(func() {
		if err := e.gw.Close(); err != nil {
			tb.Errorf("gateway close: %v", err)
		}
	})
	return e
}

// webHandler answers with what the server saw, so a test can tell which host it reached.
func (e *env) webHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		local := r.Context().Value(http.LocalAddrContextKey).(net.Addr).String()
		e.hits.add(local)
		e.hits.add(r.Host + "@" + local) // which virtual host of that address was asked
		if first, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/"); first != "" {
			e.hits.add("/" + first + "@" + local) // and under which first path segment
		}
		if strings.HasSuffix(r.URL.Path, "/upgrade") && r.Header.Get("Upgrade") == "echo" {
			// A protocol switch: after the 101 the connection echoes raw bytes.
			c, rw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
			rw.Flush()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			io.Copy(c, rw)
			return
		}
		if r.URL.Path == "/big" {
			w.Write(make([]byte, 1<<20))
			return
		}
		fmt.Fprintf(w, "host=%s local=%s", r.Host, local)
	})
}

func (e *env) serveHTTP(run nsRunner, addr string, useTLS bool) {
	ln, err := run.listen(context.Background(), "tcp", addr)
	must(e.tb, err, "listen "+addr)
	if useTLS {
		ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{e.pki.cert}})
	}
	srv := &http.Server{Handler: e.webHandler(), ErrorLog: nil, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ln) }()
	e.tb.Cleanup(func() { srv.Close(); <-done })
}

func (e *env) startWeb() {
	for _, p := range []struct {
		addr string
		tls  bool
	}{{":80", false}, {":8080", false}, {":443", true}, {":8443", true}} {
		e.serveHTTP(e.inetRun, p.addr, p.tls)
	}
	e.serveHTTP(e.hostRun, ":80", false) // private service, metadata, the host's own address
	e.serveEcho(e.inetRun, netip.AddrPortFrom(ipAllowed, 7).String())
	e.serveUDP(e.inetRun, netip.AddrPortFrom(ipAllowed, 443).String()) // "QUIC"
	e.serveUDP(e.hostRun, ":9053")                                     // a UDP service of the host
}

// serveEcho echoes every byte back; for exact byte counters and throughput.
func (e *env) serveEcho(run nsRunner, addr string) {
	ln, err := run.listen(context.Background(), "tcp", addr)
	must(e.tb, err, "listen echo")
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = true
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				io.Copy(c, c)
				c.(*net.TCPConn).CloseWrite()
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
				c.Close()
			}()
		}
	}()
	e.tb.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

// serveUDP counts datagrams under addr as given and echoes them.
func (e *env) serveUDP(run nsRunner, addr string) {
	pc, err := run.listenPacket(context.Background(), "udp", addr)
	must(e.tb, err, "listen udp "+addr)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			e.udpHits.add(addr) // the bound address: ":9053" counts the port on every address
			pc.WriteTo(buf[:n], from)
		}
	}()
	e.tb.Cleanup(func() { pc.Close(); <-done })
}

func (e *env) startDNS(ip netip.Addr) *fakeDNS {
	f := newFakeDNS()
	f.records["allowed.example.com"] = []netip.Addr{ipAllowed}
	f.records["a.example.com"] = []netip.Addr{ipA}
	f.records["evil-example.com"] = []netip.Addr{ipEvil}
	f.records["rebind.example.com"] = []netip.Addr{ipPrivate}
	addr := netip.AddrPortFrom(ip, 53).String()
	pc, err := e.inetRun.listenPacket(context.Background(), "udp", addr)
	must(e.tb, err, "dns udp")
	ln, err := e.inetRun.listen(context.Background(), "tcp", addr)
	must(e.tb, err, "dns tcp")
	f.serve(pc, ln)
	e.tb.Cleanup(f.close)
	return f
}

// sbox is one sandbox: its namespace and attachment.
type sbox struct {
	e   *env
	id  string
	ns  netns.NsHandle
	run nsRunner
	att *Attachment
}

func (e *env) newSandbox(id string, p Policy) *sbox {
	e.tb.Helper()
	s := &sbox{e: e, id: id, ns: newNetns(e.tb)}
	s.run = nsRunner{ns: s.ns}
	att, err := e.gw.Setup(context.Background(), id, s.ns, p)
	must(e.tb, err, "setup "+id)
	s.att = att
	e.tb.Cleanup(func() {
		if err := att.Close(); err != nil {
			e.tb.Errorf("close %s: %v", id, err)
		}
	})
	return s
}

func ctx10(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

func (s *sbox) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	return s.run.dial(ctx, &net.Dialer{}, network, addr)
}

// resolverAddr is where the sandbox sends DNS; under deny (no link) the address it would
// have had, so that the attempt shows "unreachable".
func (s *sbox) resolverAddr() string {
	r := s.att.Resolver()
	if !r.IsValid() {
		r = netip.MustParseAddr("10.200.0.1")
	}
	return netip.AddrPortFrom(r, 53).String()
}

func (s *sbox) resolve(ctx context.Context, network, name string) (dnsmessage.RCode, []netip.Addr, error) {
	return query(ctx, s.dial, s.resolverAddr(), network, name, dnsmessage.TypeA)
}

// request makes one HTTP/1.1 GET to dialAddr naming host; with sni != nil over TLS with
// that server name (an IP literal sends no SNI, as every client does).
func request(ctx context.Context, dial func(context.Context, string, string) (net.Conn, error), pool *x509.CertPool, dialAddr, host string, sni *string) (string, error) {
	c, err := dial(ctx, "tcp", dialAddr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if sni != nil {
		tc := tls.Client(c, &tls.Config{ServerName: *sni, RootCAs: pool})
		if err := tc.HandshakeContext(ctx); err != nil {
			return "", err
		}
		c = tc
	}
	var req string
	if host != "" {
		req = "GET / HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n"
	} else {
		req = "GET / HTTP/1.0\r\n"
	}
	if _, err := io.WriteString(c, req+"\r\n"); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func (s *sbox) request(ctx context.Context, dialAddr, host string, sni *string) (string, error) {
	return request(ctx, s.dial, s.e.pki.pool, dialAddr, host, sni)
}

// hostRequest is the positive control: the same request from the host namespace.
func (e *env) hostRequest(ctx context.Context, dialAddr, host string, sni *string) (string, error) {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		return e.hostRun.dial(ctx, &net.Dialer{}, network, addr)
	}
	return request(ctx, dial, e.pki.pool, dialAddr, host, sni)
}

func strp(s string) *string { return &s }

// waitDropped waits until the kernel rules have dropped more than before packets for s; a
// drop is positive evidence, so nothing here relies on a timeout expiring.
func (s *sbox) waitDropped(tb testing.TB, before uint64) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.att.Counters().PacketsDropped <= before {
		if time.Now().After(deadline) {
			tb.Fatalf("no packet was dropped (counter %d)", before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// mark remembers how many refusals were logged, so a test can look at the new ones.
func (s *sbox) mark() int { return len(s.e.logs.refusals(s.id)) }

func (s *sbox) requireRefusal(tb testing.TB, since int, reason Reason, name string) {
	tb.Helper()
	recs := s.e.logs.refusals(s.id)[since:]
	for _, r := range recs {
		if r["reason"] == string(reason) && (name == "" || r["name"] == name) {
			return
		}
	}
	tb.Fatalf("no refusal %q (name %q) logged for %s; got %v", reason, name, s.id, recs)
}

func isUnreachable(err error) bool {
	return errors.Is(err, unix.ENETUNREACH) || errors.Is(err, unix.EHOSTUNREACH)
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
