//go:build cluster

package kubernetes_test

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	kb "github.com/airlock-sandbox/airlock/backend/kubernetes"
	"github.com/airlock-sandbox/airlock/egress"
	"github.com/airlock-sandbox/airlock/operator"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// The allowDomains battery: the bypasses the local runtime's egress tests try (egress/battery_test.go),
// from code in a sandbox pod whose egress proxy (operator.addEgressProxy) sits in its network path.
// The world is a second fake internet in a network namespace this test makes on the node:
//
//	node ──alk8s-dom (203.0.113.5/30 ↔ .6/30)── netns: 203.0.113.90  allowed.test, denied.test
//	                                                    (HTTP, TLS, a raw port, UDP echo, DNS :53,
//	                                                     the operator's egressDNS in deploy.sh)
//	                                                   203.0.113.91  no name (HTTP)

var (
	domWeb   = netip.MustParseAddr("203.0.113.90") // deploy.sh's FAKE_DNS is its :53
	domOther = netip.MustParseAddr("203.0.113.91")
)

const (
	domAllowed = "allowed.test"
	domDenied  = "denied.test"
)

// domWorld is what the battery's probes reach.
type domWorld struct {
	http, tls, raw, udp uint16 // ports on domWeb (http also on domOther)
	dns                 *domDNS
	hits                *hitCounter
}

type hitCounter struct {
	mu sync.Mutex
	m  map[string]int
}

func (h *hitCounter) add(k string) { h.mu.Lock(); h.m[k]++; h.mu.Unlock() }
func (h *hitCounter) get(k string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.m[k]
}

// domDNS answers A queries for allowed.test and denied.test (both domWeb) and counts every
// question by name.
type domDNS struct{ asked *hitCounter }

func (d *domDNS) answer(q []byte) []byte {
	var m dnsmessage.Message
	if err := m.Unpack(q); err != nil || len(m.Questions) != 1 {
		return nil
	}
	qq := m.Questions[0]
	name := strings.TrimSuffix(strings.ToLower(qq.Name.String()), ".")
	d.asked.add(name)
	resp := dnsmessage.Message{Header: dnsmessage.Header{ID: m.ID, Response: true, Authoritative: true, RecursionDesired: m.RecursionDesired}, Questions: m.Questions}
	switch {
	case name != domAllowed && name != domDenied:
		resp.RCode = dnsmessage.RCodeNameError
	case qq.Type == dnsmessage.TypeA:
		resp.Answers = []dnsmessage.Resource{{Header: dnsmessage.ResourceHeader{Name: qq.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 60},
			Body: &dnsmessage.AResource{A: domWeb.As4()}}}
	}
	b, _ := resp.Pack()
	return b
}

func newDomWorld(t *testing.T) *domWorld {
	ns := newFakeNet(t, fakeNet{hostLink: "alk8s-dom", peerLink: "dom0", hostAddr: "203.0.113.5/30", peerAddr: "203.0.113.6/30",
		hosts: []netip.Addr{domWeb, domOther}})

	w := &domWorld{hits: &hitCounter{m: map[string]int{}}, dns: &domDNS{asked: &hitCounter{m: map[string]int{}}}}
	var webLn, otherLn, tlsLn, tlsOtherLn, rawLn, dnsLn net.Listener
	var udpPC, dnsPC net.PacketConn
	inNetns(t, ns, func() error {
		var err error
		listen := func(addr string) net.Listener {
			if err != nil {
				return nil
			}
			var ln net.Listener
			ln, err = net.Listen("tcp4", addr)
			return ln
		}
		webLn, otherLn, tlsLn, rawLn = listen(domWeb.String()+":0"), listen(domOther.String()+":0"), listen(domWeb.String()+":0"), listen(domWeb.String()+":0")
		dnsLn = listen(domWeb.String() + ":53")
		if err != nil {
			return err
		}
		if udpPC, err = net.ListenPacket("udp4", domWeb.String()+":0"); err != nil {
			return err
		}
		dnsPC, err = net.ListenPacket("udp4", domWeb.String()+":53")
		return err
	})
	port := func(a net.Addr) uint16 { return uint16(a.(*net.TCPAddr).Port) }
	w.http, w.tls, w.raw, w.udp = port(webLn.Addr()), port(tlsLn.Addr()), port(rawLn.Addr()), uint16(udpPC.LocalAddr().(*net.UDPAddr).Port)
	// The mismatch probes dial the same ports on domOther.
	otherLn.Close()
	inNetns(t, ns, func() error {
		var err error
		if otherLn, err = net.Listen("tcp4", netip.AddrPortFrom(domOther, w.http).String()); err != nil {
			return err
		}
		tlsOtherLn, err = net.Listen("tcp4", netip.AddrPortFrom(domOther, w.tls).String())
		return err
	})

	web := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w.hits.add(r.Host + "@" + r.Context().Value(http.LocalAddrContextKey).(net.Addr).String())
		fmt.Fprintf(rw, "host=%s", r.Host)
	})
	for _, ln := range []net.Listener{webLn, otherLn} {
		srv := &http.Server{Handler: web, ReadHeaderTimeout: 20 * time.Second}
		done := make(chan struct{})
		go func() { defer close(done); srv.Serve(ln) }()
		t.Cleanup(func() { srv.Close(); <-done })
	}
	for _, ln := range []net.Listener{tlsLn, tlsOtherLn} {
		ts := httptest.NewUnstartedServer(web) // its certificate is httptest's: the probe does not verify
		ts.Listener.Close()
		ts.Listener = ln
		ts.StartTLS()
		t.Cleanup(ts.Close)
	}
	acceptAllCounting(t, rawLn, w.hits, "raw")
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := udpPC.ReadFrom(buf)
			if err != nil {
				return
			}
			w.hits.add("udp")
			udpPC.WriteTo(buf[:n], from)
		}
	}()
	t.Cleanup(func() { udpPC.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := dnsPC.ReadFrom(buf)
			if err != nil {
				return
			}
			if r := w.dns.answer(buf[:n]); r != nil {
				dnsPC.WriteTo(r, from)
			}
		}
	}()
	t.Cleanup(func() { dnsPC.Close() })
	go func() {
		for {
			c, err := dnsLn.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(20 * time.Second))
				var l [2]byte
				if _, err := io.ReadFull(c, l[:]); err != nil {
					return
				}
				q := make([]byte, int(l[0])<<8|int(l[1]))
				if _, err := io.ReadFull(c, q); err != nil {
					return
				}
				if r := w.dns.answer(q); r != nil {
					c.Write(append([]byte{byte(len(r) >> 8), byte(len(r))}, r...))
				}
			}()
		}
	}()
	t.Cleanup(func() { dnsLn.Close() })

	// The node reaches each, so a refused probe is the policy's doing, not a dead target.
	for _, a := range []string{netip.AddrPortFrom(domWeb, w.http).String(), netip.AddrPortFrom(domOther, w.http).String(),
		netip.AddrPortFrom(domWeb, w.tls).String(), netip.AddrPortFrom(domOther, w.tls).String(), netip.AddrPortFrom(domWeb, w.raw).String(), netip.AddrPortFrom(domWeb, 53).String()} {
		c, err := net.DialTimeout("tcp", a, 20*time.Second)
		if err != nil {
			t.Fatalf("the node cannot reach %s: %v", a, err)
		}
		c.Close()
	}
	return w
}

// domProbeScript runs the probes given as one JSON list of [name, kind, args...] and prints
// one JSON object {name: verdict}. Kinds:
//
//	resolve NAME                      the pod's resolver (getaddrinfo): "ok ADDR" or "refused ..."
//	http ADDR PORT HOST               GET with Host: "open <status line>" if any answer came
//	tls ADDR PORT SNI                 TLS (unverified) then GET: "open ..." if any answer came
//	raw ADDR PORT                     a non-HTTP line: "open" if any answer came
//	dns SERVER NAME                   a raw UDP A query to SERVER:53: "answer RCODE ANCOUNT LAST-A"
//	udp ADDR PORT                     a datagram: "open" if echoed within 5 s
//	tcp6 ADDR PORT                    TCP over IPv6 with a GET: "open" if any answer came
//
// Every stream probe waits up to 20 s: an allowed one takes milliseconds on the node's bridge,
// so a slow machine cannot turn an allowed probe into a refused one.
const domProbeScript = `
import json, socket, ssl, struct, sys
def read_all(s):
    data = b""
    while True:
        b = s.recv(4096)
        if not b: return data
        data += b
def verdict(data):
    return ("open " + data.split(b"\r\n")[0].decode(errors="replace")) if data else "refused eof"
def get(host):
    return ("GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % host).encode()
def probe(kind, *a):
    if kind == "resolve":
        return "ok " + socket.getaddrinfo(a[0], 80, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    if kind == "http":
        s = socket.create_connection((a[0], int(a[1])), timeout=20); s.sendall(get(a[2])); return verdict(read_all(s))
    if kind == "tls":
        ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
        s = ctx.wrap_socket(socket.create_connection((a[0], int(a[1])), timeout=20), server_hostname=a[2])
        s.sendall(get(a[2])); return verdict(read_all(s))
    if kind == "raw":
        s = socket.create_connection((a[0], int(a[1])), timeout=20); s.sendall(b"\x00hello\n"); return verdict(read_all(s))
    if kind == "tcp6":
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM); s.settimeout(20); s.connect((a[0], int(a[1])))
        s.sendall(get("x")); return verdict(read_all(s))
    if kind == "udp":
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5); s.sendto(b"ping", (a[0], int(a[1])))
        return "open " + s.recv(100).decode()
    if kind == "dns":
        q = struct.pack(">HHHHHH", 4242, 0x0100, 1, 0, 0, 0)
        for label in a[1].split("."): q += bytes([len(label)]) + label.encode()
        q += b"\x00" + struct.pack(">HH", 1, 1)
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(20); s.sendto(q, (a[0], 53))
        r = s.recv(4096)
        rcode, an = r[3] & 15, struct.unpack(">H", r[6:8])[0]
        # The last answer's address: an A record ends the message (no authority, no additional).
        return "answer %d %d %s" % (rcode, an, socket.inet_ntoa(r[-4:]) if an else "-")
    raise ValueError(kind)
out = {}
for p in json.loads(sys.argv[1]):
    try:
        out[p[0]] = probe(*p[1:])
    except socket.timeout:
        out[p[0]] = "refused timeout"
    except Exception as e:
        out[p[0]] = "refused " + type(e).__name__ + " " + str(e)
print(json.dumps(out))
`

// egressAllowDomainsByTraffic claims a session of an allowDomains Sandbox (allowed.test) and
// runs the battery from inside it: the allowed name reaches its host over HTTP and TLS, and
// every bypass is refused, by the proxy (with the reason the local runtime gives) or by the
// pod's nftables.
func egressAllowDomainsByTraffic(t *testing.T, e *env, b *kb.Backend) {
	w := newDomWorld(t)
	targets := newEgressTargets(t, e) // the other pod, the node, the API server, the first fake internet
	d := baseDecl("egress-domains")
	d.Egress = spec.Egress{Mode: spec.EgressAllowDomains, Domains: []string{domAllowed}}
	e.sandboxCR(d, 1, 1)
	s, err := b.Create(ctxT(t), withDefaults(d))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Terminate(ctxT(t), s.ID) })
	a, err := b.Connect(ctxT(t), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()

	web, other := domWeb.String(), domOther.String()
	hp := func(p uint16) string { return fmt.Sprint(p) }
	type pr struct {
		argv []string
		want string // verdict prefix
	}
	probes := map[string]pr{
		"resolve-allowed":     {[]string{"resolve", domAllowed}, "ok " + web},
		"resolve-denied":      {[]string{"resolve", domDenied}, "refused"},
		"http-allowed":        {[]string{"http", web, hp(w.http), domAllowed}, "open HTTP/1.1 200"},
		"tls-allowed":         {[]string{"tls", web, hp(w.tls), domAllowed}, "open HTTP/1.1 200"},
		"http-denied":         {[]string{"http", web, hp(w.http), domDenied}, "refused"},
		"tls-denied":          {[]string{"tls", web, hp(w.tls), domDenied}, "refused"},
		"http-ip-literal":     {[]string{"http", web, hp(w.http), web}, "refused"},
		"http-other-address":  {[]string{"http", other, hp(w.http), domAllowed}, "refused"},
		"tls-other-address":   {[]string{"tls", other, hp(w.tls), domAllowed}, "refused"},
		"raw-other-port":      {[]string{"raw", web, hp(w.raw)}, "refused"},
		"udp-elsewhere":       {[]string{"udp", web, hp(w.udp)}, "refused"},
		"tcp6-literal":        {[]string{"tcp6", "2001:db8::90", hp(w.http)}, "refused"},
		"dns-foreign-allowed": {[]string{"dns", "198.51.100.7", domAllowed}, "answer 0 1 " + web}, // nobody is there: our resolver answered
		"dns-upstream-denied": {[]string{"dns", web, domDenied}, "answer 3 0"},                    // NXDOMAIN from ours; the real one is never asked
	}
	for name, addr := range targets { // the pod network, the node, the API server: not public
		h, p, _ := net.SplitHostPort(addr)
		probes["http-"+name] = pr{[]string{"http", h, p, domAllowed}, "refused"}
	}
	var list [][]string
	for _, name := range slices.Sorted(maps.Keys(probes)) {
		list = append(list, append([]string{name}, probes[name].argv...))
	}
	js, _ := json.Marshal(list)
	deniedAsked := w.dns.asked.get(domDenied)
	refusedKeys := []string{"raw", "udp", domDenied + "@" + netip.AddrPortFrom(domWeb, w.http).String(), domDenied + "@" + netip.AddrPortFrom(domWeb, w.tls).String(),
		domAllowed + "@" + netip.AddrPortFrom(domOther, w.http).String(), domAllowed + "@" + netip.AddrPortFrom(domOther, w.tls).String()}
	hitsBefore := map[string]int{}
	for _, k := range refusedKeys {
		hitsBefore[k] = w.hits.get(k) // the node's reachability checks count too
	}
	out, stderr, res := execOut(t, a, sandbox.ExecRequest{Argv: []string{"python3", "-c", domProbeScript, string(js)}, Timeout: 2 * time.Minute})
	if res.ExitCode != 0 {
		t.Fatalf("probe: exit %d\n%s%s", res.ExitCode, out, stderr)
	}
	var got map[string]string
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("probe printed %q: %v", out, err)
	}
	for _, name := range slices.Sorted(maps.Keys(probes)) {
		t.Logf("%-22s %s", name, got[name])
		if want := probes[name].want; !strings.HasPrefix(got[name], want) {
			t.Errorf("%s %v: %q, want %s…", name, probes[name].argv, got[name], want)
		}
	}
	if n := w.dns.asked.get(domDenied) - deniedAsked; n != 0 {
		t.Errorf("the upstream DNS server was asked for %s %d times: a denied name must not leave the pod", domDenied, n)
	}
	for _, k := range refusedKeys {
		if n := w.hits.get(k) - hitsBefore[k]; n != 0 {
			t.Errorf("the fake internet saw %d %s: a refused probe got through", n, k)
		}
	}

	// The refusals are the proxy's, with the local runtime's reasons, in the sidecar's log.
	pod := kubectl(t, "", "-n", e.ns, "get", "pod", "-l", operator.LabelSession+"="+s.ID, "-o", "jsonpath={.items[0].metadata.name}")
	logs := kubectl(t, "", "-n", e.ns, "logs", pod, "-c", operator.EgressContainerName)
	for _, r := range []egress.Reason{egress.ReasonNameNotAllowed, egress.ReasonIPLiteral, egress.ReasonAddrMismatch, egress.ReasonNotTLSOrHTTP, egress.ReasonNonPublicDst} {
		if !strings.Contains(logs, string(r)) {
			t.Errorf("the egress sidecar logged no refusal %q:\n%s", r, logs)
		}
	}

	// The sandbox container holds no NET_ADMIN (only the init container did), and code, its
	// own uid, none at all: it cannot take the table down.
	capsOut, _, _ := execOut(t, a, sandbox.ExecRequest{Argv: []string{"python3", "-c", `
print([l.split()[1] for l in open("/proc/self/status") if l.startswith(("CapEff", "CapPrm", "CapBnd"))])`}, Timeout: time.Minute})
	var caps []string
	json.Unmarshal([]byte(strings.ReplaceAll(strings.TrimSpace(capsOut), "'", `"`)), &caps)
	const netAdmin = 1 << 12
	for i, c := range caps {
		var v uint64
		fmt.Sscanf(c, "%x", &v)
		if v&netAdmin != 0 {
			t.Errorf("code's capability set %d is %s: it holds CAP_NET_ADMIN", i, c)
		}
	}
	if len(caps) != 3 {
		t.Errorf("capability sets of code: %q", capsOut)
	}
}
