package egress

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/airlock-sandbox/airlock/spec"
)

// unitEnv is an attachment with a resolver but no kernel plumbing, asking a fake upstream
// on loopback; it needs no root.
type unitEnv struct {
	a    *Attachment
	n    *network
	up   *fakeDNS
	upAP netip.AddrPort
	logs *logCapture
}

func newUnitEnv(t *testing.T, p Policy) *unitEnv {
	t.Helper()
	up := newFakeDNS()
	up.records["allowed.example.com"] = []netip.Addr{netip.MustParseAddr("198.51.100.10")}
	up.records["a.example.com"] = []netip.Addr{netip.MustParseAddr("198.51.100.11"), netip.MustParseAddr("10.0.0.7")}
	up.records["rebind.example.com"] = []netip.Addr{netip.MustParseAddr("10.0.0.5")}
	up.records["meta.example.com"] = []netip.Addr{netip.MustParseAddr("169.254.169.254")}
	up.records["evil-example.com"] = []netip.Addr{netip.MustParseAddr("203.0.113.66")}
	up.records["target.other.net"] = []netip.Addr{netip.MustParseAddr("198.51.100.12")}
	up.cnames["cname.example.com"] = "target.other.net"
	up.records["big.example.com"] = []netip.Addr{netip.MustParseAddr("198.51.100.13")}
	up.truncate["big.example.com"] = true
	up.records["v6.example.com"] = []netip.Addr{netip.MustParseAddr("2001:db8::10")}
	var many []netip.Addr
	for i := 1; i <= 40; i++ {
		many = append(many, netip.AddrFrom4([4]byte{198, 51, 100, byte(100 + i)}))
	}
	up.records["many.example.com"] = many

	// The same port for UDP and TCP: the UDP port the kernel picks may be taken for TCP by
	// another test's socket, so pick again (a few times) rather than fail.
	var pc net.PacketConn
	var ln net.Listener
	for try := 0; ; try++ {
		var err error
		if pc, err = net.ListenPacket("udp4", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		if ln, err = net.Listen("tcp4", pc.LocalAddr().String()); err == nil {
			break
		}
		pc.Close()
		if try == 20 {
			t.Fatal(err)
		}
	}
	up.serve(pc, ln)
	t.Cleanup(up.close)
	upAP := netip.MustParseAddrPort(pc.LocalAddr().String())

	logs := newLogCapture()
	g, err := NewGateway(Options{
		Upstream:    []netip.AddrPort{upAP},
		ExtraPublic: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("2001:db8::/32")},
		Logger:      slog.New(logs),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	a := &Attachment{g: g, id: "unit", log: g.log.With("sandbox", "unit"), answers: newAnswerMemory()}
	pc2 := p.clone()
	a.pol.Store(&pc2)
	n := &network{a: a, ctx: context.Background()}
	return &unitEnv{a: a, n: n, up: up, upAP: upAP, logs: logs}
}

func (u *unitEnv) ask(t *testing.T, name string, qt dnsmessage.Type, overTCP, edns bool) *dnsmessage.Message {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 777, RecursionDesired: true})
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name + "."), Type: qt, Class: dnsmessage.ClassINET})
	if edns {
		b.StartAdditionals()
		var h dnsmessage.ResourceHeader
		h.SetEDNS0(4096, dnsmessage.RCodeSuccess, false)
		b.OPTResource(h, dnsmessage.OPTResource{})
	}
	q, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	r := u.n.answer(context.Background(), q, overTCP)
	if r == nil {
		t.Fatalf("%s: no reply", name)
	}
	var m dnsmessage.Message
	if err := m.Unpack(r); err != nil {
		t.Fatal(err)
	}
	if m.ID != 777 || !m.Response {
		t.Fatalf("reply header %+v", m.Header)
	}
	return &m
}

func addrsOf(m *dnsmessage.Message) []string {
	var out []string
	for _, rr := range m.Answers {
		switch b := rr.Body.(type) {
		case *dnsmessage.AResource:
			out = append(out, netip.AddrFrom4(b.A).String())
		case *dnsmessage.AAAAResource:
			out = append(out, netip.AddrFrom16(b.AAAA).String())
		}
	}
	return out
}

func (u *unitEnv) lastReason() string {
	r := u.logs.refusals("unit")
	if len(r) == 0 {
		return ""
	}
	return r[len(r)-1]["reason"]
}

func TestResolverAllowDomains(t *testing.T) {
	u := newUnitEnv(t, Policy{Mode: spec.EgressAllowDomains, Domains: []string{"*.example.com"}})
	upCount := func() int { return u.up.count(u.upAP.String()) }
	cases := []struct {
		name      string
		qt        dnsmessage.Type
		tcp       bool
		rcode     dnsmessage.RCode
		addrs     []string
		reason    Reason // logged refusal, "" for none
		asksUp    bool
		truncated bool
	}{
		{"allowed.example.com", dnsmessage.TypeA, false, dnsmessage.RCodeSuccess, []string{"198.51.100.10"}, "", true, false},
		{"Allowed.Example.Com", dnsmessage.TypeA, false, dnsmessage.RCodeSuccess, []string{"198.51.100.10"}, "", true, false},
		{"a.example.com", dnsmessage.TypeA, false, dnsmessage.RCodeSuccess, []string{"198.51.100.11"}, ReasonNonPublicAnswer, true, false},
		{"rebind.example.com", dnsmessage.TypeA, false, dnsmessage.RCodeSuccess, nil, ReasonNonPublicAnswer, true, false},
		{"meta.example.com", dnsmessage.TypeA, false, dnsmessage.RCodeSuccess, nil, ReasonNonPublicAnswer, true, false},
		{"evil-example.com", dnsmessage.TypeA, false, dnsmessage.RCodeNameError, nil, ReasonNameNotAllowed, false, false},
		{"example.com", dnsmessage.TypeA, false, dnsmessage.RCodeNameError, nil, ReasonNameNotAllowed, false, false},
		{"evil-example.com", dnsmessage.TypeA, true, dnsmessage.RCodeNameError, nil, ReasonNameNotAllowed, false, false},
		{"cname.example.com", dnsmessage.TypeA, false, dnsmessage.RCodeSuccess, []string{"198.51.100.12"}, "", true, false},
		{"big.example.com", dnsmessage.TypeA, false, dnsmessage.RCodeSuccess, []string{"198.51.100.13"}, "", true, false},
		{"v6.example.com", dnsmessage.TypeAAAA, false, dnsmessage.RCodeSuccess, nil, "", false, false},
		{"allowed.example.com", dnsmessage.TypeTXT, false, dnsmessage.RCodeSuccess, nil, "", true, false},
		{"nope.example.com", dnsmessage.TypeA, false, dnsmessage.RCodeNameError, nil, "", true, false},
		{"many.example.com", dnsmessage.TypeA, false, dnsmessage.RCodeSuccess, nil, "", true, true},
	}
	for _, c := range cases {
		t.Run(c.name+"/"+c.qt.String(), func(t *testing.T) {
			before, logsBefore := upCount(), len(u.logs.refusals("unit"))
			m := u.ask(t, c.name, c.qt, c.tcp, false)
			if m.RCode != c.rcode {
				t.Fatalf("rcode %v, want %v", m.RCode, c.rcode)
			}
			if got := addrsOf(m); !slices.Equal(got, c.addrs) {
				t.Fatalf("addresses %v, want %v", got, c.addrs)
			}
			if m.Truncated != c.truncated {
				t.Fatalf("truncated %v, want %v", m.Truncated, c.truncated)
			}
			if asked := upCount() > before; asked != c.asksUp {
				t.Fatalf("upstream asked: %v, want %v", asked, c.asksUp)
			}
			logged := len(u.logs.refusals("unit")) > logsBefore
			if logged != (c.reason != "") || (logged && u.lastReason() != string(c.reason)) {
				t.Fatalf("refusal logged %v (%q), want %q", logged, u.lastReason(), c.reason)
			}
		})
	}
	// A truncated UDP answer is complete over TCP, and with EDNS it fits in UDP.
	if m := u.ask(t, "many.example.com", dnsmessage.TypeA, true, false); len(addrsOf(m)) != 40 || m.Truncated {
		t.Fatalf("over TCP: %d addresses, truncated %v", len(addrsOf(m)), m.Truncated)
	}
	if m := u.ask(t, "many.example.com", dnsmessage.TypeA, false, true); len(addrsOf(m)) != 40 || m.Truncated {
		t.Fatalf("with EDNS: %d addresses, truncated %v", len(addrsOf(m)), m.Truncated)
	}
	// What was handed out is remembered for the proxy; what was stripped is not.
	now := time.Now()
	for addr, want := range map[string]bool{"198.51.100.10": true, "10.0.0.5": false} {
		name := map[string]string{"198.51.100.10": "allowed.example.com", "10.0.0.5": "rebind.example.com"}[addr]
		if got := u.a.answers.has(name, netip.MustParseAddr(addr), now); got != want {
			t.Errorf("memory has %s→%s: %v, want %v", name, addr, got, want)
		}
	}
	c := u.a.Counters()
	if c.DNSDenied == 0 || c.DNSAllowed == 0 {
		t.Errorf("counters %+v", c)
	}
}

func TestResolverAllowAndDeny(t *testing.T) {
	u := newUnitEnv(t, Policy{Mode: spec.EgressAllow})
	m := u.ask(t, "evil-example.com", dnsmessage.TypeA, false, false)
	if m.RCode != dnsmessage.RCodeSuccess || !slices.Equal(addrsOf(m), []string{"203.0.113.66"}) {
		t.Fatalf("allow: any public name resolves; got %v %v", m.RCode, addrsOf(m))
	}
	m = u.ask(t, "rebind.example.com", dnsmessage.TypeA, false, false)
	if len(addrsOf(m)) != 0 || u.lastReason() != string(ReasonNonPublicAnswer) {
		t.Fatalf("allow: private answers are stripped; got %v, reason %q", addrsOf(m), u.lastReason())
	}
	// open: nothing is stripped, and nothing is logged as a refusal.
	u.a.pol.Store(&Policy{Mode: spec.EgressOpen})
	for name, want := range map[string][]string{
		"rebind.example.com": {"10.0.0.5"},
		"meta.example.com":   {"169.254.169.254"},
		"a.example.com":      {"198.51.100.11", "10.0.0.7"},
		"evil-example.com":   {"203.0.113.66"},
	} {
		logs := len(u.logs.refusals("unit"))
		m = u.ask(t, name, dnsmessage.TypeA, false, false)
		if m.RCode != dnsmessage.RCodeSuccess || !slices.Equal(addrsOf(m), want) {
			t.Fatalf("open: %s: got %v %v, want %v", name, m.RCode, addrsOf(m), want)
		}
		if len(u.logs.refusals("unit")) != logs {
			t.Fatalf("open: %s: a refusal was logged: %q", name, u.lastReason())
		}
	}
	if m = u.ask(t, "v6.example.com", dnsmessage.TypeAAAA, false, false); len(addrsOf(m)) != 0 {
		t.Fatalf("open: AAAA answered on an IPv4-only link: %v", addrsOf(m))
	}
	u.a.pol.Store(&Policy{Mode: spec.EgressDeny})
	before := u.up.count(u.upAP.String())
	m = u.ask(t, "allowed.example.com", dnsmessage.TypeA, false, false)
	if m.RCode != dnsmessage.RCodeRefused || u.up.count(u.upAP.String()) != before {
		t.Fatalf("deny: want REFUSED without asking upstream, got %v", m.RCode)
	}
}

func TestDecide(t *testing.T) {
	u := newUnitEnv(t, Policy{Mode: spec.EgressAllowDomains, Domains: []string{"*.example.com"}})
	wild := &Policy{Mode: spec.EgressAllowDomains, Domains: []string{"*.example.com"}}
	allow := &Policy{Mode: spec.EgressAllow}
	deny := &Policy{Mode: spec.EgressDeny}
	open := &Policy{Mode: spec.EgressOpen}
	u.a.answers.remember("remembered.example.com", []netip.Addr{netip.MustParseAddr("198.51.100.99")}, time.Minute, time.Now())
	cases := []struct {
		pol  *Policy
		name string
		dst  string
		want Reason
	}{
		{wild, "allowed.example.com", "198.51.100.10:443", ""},
		{wild, "allowed.example.com", "198.51.100.10:8443", ""},
		{wild, "a.example.com", "198.51.100.11:80", ""},
		{wild, "cname.example.com", "198.51.100.12:80", ""},
		{wild, "remembered.example.com", "198.51.100.99:80", ""}, // upstream says NXDOMAIN now; we answered it before
		{wild, "allowed.example.com", "203.0.113.66:443", ReasonAddrMismatch},
		{wild, "a.example.com", "198.51.100.10:80", ReasonAddrMismatch},
		{wild, "evil-example.com", "203.0.113.66:443", ReasonNameNotAllowed},
		{wild, "example.com", "198.51.100.10:443", ReasonNameNotAllowed},
		{wild, "rebind.example.com", "10.0.0.5:80", ReasonNonPublicDst},
		{wild, "rebind.example.com", "198.51.100.10:80", ReasonNonPublicAnswer},
		{wild, "nope.example.com", "198.51.100.10:80", ReasonResolveFailed},
		{wild, "allowed.example.com", "169.254.169.254:80", ReasonNonPublicDst},
		{wild, "allowed.example.com", "127.0.0.1:80", ReasonNonPublicDst},
		{wild, "allowed.example.com", "10.200.0.6:9000", ReasonNonPublicDst},
		{wild, "allowed.example.com", "[::ffff:10.0.0.5]:80", ReasonNonPublicDst},
		{allow, "", "203.0.113.66:80", ""},
		{allow, "", "198.51.100.10:53", ""},
		{allow, "", "10.0.0.5:80", ReasonNonPublicDst},
		{allow, "", "169.254.169.254:80", ReasonNonPublicDst},
		{allow, "", "192.0.2.1:80", ReasonNonPublicDst}, // TEST-NET-1 is not in this ExtraPublic
		{deny, "", "198.51.100.10:80", ReasonPolicyDeny},
		{open, "", "203.0.113.66:80", ""},
		{open, "", "10.0.0.5:80", ""},
		{open, "", "172.16.0.5:5432", ""},
		{open, "", "192.168.1.1:22", ""},
		{open, "", "100.64.0.1:80", ""},
		{open, "", "169.254.169.254:80", ""},
		{open, "", "192.0.2.1:80", ""},
		{open, "", "[::ffff:10.0.0.5]:80", ""},
		{open, "", "10.200.0.6:9000", ReasonSandboxLink}, // another sandbox
		{open, "", "10.200.0.1:80", ReasonSandboxLink},   // a gateway
		{open, "", "127.0.0.1:80", ReasonSandboxLink},
		{open, "", "0.0.0.0:80", ReasonSandboxLink},
	}
	for _, c := range cases {
		t.Run(string(c.pol.Mode)+"/"+c.name+"/"+c.dst, func(t *testing.T) {
			if got := u.a.decide(context.Background(), c.pol, c.name, netip.MustParseAddrPort(c.dst)); got != c.want {
				t.Fatalf("decide = %q, want %q", got, c.want)
			}
		})
	}
}
