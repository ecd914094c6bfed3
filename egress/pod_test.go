//go:build linux

package egress

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// ipPrivateBeyond is a private address outside the pod (another pod's).
var ipPrivateBeyond = netip.MustParseAddr("10.0.0.99")

// codeUID is the uid the in-place tests' "code" creates its sockets as: not the proxy's.
const codeUID = 1_000_123

// inPlaceTest is the fake world's "host" namespace turned into a pod: InstallInPlace's table
// in it, the proxy (this process, uid 0, so exempted as uid 0) serving on its loopback, and
// code that is another uid in the same namespace.
type inPlaceTest struct {
	e   *env
	ip  InPlace
	att *Attachment
}

func newInPlace(t *testing.T, p Policy) *inPlaceTest {
	e := newEnv(t)
	ip := InPlace{ProxyPort: 15001, DNSPort: 15053, ProxyUID: 0}
	c, err := e.gw.nftConn()
	must(t, err, "nftables")
	must(t, installInPlace(c, ip), "install in place")
	att, err := e.gw.ServeInPlace(context.Background(), "pod", p, ip)
	must(t, err, "serve in place")
	t.Cleanup(func() {
		if err := att.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return &inPlaceTest{e: e, ip: ip, att: att}
}

// socketAs makes a socket in the pod's namespace owned by uid (the owner match reads the
// socket's, fixed at creation): setresuid on one locked thread only, raw, so no other
// goroutine ever runs as uid, and back to root before the thread is released.
func (p *inPlaceTest) socketAs(uid int, family, typ int) (int, error) {
	fd := -1
	err := p.e.hostRun.do(func() error {
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(uid), uintptr(uid), 0); e != 0 {
			return e
		}
		var serr error
		fd, serr = unix.Socket(family, typ|unix.SOCK_CLOEXEC, 0)
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, 0, 0, 0); e != 0 {
			panic("cannot return to uid 0: " + e.Error()) // the thread must not run on as uid
		}
		return serr
	})
	return fd, err
}

// dial connects as code: a blocking connect bounded by SO_SNDTIMEO, then a net.Conn.
func (p *inPlaceTest) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, err
	}
	family, sa := unix.AF_INET, unix.Sockaddr(&unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()})
	if ap.Addr().Is6() && !ap.Addr().Is4In6() {
		family, sa = unix.AF_INET6, &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
	}
	typ := unix.SOCK_STREAM
	if strings.HasPrefix(network, "udp") {
		typ = unix.SOCK_DGRAM
	}
	fd, err := p.socketAs(codeUID, family, typ)
	if err != nil {
		return nil, err
	}
	tv := unix.NsecToTimeval((10 * time.Second).Nanoseconds())
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
	if err := unix.Connect(fd, sa); err != nil {
		unix.Close(fd)
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "code")
	defer f.Close()
	return net.FileConn(f)
}

func (p *inPlaceTest) request(ctx context.Context, dialAddr, host string, sni *string) (string, error) {
	return request(ctx, p.dial, p.e.pki.pool, dialAddr, host, sni)
}

// dropped reads the table's drop counter.
func (p *inPlaceTest) dropped(t *testing.T) uint64 {
	c, err := p.e.gw.nftConn()
	must(t, err, "nftables")
	o, err := c.GetObject(&nftables.NamedObj{Table: &nftables.Table{Family: nftables.TableFamilyINet, Name: PodTable}, Name: droppedCounter, Type: nftables.ObjTypeCounter})
	must(t, err, "drop counter")
	return o.(*nftables.NamedObj).Obj.(*expr.Counter).Packets
}

// waitDropped waits for a drop: positive evidence, so nothing waits for a timeout to expire.
func (p *inPlaceTest) waitDropped(t *testing.T, before uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for p.dropped(t) <= before {
		if time.Now().After(deadline) {
			t.Fatalf("no packet was dropped (counter %d)", before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestInPlaceBattery is the bypass battery against in-place egress (a Kubernetes pod's): code
// in the proxy's own namespace, as another uid, reaches an allowed name and nothing else.
func TestInPlaceBattery(t *testing.T) {
	p := newInPlace(t, Policy{Mode: spec.EgressAllowDomains, Domains: []string{"allowed.example.com"}})
	ctx := ctx10(t)
	// The fake world's private addresses are the "host" namespace's own, which are the pod's
	// here (code reaches them as it reaches the agent); other pods' are beyond it.
	ih, err := netlink.NewHandleAt(p.e.inet)
	must(t, err, "netlink inet")
	addAddr(t, ih, linkUp(t, ih, "lo"), ipPrivateBeyond.String()+"/32")
	ih.Close()
	if body, err := p.e.hostRequest(ctx, netip.AddrPortFrom(ipPrivateBeyond, 80).String(), "x", nil); err != nil {
		t.Fatalf("the private address beyond the pod is unreachable even for the proxy: %q, %v", body, err)
	}
	allowed := netip.AddrPortFrom(ipAllowed, 80).String()

	t.Run("allowed name", func(t *testing.T) {
		body, err := p.request(ctx, allowed, "allowed.example.com", nil)
		if err != nil || !strings.Contains(body, "host=allowed.example.com") {
			t.Fatalf("allowed request: %q, %v", body, err)
		}
		body, err = p.request(ctx, netip.AddrPortFrom(ipAllowed, 443).String(), "allowed.example.com", strp("allowed.example.com"))
		if err != nil || !strings.Contains(body, "host=allowed.example.com") {
			t.Fatalf("allowed TLS request: %q, %v", body, err)
		}
	})
	refused := []struct {
		name, dial, host string
		sni              *string
		reason           Reason
	}{
		{"denied name", netip.AddrPortFrom(ipEvil, 80).String(), "evil-example.com", nil, ReasonNameNotAllowed},
		{"denied SNI", netip.AddrPortFrom(ipEvil, 443).String(), "", strp("evil-example.com"), ReasonNameNotAllowed},
		{"IP literal", allowed, ipAllowed.String(), nil, ReasonIPLiteral},
		{"allowed name, another address", netip.AddrPortFrom(ipA, 80).String(), "allowed.example.com", nil, ReasonAddrMismatch},
		{"allowed SNI, another address", netip.AddrPortFrom(ipA, 443).String(), "", strp("allowed.example.com"), ReasonAddrMismatch},
		{"a private address beyond the pod", netip.AddrPortFrom(ipPrivateBeyond, 80).String(), "allowed.example.com", nil, ReasonNonPublicDst},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			since := len(p.e.logs.refusals("pod"))
			before := p.e.hits.get(tc.dial)
			if body, err := p.request(ctx, tc.dial, tc.host, tc.sni); err == nil {
				t.Fatalf("request to %s naming %q/%v went through: %q", tc.dial, tc.host, tc.sni, body)
			}
			if p.e.hits.get(tc.dial) != before {
				t.Errorf("%s was reached", tc.dial)
			}
			requireInPlaceRefusal(t, p, since, tc.reason)
		})
	}
	t.Run("other port of an allowed name", func(t *testing.T) {
		// The name is what is allowed, on any port; the non-HTTP, non-TLS echo is refused.
		c, err := p.dial(ctx, "tcp", netip.AddrPortFrom(ipAllowed, 7).String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		c.Write([]byte("\x00hello\n"))
		if _, err := c.Read(make([]byte, 16)); err == nil {
			t.Fatal("a raw TCP stream to port 7 got an answer")
		}
	})
	t.Run("straight to the proxy", func(t *testing.T) {
		since := len(p.e.logs.refusals("pod"))
		if _, err := p.request(ctx, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), p.ip.ProxyPort).String(), "allowed.example.com", nil); err == nil {
			t.Fatal("a connection to the proxy's own port went through")
		}
		// Its original destination is itself (conntrack saw no redirect): not public.
		requireInPlaceRefusal(t, p, since, ReasonNonPublicDst)
	})
	t.Run("DNS to another resolver is ours", func(t *testing.T) {
		foreign := netip.AddrPortFrom(ipForeign, 53).String()
		before := p.e.foreign.count(foreign)
		for _, network := range []string{"udp", "tcp"} {
			rc, addrs, err := query(ctx, p.dial, foreign, network, "allowed.example.com", dnsmessage.TypeA)
			if err != nil || rc != dnsmessage.RCodeSuccess || len(addrs) != 1 || addrs[0] != ipAllowed {
				t.Fatalf("%s: allowed name via a foreign resolver: %v %v %v", network, rc, addrs, err)
			}
			rc, addrs, err = query(ctx, p.dial, foreign, network, "evil-example.com", dnsmessage.TypeA)
			if err != nil || rc == dnsmessage.RCodeSuccess && len(addrs) > 0 {
				t.Fatalf("%s: denied name via a foreign resolver: %v %v %v", network, rc, addrs, err)
			}
		}
		if n := p.e.foreign.count(foreign); n != before {
			t.Errorf("the foreign resolver got %d queries", n-before)
		}
	})
	t.Run("UDP elsewhere is dropped", func(t *testing.T) {
		addr := netip.AddrPortFrom(ipAllowed, 443).String()
		before, hits := p.dropped(t), p.e.udpHits.get(addr)
		c, err := p.dial(ctx, "udp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write([]byte("quic?"))
		p.waitDropped(t, before)
		if p.e.udpHits.get(addr) != hits {
			t.Error("a UDP datagram reached the internet")
		}
	})
	t.Run("IPv6 is dropped", func(t *testing.T) {
		addr := netip.AddrPortFrom(ipWeb6, 80)
		before, hits := p.dropped(t), p.e.hits.get(addr.String())
		fd, err := p.socketAs(codeUID, unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_NONBLOCK)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		if err := unix.Connect(fd, &unix.SockaddrInet6{Port: 80, Addr: addr.Addr().As16()}); err != nil && !errors.Is(err, unix.EINPROGRESS) {
			t.Fatalf("connect: %v", err)
		}
		p.waitDropped(t, before)
		if p.e.hits.get(addr.String()) != hits {
			t.Error("the IPv6 web host was reached")
		}
	})
	t.Run("the proxy's uid is not redirected", func(t *testing.T) {
		// The positive control for the owner match: root (the proxy here) dials straight out.
		body, err := p.e.hostRequest(ctx, netip.AddrPortFrom(ipEvil, 80).String(), "evil-example.com", nil)
		if err != nil || !strings.Contains(body, "host=evil-example.com") {
			t.Fatalf("the proxy's own request: %q, %v", body, err)
		}
	})
}

func requireInPlaceRefusal(t *testing.T, p *inPlaceTest, since int, reason Reason) {
	t.Helper()
	recs := p.e.logs.refusals("pod")[since:]
	for _, r := range recs {
		if r["reason"] == string(reason) {
			return
		}
	}
	t.Fatalf("no refusal %q logged; got %v", reason, recs)
}

func TestInPlaceRefusals(t *testing.T) {
	for _, tc := range []struct {
		ip   InPlace
		want string
	}{
		{InPlace{ProxyPort: 1, DNSPort: 2, ProxyUID: 0}, "uid 0"},
		{InPlace{ProxyPort: 1, DNSPort: 1, ProxyUID: 7}, "two different ports"},
		{InPlace{ProxyPort: 0, DNSPort: 1, ProxyUID: 7}, "two different ports"},
	} {
		err := InstallInPlace(tc.ip)
		if !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("InstallInPlace(%+v) = %v, want invalid naming %q", tc.ip, err, tc.want)
		}
	}
	gw, err := NewGateway(Options{Upstream: []netip.AddrPort{netip.MustParseAddrPort("192.0.2.53:53")}})
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	if _, err := gw.ServeInPlace(context.Background(), "x", Policy{Mode: spec.EgressDeny}, InPlace{ProxyPort: 1, DNSPort: 2}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("ServeInPlace under deny: %v, want invalid", err)
	}
}

func TestParseNameservers(t *testing.T) {
	got := parseNameservers(bytes.NewReader([]byte("# c\nsearch x\nnameserver 10.96.0.10\nnameserver fd00::a\nnameserver  fe80::1%eth0\nnameserver bogus\noptions ndots:5\nnameserver\n")))
	want := []netip.AddrPort{netip.MustParseAddrPort("10.96.0.10:53"), netip.MustParseAddrPort("[fd00::a]:53"), netip.MustParseAddrPort("[fe80::1%eth0]:53")}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}
