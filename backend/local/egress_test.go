package local

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/backend/local/egresswire"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/server"
	"github.com/airlock-sandbox/airlock/spec"
)

// The daemon's metrics read the egress counters through this interface.
var _ server.EgressCounter = (*Backend)(nil)

// The world of these tests, entirely in network namespaces they create (never this host's
// real network: its uplink is not even connected):
//
//	sandbox ──veth (egress)── "host" netns ──up0/up1── "internet" netns
//	                            203.0.113.2 its uplink      198.51.100.10 allowed.example.com
//	                            10.0.0.5 private service    203.0.113.66  evil-example.com
//	                            169.254.169.254 metadata    203.0.113.53  the upstream DNS
//	                            127.0.0.1:8081 loopback
//
// Every web server answers on :8080 with the address it was reached at, and counts the hit.
var (
	egIPAllowed  = netip.MustParseAddr("198.51.100.10")
	egIPEvil     = netip.MustParseAddr("203.0.113.66")
	egIPUpstream = netip.MustParseAddr("203.0.113.53")
	egIPHostUp   = netip.MustParseAddr("203.0.113.2")
	egIPInetUp   = netip.MustParseAddr("203.0.113.1")
	egIPPrivate  = netip.MustParseAddr("10.0.0.5")
	egIPMetadata = netip.MustParseAddr("169.254.169.254")
	egRecords    = map[string]netip.Addr{"allowed.example.com": egIPAllowed, "evil-example.com": egIPEvil, "private.example.com": egIPPrivate}
)

type egressWorld struct {
	t          *testing.T
	host, inet netns.NsHandle
	// loopback is a listener on this process's own 127.0.0.1 (the real host's loopback).
	loopback string

	mu      sync.Mutex
	hits    map[string]int // web server local address → requests
	queries map[string]int // upstream DNS name → queries
}

// nsDo runs fn on a locked thread inside ns. A thread that cannot return to its namespace
// stays locked and dies with its goroutine.
func nsDo(ns netns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

func egMust(t *testing.T, err error, what string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func newEgressWorld(t *testing.T) *egressWorld {
	t.Helper()
	testutil.RequireRoot(t)
	if err := egresswire.Probe(); err != nil {
		t.Fatalf("egress probe: %v (this host runs the egress root tests)", err)
	}
	w := &egressWorld{t: t, hits: map[string]int{}, queries: map[string]int{}}
	w.host, w.inet = testutil.NewNetns(t), testutil.NewNetns(t)
	hh, err := netlink.NewHandleAt(w.host)
	egMust(t, err, "netlink host")
	defer hh.Close()
	ih, err := netlink.NewHandleAt(w.inet)
	egMust(t, err, "netlink inet")
	defer ih.Close()
	egMust(t, hh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "up0"}, PeerName: "up1", PeerNamespace: netlink.NsFd(int(w.inet))}), "uplink veth")
	up := func(h *netlink.Handle, name string, addrs ...string) netlink.Link {
		l, err := h.LinkByName(name)
		egMust(t, err, name)
		egMust(t, h.LinkSetUp(l), "up "+name)
		for _, a := range addrs {
			na, err := netlink.ParseAddr(a)
			egMust(t, err, a)
			na.Flags = unix.IFA_F_NODAD
			egMust(t, h.AddrAdd(l, na), "addr "+a)
		}
		return l
	}
	up(hh, "lo", egIPPrivate.String()+"/32", egIPMetadata.String()+"/32")
	up0 := up(hh, "up0", egIPHostUp.String()+"/30")
	up(ih, "up1", egIPInetUp.String()+"/30")
	up(ih, "lo", egIPAllowed.String()+"/32", egIPEvil.String()+"/32", egIPUpstream.String()+"/32")
	egMust(t, hh.RouteAdd(&netlink.Route{LinkIndex: up0.Attrs().Index, Gw: egIPInetUp.AsSlice()}), "host default route")

	w.serveHTTP(w.inet, ":8080")
	w.serveHTTP(w.host, ":8080")          // the private service, metadata, the host's own addresses
	w.serveHTTP(w.host, "127.0.0.1:8081") // the host namespace's loopback
	w.serveDNS()
	ln, err := net.Listen("tcp", "127.0.0.1:0") // this process's loopback only
	egMust(t, err, "loopback listener")
	w.serveOn(ln)
	w.loopback = ln.Addr().String()
	// The first ARP on a fresh link can be lost, which costs a one-second retry later.
	egMust(t, w.hostGet(egIPAllowed.String()+":8080"), "warm-up")
	return w
}

func (w *egressWorld) serveOn(ln net.Listener) {
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		local := r.Context().Value(http.LocalAddrContextKey).(net.Addr).String()
		w.mu.Lock()
		w.hits[local]++
		w.mu.Unlock()
		fmt.Fprintf(rw, "local=%s host=%s", local, r.Host)
	})}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ln) }()
	w.t.Cleanup(func() { srv.Close(); <-done })
}

func (w *egressWorld) serveHTTP(ns netns.NsHandle, addr string) {
	var ln net.Listener
	egMust(w.t, nsDo(ns, func() (err error) { ln, err = net.Listen("tcp", addr); return err }), "listen "+addr)
	w.serveOn(ln)
}

// serveDNS answers A queries for egRecords at the upstream address, NXDOMAIN for other names.
func (w *egressWorld) serveDNS() {
	var pc net.PacketConn
	egMust(w.t, nsDo(w.inet, func() (err error) {
		pc, err = net.ListenPacket("udp", netip.AddrPortFrom(egIPUpstream, 53).String())
		return err
	}), "dns listen")
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			var m dnsmessage.Message
			if m.Unpack(buf[:n]) != nil || len(m.Questions) != 1 {
				continue
			}
			q := m.Questions[0]
			name := strings.TrimSuffix(strings.ToLower(q.Name.String()), ".")
			w.mu.Lock()
			w.queries[name]++
			w.mu.Unlock()
			resp := dnsmessage.Message{Header: dnsmessage.Header{ID: m.ID, Response: true, Authoritative: true, RecursionDesired: m.RecursionDesired}, Questions: m.Questions}
			a, ok := egRecords[name]
			switch {
			case !ok:
				resp.RCode = dnsmessage.RCodeNameError
			case q.Type == dnsmessage.TypeA:
				resp.Answers = []dnsmessage.Resource{{Header: dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 60}, Body: &dnsmessage.AResource{A: a.As4()}}}
			}
			if out, err := resp.Pack(); err == nil {
				pc.WriteTo(out, from)
			}
		}
	}()
	w.t.Cleanup(func() { pc.Close(); <-done })
}

func (w *egressWorld) hitCount(addr string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.hits[addr]
}

func (w *egressWorld) queryCount(name string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.queries[name]
}

// hostGet is the positive control: a GET to addr from the host namespace.
func (w *egressWorld) hostGet(addr string) error {
	return nsDo(w.host, func() error { return httpGet(addr) })
}

func httpGet(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", addr)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != 200 || !strings.Contains(string(body), "local=") {
		return fmt.Errorf("status %d: %q", resp.StatusCode, body)
	}
	return nil
}

// hostResolve asks the upstream DNS directly from the host namespace (positive control). One
// UDP socket made on the namespace's thread: Go's resolver would dial from other goroutines,
// which run in this process's own namespace.
func (w *egressWorld) hostResolve(name string) (netip.Addr, error) {
	var got netip.Addr
	err := nsDo(w.host, func() error {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(egIPUpstream, 53)))
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		q := dnsmessage.Message{Header: dnsmessage.Header{ID: 77, RecursionDesired: true},
			Questions: []dnsmessage.Question{{Name: dnsmessage.MustNewName(name + "."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}}}
		out, err := q.Pack()
		if err != nil {
			return err
		}
		if _, err := c.Write(out); err != nil {
			return err
		}
		buf := make([]byte, 1500)
		n, err := c.Read(buf)
		if err != nil {
			return err
		}
		var m dnsmessage.Message
		if err := m.Unpack(buf[:n]); err != nil {
			return err
		}
		for _, a := range m.Answers {
			if r, ok := a.Body.(*dnsmessage.AResource); ok {
				got = netip.AddrFrom4(r.A)
				return nil
			}
		}
		return fmt.Errorf("no A record (rcode %v)", m.RCode)
	})
	return got, err
}

func (w *egressWorld) options(stateDir string) Options {
	host := w.host
	return Options{
		StateDir: stateDir, AgentPath: agentBin, ImageCacheDir: filepath.Join(stateDir, "images"),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Egress: EgressOptions{
			HostNetns:   &host,
			Upstream:    []netip.AddrPort{netip.AddrPortFrom(egIPUpstream, 53)},
			ExtraPublic: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("203.0.113.0/24")},
			PeekTimeout: 3 * time.Second,
		},
	}
}

// backend returns a local backend wired to this world; the cleanup terminates what the test
// left, closes it and checks that no egress state remains in the host namespace.
func (w *egressWorld) backend(stateDir string) *Backend {
	t := w.t
	t.Helper()
	b, err := New(context.Background(), w.options(stateDir))
	egMust(t, err, "new backend")
	t.Cleanup(func() {
		ctx := context.Background()
		list, _ := b.List(ctx)
		for _, s := range list {
			if err := b.Terminate(ctx, s.ID); err != nil {
				t.Errorf("cleanup: terminate %s: %v", s.ID, err)
			}
		}
		if err := b.Close(); err != nil {
			t.Errorf("cleanup: close: %v", err)
		}
		for _, d := range cgroupParentDirs(b) {
			_ = os.Remove(d)
		}
		if left := w.leftovers("", netip.Addr{}); len(left) > 0 {
			t.Errorf("egress state left in the host namespace: %v", left)
		}
	})
	return b
}

func egressDecl(id string, e spec.Egress) spec.Sandbox {
	d := hostDecl(id)
	d.Egress = e
	return d
}

func (w *egressWorld) create(b *Backend, id string, e spec.Egress) (*sandbox.Session, sandbox.Agent) {
	w.t.Helper()
	ctx := context.Background()
	s, err := b.Create(ctx, egressDecl(id, e))
	egMust(w.t, err, "create "+id)
	a, err := b.Connect(ctx, s.ID)
	egMust(w.t, err, "connect "+id)
	w.t.Cleanup(func() { a.Close() })
	return s, a
}

// probeScript connects to each (host, port, Host header) and reports "ok <body>", or how
// it failed: "dns" (no name), "connect" (no route, refused), "closed"/"reset" (the proxy
// accepted and refused).
const probeScript = `import json, socket, sys
def probe(host, port, hdr):
    try:
        s = socket.create_connection((host, port), timeout=5)
    except socket.gaierror as e:
        return "dns " + str(e)
    except OSError as e:
        return "connect " + str(e)
    try:
        s.settimeout(5)
        s.sendall(("GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % hdr).encode())
        data = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            data += b
        if data.startswith(b"HTTP/1.1 200"):
            return "ok " + data.split(b"\r\n\r\n", 1)[1].decode()
        return "closed " + repr(data[:100])
    except OSError as e:
        return "reset " + str(e)
    finally:
        s.close()
print(json.dumps([probe(h, p, hdr) for h, p, hdr in json.loads(sys.argv[1])]))
`

type egProbe struct {
	host string
	port int
	hdr  string // Host header; default host:port
}

// probe runs the probes inside the sandbox and returns one result each.
func egressProbes(t *testing.T, a sandbox.Agent, probes ...egProbe) []string {
	t.Helper()
	var args [][]any
	for _, p := range probes {
		hdr := p.hdr
		if hdr == "" {
			hdr = net.JoinHostPort(p.host, strconv.Itoa(p.port))
		}
		args = append(args, []any{p.host, p.port, hdr})
	}
	js, _ := json.Marshal(args)
	var out, errb strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	res, err := a.Exec(ctx, sandbox.ExecRequest{Argv: []string{"python3", "-c", probeScript, string(js)}, Timeout: 60 * time.Second}, &out, &errb)
	egMust(t, err, "exec probes")
	if res.ExitCode != 0 {
		t.Fatalf("probe script exit %d: %s", res.ExitCode, errb.String())
	}
	var got []string
	if err := json.Unmarshal([]byte(out.String()), &got); err != nil || len(got) != len(probes) {
		t.Fatalf("probe output %q: %v", out.String(), err)
	}
	return got
}

func egSh(t *testing.T, a sandbox.Agent, cmd string) string {
	t.Helper()
	out, errs, res := run(t, a, cmd)
	if res.ExitCode != 0 {
		t.Fatalf("%q: exit %d: %s", cmd, res.ExitCode, errs)
	}
	return out
}

func wantOK(t *testing.T, what, got, local string) {
	t.Helper()
	if !strings.HasPrefix(got, "ok ") || !strings.Contains(got, "local="+local) {
		t.Errorf("%s: want a response from %s, got %q", what, local, got)
	}
}

// wantRefused checks that the sandbox did not reach target (nor any server counted it) while
// the host namespace, or this process for the host's loopback, does reach it.
func (w *egressWorld) wantRefused(t *testing.T, what, got, target string, before int, control func() error) {
	t.Helper()
	if strings.HasPrefix(got, "ok ") {
		t.Errorf("%s: reached %s from the sandbox: %q", what, target, got)
	}
	if n := w.hitCount(target); n != before {
		t.Errorf("%s: the server at %s counted %d requests from the sandbox", what, target, n-before)
	}
	if err := control(); err != nil {
		t.Errorf("%s: positive control: %s is not reachable without the sandbox either, so the refusal proves nothing: %v", what, target, err)
	}
}

func TestEgressAllow(t *testing.T) {
	w := newEgressWorld(t)
	b := w.backend(testStateDir(t))
	if !b.Capabilities(context.Background()).Has(capability.PublicOnlyEgress) {
		t.Fatalf("publicOnlyEgress false: %v", b.Capabilities(context.Background()).Entries[capability.PublicOnlyEgress])
	}
	s, a := w.create(b, "eg-allow", spec.Egress{Mode: spec.EgressAllow})
	att := b.attachment(s.ID)
	if att == nil {
		t.Fatal("no attachment for an allow sandbox")
	}
	gw := netip.AddrPortFrom(att.Resolver(), 8080).String()
	if got := egSh(t, a, "cat /etc/resolv.conf"); !strings.Contains(got, "nameserver "+att.Resolver().String()+"\n") {
		t.Errorf("resolv.conf: %q", got)
	}
	lport, _ := strconv.Atoi(w.loopback[strings.LastIndexByte(w.loopback, ':')+1:])
	targets := []struct {
		what, target string
		probe        egProbe
		control      func() error
	}{
		{"private 10.x", egIPPrivate.String() + ":8080", egProbe{host: egIPPrivate.String(), port: 8080}, func() error { return w.hostGet(egIPPrivate.String() + ":8080") }},
		{"metadata", egIPMetadata.String() + ":8080", egProbe{host: egIPMetadata.String(), port: 8080}, func() error { return w.hostGet(egIPMetadata.String() + ":8080") }},
		{"this host's loopback", w.loopback, egProbe{host: "127.0.0.1", port: lport}, func() error { return httpGet(w.loopback) }},
		{"host netns loopback", "127.0.0.1:8081", egProbe{host: "127.0.0.1", port: 8081}, func() error { return w.hostGet("127.0.0.1:8081") }},
		{"the gateway address", gw, egProbe{host: att.Resolver().String(), port: 8080}, func() error { return w.hostGet(gw) }},
		{"the host's uplink address", egIPHostUp.String() + ":8080", egProbe{host: egIPHostUp.String(), port: 8080}, func() error { return w.hostGet(egIPHostUp.String() + ":8080") }},
	}
	probes := []egProbe{{host: "allowed.example.com", port: 8080}, {host: egIPEvil.String(), port: 8080}}
	before := map[string]int{}
	for _, tc := range targets {
		probes = append(probes, tc.probe)
		before[tc.target] = w.hitCount(tc.target)
	}
	got := egressProbes(t, a, probes...)
	wantOK(t, "allowed.example.com by name", got[0], egIPAllowed.String()+":8080")
	wantOK(t, "a public IP literal", got[1], egIPEvil.String()+":8080")
	for i, tc := range targets {
		w.wantRefused(t, tc.what, got[i+2], tc.target, before[tc.target], tc.control)
	}
	c, err := b.EgressCounters(context.Background(), s.ID)
	egMust(t, err, "counters")
	if c.ConnsAllowed < 2 || c.ConnsDenied < 4 {
		t.Errorf("counters %+v: want at least 2 allowed and 4 denied connections", c)
	}
	if al, de := b.EgressCounts(); al < c.ConnsAllowed || de < c.ConnsDenied {
		t.Errorf("EgressCounts %d/%d below the session's %+v", al, de, c)
	}
}

// TestEgressOpen: open reaches what allow refuses (private, metadata, the host's own
// addresses) as well as the public internet, and resolves names to private addresses; a
// live change to allow refuses the private ones again, and back to open reaches them.
func TestEgressOpen(t *testing.T) {
	w := newEgressWorld(t)
	b := w.backend(testStateDir(t))
	ctx := context.Background()
	s, a := w.create(b, "eg-open", spec.Egress{Mode: spec.EgressOpen})
	att := b.attachment(s.ID)
	if att == nil {
		t.Fatal("no attachment for an open sandbox")
	}
	if got := egSh(t, a, "cat /etc/resolv.conf"); !strings.Contains(got, "nameserver "+att.Resolver().String()+"\n") {
		t.Errorf("resolv.conf: %q", got)
	}
	private, metadata, uplink := egIPPrivate.String()+":8080", egIPMetadata.String()+":8080", egIPHostUp.String()+":8080"
	reachable := []struct {
		what, target string
		probe        egProbe
	}{
		{"a public name", egIPAllowed.String() + ":8080", egProbe{host: "allowed.example.com", port: 8080}},
		{"a public IP literal", egIPEvil.String() + ":8080", egProbe{host: egIPEvil.String(), port: 8080}},
		{"private 10.x", private, egProbe{host: egIPPrivate.String(), port: 8080}},
		{"private 10.x by a name", private, egProbe{host: "private.example.com", port: 8080}},
		{"metadata", metadata, egProbe{host: egIPMetadata.String(), port: 8080}},
		{"the host's uplink address", uplink, egProbe{host: egIPHostUp.String(), port: 8080}},
	}
	var probes []egProbe
	for _, r := range reachable {
		probes = append(probes, r.probe)
	}
	before := w.hitCount(private)
	got := egressProbes(t, a, probes...)
	for i, r := range reachable {
		wantOK(t, "open: "+r.what, got[i], r.target)
	}
	if n := w.hitCount(private); n != before+2 {
		t.Errorf("the private server counted %d requests, want 2", n-before)
	}
	// Never airlock's own plumbing or the host's loopback.
	lport, _ := strconv.Atoi(w.loopback[strings.LastIndexByte(w.loopback, ':')+1:])
	gw := netip.AddrPortFrom(att.Resolver(), 8080).String()
	before, beforeGW := w.hitCount(w.loopback), w.hitCount(gw)
	got = egressProbes(t, a, egProbe{host: "127.0.0.1", port: lport}, egProbe{host: att.Resolver().String(), port: 8080})
	w.wantRefused(t, "open: this host's loopback", got[0], w.loopback, before, func() error { return httpGet(w.loopback) })
	w.wantRefused(t, "open: the gateway address", got[1], gw, beforeGW, func() error { return w.hostGet(gw) })

	// Live: to allow, the private addresses are refused at once; back to open, reached.
	egMust(t, b.SetEgress(ctx, s.ID, spec.Egress{Mode: spec.EgressAllow}), "set allow")
	before = w.hitCount(private)
	got = egressProbes(t, a, egProbe{host: egIPPrivate.String(), port: 8080}, egProbe{host: "allowed.example.com", port: 8080}, egProbe{host: "private.example.com", port: 8080})
	w.wantRefused(t, "allow after open: private", got[0], private, before, func() error { return w.hostGet(private) })
	wantOK(t, "allow after open: public", got[1], egIPAllowed.String()+":8080")
	if !strings.HasPrefix(got[2], "dns ") {
		t.Errorf("allow after open: a name of a private address resolved: %q", got[2])
	}
	egMust(t, b.SetEgress(ctx, s.ID, spec.Egress{Mode: spec.EgressOpen}), "set open")
	wantOK(t, "open after allow: private", egressProbes(t, a, egProbe{host: egIPPrivate.String(), port: 8080})[0], private)
	if rec, err := egresswire.ReadRecord(filepath.Join(b.opts.StateDir, s.ID)); err != nil || rec.Egress.Mode != spec.EgressOpen {
		t.Errorf("egress record: %+v, %v", rec, err)
	}
	// To deny: the link goes.
	egMust(t, b.SetEgress(ctx, s.ID, spec.Egress{Mode: spec.EgressDeny}), "set deny")
	before = w.hitCount(private)
	got = egressProbes(t, a, egProbe{host: egIPPrivate.String(), port: 8080})
	if !strings.HasPrefix(got[0], "connect ") {
		t.Errorf("deny after open: %q, want no route", got[0])
	}
	w.wantRefused(t, "deny after open", got[0], private, before, func() error { return w.hostGet(private) })

	// A sandbox born under deny, widened straight to open.
	d, da := w.create(b, "eg-open-late", spec.Egress{})
	egMust(t, b.SetEgress(ctx, d.ID, spec.Egress{Mode: spec.EgressOpen}), "widen deny-born to open")
	got = egressProbes(t, da, egProbe{host: "private.example.com", port: 8080}, egProbe{host: egIPMetadata.String(), port: 8080})
	wantOK(t, "deny-born, widened to open: private by name", got[0], private)
	wantOK(t, "deny-born, widened to open: metadata", got[1], metadata)
}

func TestEgressAllowDomains(t *testing.T) {
	w := newEgressWorld(t)
	b := w.backend(testStateDir(t))
	s, a := w.create(b, "eg-domains", spec.Egress{Mode: spec.EgressAllowDomains, Domains: []string{"*.example.com"}})
	evil := egIPEvil.String() + ":8080"
	allowed := egIPAllowed.String() + ":8080"
	beforeEvil, beforeAllowed, evilQueries := w.hitCount(evil), w.hitCount(allowed), w.queryCount("evil-example.com")
	got := egressProbes(t, a,
		egProbe{host: "allowed.example.com", port: 8080},                      // our resolver, then the proxy, on port 8080
		egProbe{host: "evil-example.com", port: 8080},                         // a look-alike: NXDOMAIN from our resolver
		egProbe{host: egIPEvil.String(), port: 8080, hdr: "evil-example.com"}, // and by its address
		egProbe{host: egIPAllowed.String(), port: 8080},                       // an IP literal
	)
	wantOK(t, "allowed.example.com", got[0], allowed)
	if w.hitCount(allowed) != beforeAllowed+1 {
		t.Errorf("allowed server counted %d requests, want 1", w.hitCount(allowed)-beforeAllowed)
	}
	if !strings.HasPrefix(got[1], "dns ") {
		t.Errorf("evil-example.com resolved in the sandbox: %q", got[1])
	}
	if n := w.queryCount("evil-example.com"); n != evilQueries {
		t.Errorf("our resolver forwarded %d queries for a name the policy does not allow", n-evilQueries)
	}
	if a, err := w.hostResolve("evil-example.com"); err != nil || a != egIPEvil {
		t.Errorf("positive control: upstream answers evil-example.com with %v, %v", a, err)
	}
	w.wantRefused(t, "look-alike by address", got[2], evil, beforeEvil, func() error { return w.hostGet(evil) })
	w.wantRefused(t, "IP literal", got[3], allowed, beforeAllowed+1, func() error { return w.hostGet(allowed) })
	c, err := b.EgressCounters(context.Background(), s.ID)
	egMust(t, err, "counters")
	if c.ConnsAllowed != 1 || c.ConnsDenied != 2 || c.DNSDenied == 0 {
		t.Errorf("counters %+v: want 1 allowed, 2 denied connections and a denied query", c)
	}
}

func TestEgressDeny(t *testing.T) {
	w := newEgressWorld(t)
	b := w.backend(testStateDir(t))
	s, a := w.create(b, "eg-deny", spec.Egress{Mode: spec.EgressDeny})
	if b.attachment(s.ID) != nil {
		t.Error("a deny sandbox was attached")
	}
	if _, err := os.Stat(filepath.Join(b.opts.StateDir, s.ID, egresswire.File)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a deny sandbox has an egress record: %v", err)
	}
	if got := egSh(t, a, "ls /sys/class/net; cat /etc/resolv.conf"); got != "lo\n" {
		t.Errorf("interfaces and resolv.conf: %q, want only lo and no nameserver", got)
	}
	lport, _ := strconv.Atoi(w.loopback[strings.LastIndexByte(w.loopback, ':')+1:])
	before := w.hitCount(w.loopback)
	// The sandbox's own loopback works: a server inside, reached from inside.
	inside := egSh(t, a, `python3 -c '
import http.server, threading, urllib.request
s = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
threading.Thread(target=s.serve_forever, daemon=True).start()
print(urllib.request.urlopen("http://127.0.0.1:%d/" % s.server_port, timeout=5).status)'`)
	if inside != "200\n" {
		t.Errorf("loopback inside the sandbox: %q", inside)
	}
	got := egressProbes(t, a,
		egProbe{host: "allowed.example.com", port: 8080},
		egProbe{host: egIPAllowed.String(), port: 8080},
		egProbe{host: egIPPrivate.String(), port: 8080},
		egProbe{host: "127.0.0.1", port: lport},
	)
	if !strings.HasPrefix(got[0], "dns ") {
		t.Errorf("a name resolved under deny: %q", got[0])
	}
	for i, addr := range []string{egIPAllowed.String() + ":8080", egIPPrivate.String() + ":8080"} {
		if !strings.HasPrefix(got[i+1], "connect ") {
			t.Errorf("%s under deny: %q, want no route", addr, got[i+1])
		}
	}
	w.wantRefused(t, "this host's loopback", got[3], w.loopback, before, func() error { return httpGet(w.loopback) })
	if err := w.hostGet(egIPAllowed.String() + ":8080"); err != nil {
		t.Errorf("positive control: %v", err)
	}
}

func TestEgressSetPolicy(t *testing.T) {
	w := newEgressWorld(t)
	b := w.backend(testStateDir(t))
	ctx := context.Background()
	s, a := w.create(b, "eg-live", spec.Egress{Mode: spec.EgressAllowDomains, Domains: []string{"allowed.example.com"}})
	allowed := egIPAllowed.String() + ":8080"
	byName := egProbe{host: "allowed.example.com", port: 8080}
	byIP := egProbe{host: egIPAllowed.String(), port: 8080}
	got := egressProbes(t, a, byName, byIP)
	wantOK(t, "allowDomains, by name", got[0], allowed)
	if strings.HasPrefix(got[1], "ok ") {
		t.Fatalf("allowDomains, IP literal reached: %q", got[1])
	}

	// Tighten to deny: new connections are cut, the link is gone.
	egMust(t, b.SetEgress(ctx, s.ID, spec.Egress{Mode: spec.EgressDeny}), "set deny")
	before := w.hitCount(allowed)
	got = egressProbes(t, a, byName, byIP)
	for i, g := range got {
		if strings.HasPrefix(g, "ok ") {
			t.Errorf("probe %d reached the server after the move to deny: %q", i, g)
		}
	}
	w.wantRefused(t, "after deny", "", allowed, before, func() error { return w.hostGet(allowed) })
	if out := egSh(t, a, "ls /sys/class/net"); out != "lo\n" {
		t.Errorf("interfaces under deny: %q", out)
	}
	if left := w.leftovers("", netip.Addr{}); len(left) > 0 {
		t.Errorf("deny keeps %v", left)
	}

	// Widen to allow: a public IP literal is fine now, and the name resolves again.
	egMust(t, b.SetEgress(ctx, s.ID, spec.Egress{Mode: spec.EgressAllow}), "set allow")
	got = egressProbes(t, a, byName, byIP)
	wantOK(t, "allow, by name", got[0], allowed)
	wantOK(t, "allow, IP literal", got[1], allowed)
	if rec, err := egresswire.ReadRecord(filepath.Join(b.opts.StateDir, s.ID)); err != nil || rec.Egress.Mode != spec.EgressAllow {
		t.Errorf("egress record after the change: %+v, %v", rec, err)
	}

	// Invalid policies are refused and change nothing.
	for _, bad := range []spec.Egress{{Mode: "wide"}, {Mode: spec.EgressAllow, Domains: []string{"a.example.com"}}, {Mode: spec.EgressAllowDomains}} {
		if err := b.SetEgress(ctx, s.ID, bad); !errors.Is(err, sandbox.ErrInvalid) {
			t.Errorf("SetEgress(%+v): %v, want ErrInvalid", bad, err)
		}
	}
	wantOK(t, "allow after refused changes", egressProbes(t, a, byIP)[0], allowed)

	// A sandbox born under deny can be widened: it is attached then, and told its resolver.
	d, da := w.create(b, "eg-born-deny", spec.Egress{})
	if got := egressProbes(t, da, byIP)[0]; !strings.HasPrefix(got, "connect ") {
		t.Fatalf("deny-born sandbox: %q", got)
	}
	egMust(t, b.SetEgress(ctx, d.ID, spec.Egress{Mode: spec.EgressAllowDomains, Domains: []string{"*.example.com"}}), "widen deny-born")
	got = egressProbes(t, da, byName, byIP)
	wantOK(t, "widened deny-born, by name", got[0], allowed)
	if strings.HasPrefix(got[1], "ok ") {
		t.Errorf("widened to allowDomains, yet an IP literal passed: %q", got[1])
	}
}

func TestEgressTerminateLeavesNothing(t *testing.T) {
	w := newEgressWorld(t)
	b := w.backend(testStateDir(t))
	s, _ := w.create(b, "eg-term", spec.Egress{Mode: spec.EgressAllowDomains, Domains: []string{"*.example.com"}})
	gw := b.attachment(s.ID).Resolver()
	left := w.leftovers(s.ID, gw)
	for _, want := range []string{"link ", "table ", "tcp listener ", "udp socket "} {
		if !strings.Contains(strings.Join(left, "\n"), want) {
			t.Fatalf("a live sandbox shows no %q in %v: the leftover check would see nothing", want, left)
		}
	}
	pid := b.sessionInitPID(s.ID)
	egMust(t, b.Terminate(context.Background(), s.ID), "terminate")
	if left := w.leftovers(s.ID, gw); len(left) > 0 {
		t.Errorf("terminate left %v", left)
	}
	assertGone(t, b, s.ID, pid)
}

// leftovers lists egress state in the host namespace: sandbox links, airlock tables, and
// sockets on a sandbox pool address (the resolver and the proxy). With an id, only that
// sandbox's link and table, and sockets only on its gateway address gw when valid.
func (w *egressWorld) leftovers(id string, gw netip.Addr) []string {
	var left []string
	h, err := netlink.NewHandleAt(w.host)
	if err != nil {
		return []string{"netlink: " + err.Error()}
	}
	defer h.Close()
	links, _ := h.LinkList()
	for _, l := range links {
		n := l.Attrs().Name
		if (id == "" && strings.HasPrefix(n, "al")) || (id != "" && n == hostIfNameFor(id)) {
			left = append(left, "link "+n)
		}
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(w.host)))
	if err != nil {
		return append(left, "nftables: "+err.Error())
	}
	tables, _ := c.ListTables()
	for _, tb := range tables {
		if (id == "" && strings.HasPrefix(tb.Name, "airlock_")) || tb.Name == "airlock_"+id {
			left = append(left, "table "+tb.Name)
		}
	}
	pool := netip.MustParsePrefix("10.200.0.0/16")
	_ = nsDo(w.host, func() error {
		for _, f := range []struct{ file, what string }{{"tcp", "tcp listener "}, {"udp", "udp socket "}} {
			data, err := os.ReadFile("/proc/thread-self/net/" + f.file)
			if err != nil {
				left = append(left, err.Error())
				continue
			}
			for _, line := range strings.Split(string(data), "\n")[1:] {
				fs := strings.Fields(line)
				if len(fs) < 4 || (f.file == "tcp" && fs[3] != "0A") {
					continue
				}
				if a, ok := procNetAddr(fs[1]); ok && ((id == "" && pool.Contains(a.Addr())) || a.Addr() == gw) {
					left = append(left, f.what+a.String())
				}
			}
		}
		return nil
	})
	return left
}

// procNetAddr parses /proc/net/tcp's "0100007F:1F90" (little-endian IPv4, hex port).
func procNetAddr(s string) (netip.AddrPort, bool) {
	ip, port, ok := strings.Cut(s, ":")
	b, err := hex.DecodeString(ip)
	if !ok || err != nil || len(b) != 4 {
		return netip.AddrPort{}, false
	}
	p, err := strconv.ParseUint(port, 16, 16)
	if err != nil {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[3], b[2], b[1], b[0]}), uint16(p)), true
}

// hostIfNameFor mirrors egress's naming of a sandbox's host link ("al" + 12 hex of sha256).
func hostIfNameFor(id string) string {
	sum := sha256.Sum256([]byte(id))
	return "al" + hex.EncodeToString(sum[:6])
}

type egHelperSession struct {
	ID  string `json:"id"`
	PID int    `json:"pid"`
}

// egressHelperEnv makes TestEgressCreatorProcess the creating process of TestEgressReconcile.
const egressHelperEnv = "AIRLOCK_EGRESS_TEST_CREATOR"

// TestEgressCreatorProcess is not a test: run by TestEgressReconcile as a separate process,
// it creates two allowDomains sandboxes with the host namespace it inherits as fd 3, prints
// their ids and init pids, and waits to be SIGKILLed.
func TestEgressCreatorProcess(t *testing.T) {
	if os.Getenv(egressHelperEnv) == "" {
		t.Skip("the creating process of TestEgressReconcile")
	}
	host := netns.NsHandle(3)
	opts := Options{
		StateDir: os.Getenv(egressHelperEnv), AgentPath: os.Getenv("AIRLOCK_EGRESS_TEST_AGENT"),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Egress: EgressOptions{
			HostNetns:   &host,
			Upstream:    []netip.AddrPort{netip.AddrPortFrom(egIPUpstream, 53)},
			ExtraPublic: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("203.0.113.0/24")},
		},
	}
	b, err := New(context.Background(), opts)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	for _, id := range []string{"eg-survivor", "eg-victim"} {
		s, err := b.Create(context.Background(), egressDecl(id, spec.Egress{Mode: spec.EgressAllowDomains, Domains: []string{"*.example.com"}}))
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Printf("{\"id\":%q,\"pid\":%d}\n", s.ID, b.sessionInitPID(s.ID))
	}
	fmt.Println("ready")
	time.Sleep(time.Hour)
}

func TestEgressReconcile(t *testing.T) {
	w := newEgressWorld(t)
	stateDir := testStateDir(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestEgressCreatorProcess$")
	cmd.Env = append(os.Environ(), egressHelperEnv+"="+stateDir, "AIRLOCK_EGRESS_TEST_AGENT="+agentBin)
	fd, err := unix.FcntlInt(uintptr(w.host), unix.F_DUPFD_CLOEXEC, 0)
	egMust(t, err, "dup host netns")
	hostFile := os.NewFile(uintptr(fd), "host-netns")
	defer hostFile.Close()
	cmd.ExtraFiles = []*os.File{hostFile}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	egMust(t, err, "pipe")
	egMust(t, cmd.Start(), "start creator")
	var made []egHelperSession
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		if line == "ready" {
			break
		}
		if strings.HasPrefix(line, "error:") {
			t.Fatal(line)
		}
		var hs egHelperSession
		if json.Unmarshal([]byte(line), &hs) == nil {
			made = append(made, hs)
		}
	}
	if len(made) != 2 {
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		t.Fatalf("creator made %d sandboxes", len(made))
	}
	survivor, victim := made[0], made[1]

	// While the creator lives, another process finds its sandboxes but leaves their egress
	// to it: no takeover, and no policy change or counters from here.
	ctx := context.Background()
	other, err := New(ctx, w.options(stateDir))
	egMust(t, err, "second process's backend")
	a, err := other.Connect(ctx, survivor.ID)
	egMust(t, err, "connect survivor from another process")
	if other.attachment(survivor.ID) != nil {
		t.Error("a live creator's sandbox was taken over")
	}
	if err := other.SetEgress(ctx, survivor.ID, spec.Egress{Mode: spec.EgressAllow}); !errors.Is(err, sandbox.ErrConflict) {
		t.Errorf("SetEgress on a live creator's sandbox: %v, want ErrConflict", err)
	}
	if _, err := other.EgressCounters(ctx, survivor.ID); !errors.Is(err, sandbox.ErrConflict) {
		t.Errorf("EgressCounters on a live creator's sandbox: %v, want ErrConflict", err)
	}
	wantOK(t, "survivor through its live creator's proxy", egressProbes(t, a, egProbe{host: "allowed.example.com", port: 8080})[0], egIPAllowed.String()+":8080")
	a.Close()
	egMust(t, other.Close(), "close the second backend")

	egMust(t, cmd.Process.Signal(syscall.SIGKILL), "kill creator")
	_ = cmd.Wait()
	// The victim dies too: its namespace goes, and with it the veth; the table stays.
	egMust(t, unix.Kill(victim.PID, unix.SIGKILL), "kill victim init")
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", victim.PID)); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("victim init %d does not go", victim.PID)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if left := w.leftovers(victim.ID, netip.Addr{}); !strings.Contains(strings.Join(left, "\n"), "table airlock_"+victim.ID) {
		t.Fatalf("the dead creator left no table for the victim (%v): the test would prove nothing", left)
	}
	if left := w.leftovers(survivor.ID, netip.Addr{}); len(left) < 2 {
		t.Fatalf("the dead creator left %v for the survivor", left)
	}

	b := w.backend(stateDir) // reconcile: the victim is reaped, the survivor adopted
	if left := w.leftovers(victim.ID, netip.Addr{}); len(left) > 0 {
		t.Errorf("reconcile left the dead sandbox's %v", left)
	}
	if _, err := os.Stat(filepath.Join(stateDir, victim.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("victim state dir: %v", err)
	}
	if b.attachment(survivor.ID) == nil {
		t.Fatal("the adopted survivor was not attached again")
	}
	a, err = b.Connect(context.Background(), survivor.ID)
	egMust(t, err, "connect survivor")
	defer a.Close()
	got := egressProbes(t, a, egProbe{host: "allowed.example.com", port: 8080}, egProbe{host: egIPAllowed.String(), port: 8080})
	wantOK(t, "survivor, by name, after the takeover", got[0], egIPAllowed.String()+":8080")
	if strings.HasPrefix(got[1], "ok ") {
		t.Errorf("survivor's policy lost in the takeover: IP literal reached: %q", got[1])
	}
	rec, err := egresswire.ReadRecord(filepath.Join(stateDir, survivor.ID))
	if err != nil || rec.Owner != egresswire.Self() {
		t.Errorf("survivor's egress record: %+v, %v; want this process as its owner", rec, err)
	}
	egMust(t, b.Terminate(context.Background(), survivor.ID), "terminate survivor")
	if left := w.leftovers("", netip.Addr{}); len(left) > 0 {
		t.Errorf("left %v", left)
	}
}
