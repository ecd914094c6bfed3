//go:build cluster

package kubernetes_test

import (
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	kb "github.com/airlock-sandbox/airlock/backend/kubernetes"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// The egress tests prove a sandbox pod's declared egress by traffic: from inside the pod, a TCP
// connection to another pod, to the node, to the API server and to a host on a fake internet
// (TEST-NET-3 in a network namespace this test makes on the node, which deploy.sh declares
// public with the chart's egressPublic) either connects or is refused, exactly as the mode says.
// The test cluster enforces NetworkPolicy with kube-router (hack/testcluster/up.sh).

// fakeInternet is the host the fake internet serves on; deploy.sh's egressPublic holds it.
var fakeInternet = netip.MustParseAddr("203.0.113.80")

// egressTargets are the probes' destinations, host:port each.
type egressTargets map[string]string

// egressWant is what each mode lets through: deny nothing; public-only (allow) the fake
// internet only (the pod network, the node and the API server are private or documentation
// space); open everything.
var egressWant = map[spec.EgressMode][]string{
	spec.EgressDeny:  nil,
	spec.EgressAllow: {"internet"},
	spec.EgressOpen:  {"apiserver", "internet", "node", "pod"},
}

// egressByTraffic declares one Sandbox per mode, claims a session of each and probes every
// target from inside it. e's namespace gets the target pod; the node and the fake internet
// listen in this process.
func egressByTraffic(t *testing.T, e *env, b *kb.Backend) {
	targets := newEgressTargets(t, e)
	modes := []spec.EgressMode{spec.EgressDeny, spec.EgressAllow, spec.EgressOpen}
	decls := map[spec.EgressMode]spec.Sandbox{}
	for _, m := range modes {
		d := baseDecl("egress-" + string(m))
		d.Egress = spec.Egress{Mode: m}
		e.sandboxCR(d, 1, 0)
		decls[m] = d
	}
	for _, m := range modes {
		e.waitIdle(decls[m].ID, 1)
	}
	for _, m := range modes {
		t.Run(string(m), func(t *testing.T) {
			s, err := b.Create(ctxT(t), withDefaults(decls[m]))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Terminate(ctxT(t), s.ID) })
			a, err := b.Connect(ctxT(t), s.ID)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			got := probe(t, a, targets)
			t.Logf("egress %s: %v", m, got)
			for _, name := range slices.Sorted(maps.Keys(targets)) {
				wantOpen := slices.Contains(egressWant[m], name)
				if open := got[name] == "open"; open != wantOpen {
					t.Errorf("egress %s: %s (%s) %s, want %s", m, name, targets[name], got[name], map[bool]string{true: "open", false: "refused"}[wantOpen])
				}
			}
		})
	}
}

// probeScript connects to each name=host:port argument at once and prints "name open" or
// "name refused <why>". 20 s per connection: an allowed one on this node's bridge takes
// milliseconds, so only a dropped one waits that long, and a slow machine cannot turn an
// allowed connection into a refused one.
const probeScript = `
import errno, socket, sys, threading
res = {}
def probe(name, host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(20)
    try:
        s.connect((host, int(port)))
        res[name] = "open"
    except socket.timeout:
        res[name] = "refused timeout"
    except OSError as e:
        res[name] = "refused " + errno.errorcode.get(e.errno, str(e.errno))
    finally:
        s.close()
ts = []
for a in sys.argv[1:]:
    name, hostport = a.split("=", 1)
    host, port = hostport.rsplit(":", 1)
    ts.append(threading.Thread(target=probe, args=(name, host, port)))
for t in ts: t.start()
for t in ts: t.join()
for name in sorted(res): print(name, res[name])
`

func probe(t *testing.T, a sandbox.Agent, targets egressTargets) map[string]string {
	t.Helper()
	argv := []string{"python3", "-c", probeScript}
	for name, addr := range targets {
		argv = append(argv, name+"="+addr)
	}
	out, stderr, res := execOut(t, a, sandbox.ExecRequest{Argv: argv, Timeout: 2 * time.Minute})
	if res.ExitCode != 0 {
		t.Fatalf("probe: exit %d\n%s%s", res.ExitCode, out, stderr)
	}
	got := map[string]string{}
	for line := range strings.Lines(out) {
		name, verdict, _ := strings.Cut(strings.TrimSpace(line), " ")
		got[name] = verdict
	}
	if len(got) != len(targets) {
		t.Fatalf("probe printed %q, want one line per target %v", out, targets)
	}
	return got
}

// newEgressTargets starts the four destinations and checks this host reaches each, so a
// refused probe is the policy's doing, not a dead target.
func newEgressTargets(t *testing.T, e *env) egressTargets {
	nodeIP := kubectl(t, "", "get", "node", "-o", `jsonpath={.items[0].status.addresses[?(@.type=="InternalIP")].address}`)
	ln, err := net.Listen("tcp", net.JoinHostPort(nodeIP, "0"))
	if err != nil {
		t.Fatal(err)
	}
	acceptAll(t, ln)
	targets := egressTargets{
		"node":      ln.Addr().String(),
		"apiserver": net.JoinHostPort(nodeIP, "6443"),
		"internet":  fakeInternetListener(t),
		"pod":       targetPod(t, e),
	}
	for name, addr := range targets {
		c, err := net.DialTimeout("tcp", addr, 20*time.Second)
		if err != nil {
			t.Fatalf("the node cannot reach the %s target %s: %v", name, addr, err)
		}
		c.Close()
	}
	return targets
}

// acceptAll answers every connection on ln with "hello" until the test ends.
func acceptAll(t *testing.T, ln net.Listener) { acceptAllCounting(t, ln, nil, "") }

// acceptAllCounting is acceptAll counting each connection in hits (when not nil) as key.
func acceptAllCounting(t *testing.T, ln net.Listener, hits *hitCounter, key string) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if hits != nil {
				hits.add(key)
			}
			io.WriteString(c, "hello\n")
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
}

// fakeInternetListener makes the fake internet (newFakeNet: 203.0.113.1/30 ↔ .2/30, the host
// 203.0.113.80), listens on it and returns the address.
func fakeInternetListener(t *testing.T) string {
	ns := newFakeNet(t, fakeNet{hostLink: "alk8s-inet", peerLink: "inet0", hostAddr: "203.0.113.1/30", peerAddr: "203.0.113.2/30",
		hosts: []netip.Addr{fakeInternet}})
	var ln net.Listener
	inNetns(t, ns, func() (err error) {
		if ln, err = net.Listen("tcp", net.JoinHostPort(fakeInternet.String(), "0")); err != nil {
			return fmt.Errorf("listen on the fake internet: %w", err)
		}
		return nil
	})
	acceptAll(t, ln)
	return ln.Addr().String()
}

// fakeNet describes a fake internet: a network namespace joined to the node by a veth pair,
// its hosts on the namespace's loopback, routed both ways. The egress tests each make one, on
// addresses of their own, so they can run side by side.
type fakeNet struct {
	hostLink, peerLink string // the veth's ends: on the node, in the namespace
	hostAddr, peerAddr string // the link's two ends, one /30
	hosts              []netip.Addr
}

// newFakeNet makes f and returns its namespace (closed, and the veth removed, when the test
// ends).
func newFakeNet(t *testing.T, f fakeNet) netns.NsHandle {
	t.Helper()
	testutil.RequireRoot(t)
	if l, err := netlink.LinkByName(f.hostLink); err == nil { // a crashed run's
		netlink.LinkDel(l)
	}
	ns := testutil.NewNetns(t)
	ih, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer ih.Close()
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: f.hostLink}, PeerName: f.peerLink, PeerNamespace: netlink.NsFd(int(ns))}); err != nil {
		t.Fatalf("veth: %v", err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(f.hostLink); err == nil {
			netlink.LinkDel(l)
		}
	})
	up := func(h *netlink.Handle, name string, addrs ...string) netlink.Link {
		l, err := h.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
		for _, a := range addrs {
			na, err := netlink.ParseAddr(a)
			if err != nil {
				t.Fatal(err)
			}
			na.Flags = unix.IFA_F_NODAD
			if err := h.AddrAdd(l, na); err != nil {
				t.Fatalf("addr %s on %s: %v", a, name, err)
			}
		}
		return l
	}
	hh, err := netlink.NewHandle()
	if err != nil {
		t.Fatal(err)
	}
	defer hh.Close()
	hl := up(hh, f.hostLink, f.hostAddr)
	il := up(ih, f.peerLink, f.peerAddr)
	var lo []string
	for _, a := range f.hosts {
		lo = append(lo, a.String()+"/32")
	}
	up(ih, "lo", lo...)
	hostGw, peerGw := gateway(t, f.hostAddr), gateway(t, f.peerAddr)
	for _, a := range f.hosts {
		if err := hh.RouteAdd(&netlink.Route{LinkIndex: hl.Attrs().Index, Dst: netlink.NewIPNet(a.AsSlice()), Gw: peerGw}); err != nil {
			t.Fatalf("route to %s: %v", a, err)
		}
	}
	if err := ih.RouteAdd(&netlink.Route{LinkIndex: il.Attrs().Index, Gw: hostGw}); err != nil {
		t.Fatalf("the fake internet's default route: %v", err)
	}
	return ns
}

// gateway is the address of prefix p ("a.b.c.d/n"), as a route's gateway.
func gateway(t *testing.T, p string) net.IP {
	pp, err := netip.ParsePrefix(p)
	if err != nil {
		t.Fatal(err)
	}
	return net.IP(pp.Addr().AsSlice())
}

// inNetns runs fn on a thread inside ns; a thread that cannot go back dies with its goroutine.
func inNetns(t *testing.T, ns netns.NsHandle, fn func() error) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			errc <- err
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- fmt.Errorf("back to the node's netns: %w", err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// targetPod runs a plain pod (no policy selects it) listening on 8000 in e's namespace and
// returns its address.
func targetPod(t *testing.T, e *env) string {
	const listen = `
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8000)); s.listen(64)
while True:
    c, _ = s.accept(); c.sendall(b"hello\n"); c.close()
`
	pod := fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"egress-target","namespace":%q},
"spec":{"terminationGracePeriodSeconds":0,"containers":[{"name":"listen","image":%q,"imagePullPolicy":"IfNotPresent",
"command":["python3","-c",%q],"readinessProbe":{"tcpSocket":{"port":8000},"periodSeconds":1}}]}}`, e.ns, testImage, listen)
	kubectl(t, pod, "apply", "-f", "-")
	kubectl(t, "", "-n", e.ns, "wait", "--for=condition=Ready", "--timeout=3m", "pod/egress-target")
	ip := kubectl(t, "", "-n", e.ns, "get", "pod", "egress-target", "-o", "jsonpath={.status.podIP}")
	return net.JoinHostPort(ip, "8000")
}
