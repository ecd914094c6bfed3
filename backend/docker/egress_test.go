package docker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// Egress open on the docker backend: the container joins an engine network that reaches out.
// What reaching out means is the engine's and the host's business (NAT, forwarding); the
// private dockerd here runs without either, so the test's own network reaches exactly one host,
// the network's gateway address on this machine, where the test listens. A connection that
// arrives there from the container's address on that network has left the container's
// namespace through the engine's network, which is what open gives; deny's --network none
// cannot make it. The subnets are slices of TEST-NET-3, which nothing on this host routes.

// hostListener accepts TCP connections on addr and answers each with the peer's address.
type hostListener struct {
	ln net.Listener
	// in runs a dial where the listener is (its namespace); nil: this process's own.
	in    func(func() error) error
	mu    sync.Mutex
	peers []netip.Addr
	wg    sync.WaitGroup
}

func listenOn(t *testing.T, addr string) *hostListener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	h := &hostListener{ln: ln}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			peer := netip.MustParseAddrPort(c.RemoteAddr().String()).Addr().Unmap()
			h.mu.Lock()
			h.peers = append(h.peers, peer)
			h.mu.Unlock()
			fmt.Fprintf(c, "hello %s\n", peer)
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); h.wg.Wait() })
	return h
}

func (h *hostListener) seen() []netip.Addr {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]netip.Addr(nil), h.peers...)
}

// connectScript connects to argv[1]:argv[2] and prints what the server says, or "error <what>".
const connectScript = `import socket, sys
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
    print(s.makefile().readline().strip())
except OSError as e:
    print("error", e)
`

func connectFrom(t *testing.T, a sandbox.Agent, addr netip.AddrPort) string {
	t.Helper()
	out, errs, res := run(t, a, fmt.Sprintf("python3 -c '%s' %s %d", connectScript, addr.Addr(), addr.Port()))
	if res.ExitCode != 0 {
		t.Fatalf("connect script: exit %d: %s", res.ExitCode, errs)
	}
	return strings.TrimSpace(out)
}

// dockerNetwork creates a bridge network on the private dockerd, removed when the test ends.
func dockerNetwork(t *testing.T, name, bridge string, subnet netip.Prefix, internal bool) netip.Addr {
	t.Helper()
	c, err := client.New(client.WithHost(dockerHost), client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	gw := subnet.Addr().Next()
	// A leftover of an interrupted run goes first.
	_, _ = c.NetworkRemove(ctx, name, client.NetworkRemoveOptions{})
	_, err = c.NetworkCreate(ctx, name, client.NetworkCreateOptions{
		Driver:   "bridge",
		Internal: internal,
		IPAM:     &network.IPAM{Config: []network.IPAMConfig{{Subnet: subnet, Gateway: gw}}},
		Options:  map[string]string{"com.docker.network.bridge.name": bridge},
	})
	if err != nil {
		t.Fatalf("docker network create %s: %v", name, err)
	}
	t.Cleanup(func() {
		if _, err := c.NetworkRemove(context.Background(), name, client.NetworkRemoveOptions{}); err != nil {
			t.Errorf("docker network rm %s: %v", name, err)
		}
	})
	return gw
}

// TestEgressOpen: an open container reaches the host through the engine's network, a deny one
// on the same backend cannot; an engine without the network, or with an internal one, is
// refused at Create rather than giving the container no network.
func TestEgressOpen(t *testing.T) {
	requireDocker(t)
	subnet := netip.MustParsePrefix("203.0.113.240/28")
	gw := dockerNetwork(t, "airlock-open-test", "al-opentest", subnet, false)
	dockerNetwork(t, "airlock-internal-test", "al-internaltest", netip.MustParsePrefix("203.0.113.232/29"), true)
	for _, engine := range []string{EngineAPI, EngineDocker} {
		t.Run(engine, func(t *testing.T) {
			testEgressOpen(t, engine, spec.Image{Ref: testImageRef}, "airlock-open-test", subnet, gw)

			// The private dockerd runs with --bridge=none: it has no default network, and
			// an open sandbox is refused naming what is missing.
			b := newTestBackend(t, engine)
			d := spec.Sandbox{ID: "open-nonet", Image: spec.Image{Ref: testImageRef}, Egress: spec.Egress{Mode: spec.EgressOpen}}
			d.ApplyDefaults()
			_, err := b.Create(context.Background(), d)
			if !errors.Is(err, sandbox.ErrUnsupported) || !strings.Contains(err.Error(), `network "bridge"`) || !strings.Contains(err.Error(), "OpenNetwork") {
				t.Errorf("open without a default network: %v, want ErrUnsupported naming network \"bridge\" and OpenNetwork", err)
			}
			b.opts.OpenNetwork = "airlock-internal-test"
			_, err = b.Create(context.Background(), d)
			if !errors.Is(err, sandbox.ErrUnsupported) || !strings.Contains(err.Error(), "internal") {
				t.Errorf("open on an internal network: %v, want ErrUnsupported saying it is internal", err)
			}
		})
	}
}

// TestEgressOpenPodman: the same through podman, with podman (and so its CNI plugins) run in
// a network namespace the test makes, through a wrapper on PATH: the bridge network podman
// builds there (a gateway address on the bridge, which turns that namespace's forwarding on)
// changes nothing in the host's own network.
func TestEgressOpenPodman(t *testing.T) {
	requirePodman(t)
	podman, err := exec.LookPath("podman")
	if err != nil {
		t.Fatal(err)
	}
	ns := testutil.NewNetns(t)
	if err := inNetns(ns, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	}); err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	wrapper := fmt.Sprintf("#!/bin/sh\nexec nsenter --net=/proc/%d/fd/%d %s \"$@\"\n", os.Getpid(), int(ns), podman)
	if err := os.WriteFile(filepath.Join(bin, "podman"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))

	subnet := netip.MustParsePrefix("203.0.113.224/28")
	gw := subnet.Addr().Next()
	const name = "airlock-open-test"
	netDir := t.TempDir()
	// No ipMasq and no firewall plugin: nothing is added to any firewall.
	conflist := fmt.Sprintf(`{"cniVersion": "0.4.0", "name": %q, "plugins": [{"type": "bridge", "bridge": "al-podmantest",
  "isGateway": true, "ipMasq": false, "hairpinMode": false,
  "ipam": {"type": "host-local", "ranges": [[{"subnet": %q, "gateway": %q}]], "routes": []}}]}`, name, subnet, gw)
	if err := os.WriteFile(filepath.Join(netDir, name+".conflist"), []byte(conflist), 0o644); err != nil {
		t.Fatal(err)
	}
	// host-local keeps its leases here, by network name.
	t.Cleanup(func() { os.RemoveAll(filepath.Join("/var/lib/cni/networks", name)) })
	conf := podmanConf(t)
	f, err := os.OpenFile(conf, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = fmt.Fprintf(f, "\n[network]\nnetwork_backend = \"cni\"\nnetwork_config_dir = %q\n", netDir)
	if err := errors.Join(err, f.Close()); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CONTAINERS_CONF", conf)

	// The bridge and its address exist once the first container joins: listen after that.
	var h *hostListener
	listen := func() *hostListener {
		if err := inNetns(ns, func() error { h = listenOn(t, netip.AddrPortFrom(gw, 0).String()); return nil }); err != nil {
			t.Fatal(err)
		}
		h.in = func(fn func() error) error { return inNetns(ns, fn) }
		return h
	}
	testEgressOpenWith(t, EnginePodman, spec.Image{Tarball: rootfsTar}, name, subnet, gw, listen)

	b := newTestBackend(t, EnginePodman)
	b.opts.OpenNetwork = "airlock-absent-test"
	d := spec.Sandbox{ID: "open-nonet", Image: spec.Image{Tarball: rootfsTar}, Egress: spec.Egress{Mode: spec.EgressOpen}}
	d.ApplyDefaults()
	if _, err := b.Create(context.Background(), d); !errors.Is(err, sandbox.ErrUnsupported) || !strings.Contains(err.Error(), `network "airlock-absent-test"`) {
		t.Errorf("open on a network podman does not have: %v, want ErrUnsupported naming it", err)
	}
}

// inNetns runs fn on a locked thread inside ns; sockets fn makes stay in ns.
func inNetns(ns netns.NsHandle, fn func() error) error {
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
			errc <- errors.Join(ferr, err) // the thread stays locked and dies with the goroutine
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

func testEgressOpen(t *testing.T, engine string, img spec.Image, netName string, subnet netip.Prefix, gw netip.Addr) {
	t.Helper()
	h := listenOn(t, netip.AddrPortFrom(gw, 0).String())
	testEgressOpenWith(t, engine, img, netName, subnet, gw, func() *hostListener { return h })
}

// testEgressOpenWith is testEgressOpen with the listener made by listen once the open
// container runs.
func testEgressOpenWith(t *testing.T, engine string, img spec.Image, netName string, subnet netip.Prefix, gw netip.Addr, listen func() *hostListener) {
	t.Helper()
	b := newTestBackend(t, engine)
	b.opts.OpenNetwork = netName

	_, open := createAndConnect(t, b, spec.Sandbox{ID: "open", Image: img, Egress: spec.Egress{Mode: spec.EgressOpen}})
	h := listen()
	target := netip.MustParseAddrPort(h.ln.Addr().String())
	got := connectFrom(t, open, target)
	peers := h.seen()
	if len(peers) != 1 || !subnet.Contains(peers[0]) || peers[0] == gw {
		t.Fatalf("open: the listener at %s saw %v (the container said %q), want one connection from an address of %s", target, peers, got, subnet)
	}
	if got != "hello "+peers[0].String() {
		t.Errorf("open: the container read %q, want %q", got, "hello "+peers[0].String())
	}
	if out, _, _ := run(t, open, "cat /sys/class/net/eth0/operstate"); strings.TrimSpace(out) != "up" {
		t.Errorf("open: eth0 is %q", out)
	}

	_, deny := createAndConnect(t, b, spec.Sandbox{ID: "deny", Image: img})
	got = connectFrom(t, deny, target)
	if !strings.HasPrefix(got, "error") || !strings.Contains(got, "unreachable") {
		t.Errorf("deny: %q, want network unreachable", got)
	}
	if n := len(h.seen()); n != 1 {
		t.Errorf("deny: the listener saw %d connections in all, want only open's", n)
	}
	// A positive control for the refusal: the listener still answers (from its own namespace).
	in := h.in
	if in == nil {
		in = func(fn func() error) error { return fn() }
	}
	if err := in(func() error {
		c, err := net.DialTimeout("tcp", target.String(), 10*time.Second)
		if err == nil {
			c.Close()
		}
		return err
	}); err != nil {
		t.Fatalf("positive control: %v", err)
	}
}
