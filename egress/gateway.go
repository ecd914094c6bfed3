//go:build linux

package egress

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// DefaultPool is where sandbox links are numbered from when Options.Pool is unset: one /30
// per sandbox, the gateway (host end) on the first usable address, the sandbox on the second.
var DefaultPool = netip.MustParsePrefix("10.200.0.0/16")

// Options configure a Gateway. The zero value plus Upstream is a production configuration.
type Options struct {
	// HostNetns is the namespace that holds the host end of every sandbox link, the nftables
	// rules, the resolver and the proxy, and from which the proxy dials out (its routes are the
	// uplink). nil means the namespace of the thread calling NewGateway. Tests pass a namespace
	// they created so that the real host network is never touched. The handle is duplicated.
	HostNetns *netns.NsHandle
	// Pool is the private IPv4 prefix sandbox links are numbered from (default DefaultPool).
	Pool netip.Prefix
	// Upstream are the DNS servers the resolver and the proxy ask, tried in order. Required
	// for any mode but deny; they are dialled from HostNetns and may be loopback there.
	Upstream []netip.AddrPort
	// ExtraPublic declares documentation prefixes (TEST-NET, 2001:db8::/32) public; for tests
	// that build a fake internet. Any other prefix is refused.
	ExtraPublic []netip.Prefix
	// Logger receives one record per refusal (default slog.Default()).
	Logger *slog.Logger
	// SandboxInterface names the link inside the sandbox (default "eth0").
	SandboxInterface string
	// PeekTimeout bounds how long the proxy waits for a TLS ClientHello or HTTP request
	// head under allowDomains (default 10s); PeekLimit bounds its size (default 64 KiB).
	PeekTimeout time.Duration
	PeekLimit   int
	// DialTimeout bounds the proxy's connect to a destination (default 10s).
	DialTimeout time.Duration
	// DNSTimeout bounds one upstream DNS exchange (default 5s).
	DNSTimeout time.Duration
	// MaxConns bounds one sandbox's simultaneous proxied connections (default 1024), so
	// that a sandbox cannot spend the host's file descriptors.
	MaxConns int
}

// Gateway attaches sandboxes to the network of one host namespace and numbers their links.
type Gateway struct {
	opts   Options
	hostNS netns.NsHandle  // always an open handle, closed by Close
	hostNL *netlink.Handle // netlink in hostNS, kept for the per-connection address check
	host   nsRunner        // switches threads only when HostNetns was given
	cls    classifier
	log    *slog.Logger

	mu       sync.Mutex
	blocks   map[netip.Prefix]string // /30 → sandbox id, for links being built or live
	attached map[string]*Attachment
	closed   bool
}

// NewGateway validates opts and returns a Gateway; it changes nothing on the host.
func NewGateway(opts Options) (*Gateway, error) {
	if !opts.Pool.IsValid() {
		opts.Pool = DefaultPool
	}
	opts.Pool = opts.Pool.Masked()
	if !opts.Pool.Addr().Is4() || opts.Pool.Bits() > 30 || IsPublic(opts.Pool.Addr()) || !privatePool(opts.Pool) {
		return nil, fmt.Errorf("%w: Options.Pool %s: must be an IPv4 prefix of /30 or wider inside 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16 or 100.64.0.0/10", sandbox.ErrInvalid, opts.Pool)
	}
	for i, u := range opts.Upstream {
		if !u.IsValid() || u.Port() == 0 {
			return nil, fmt.Errorf("%w: Options.Upstream[%d] %s: must be an address with a port", sandbox.ErrInvalid, i, u)
		}
	}
	if err := checkExtraPublic(opts.ExtraPublic); err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.SandboxInterface == "" {
		opts.SandboxInterface = "eth0"
	}
	if len(opts.SandboxInterface) > 15 {
		return nil, fmt.Errorf("%w: Options.SandboxInterface %q: at most 15 characters", sandbox.ErrInvalid, opts.SandboxInterface)
	}
	if opts.PeekTimeout <= 0 {
		opts.PeekTimeout = 10 * time.Second
	}
	if opts.PeekLimit <= 0 {
		opts.PeekLimit = 64 << 10
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 10 * time.Second
	}
	if opts.DNSTimeout <= 0 {
		opts.DNSTimeout = 5 * time.Second
	}
	if opts.MaxConns <= 0 {
		opts.MaxConns = 1024
	}
	g := &Gateway{
		opts:     opts,
		cls:      classifier{extra: append([]netip.Prefix(nil), opts.ExtraPublic...)},
		log:      opts.Logger,
		blocks:   map[netip.Prefix]string{},
		attached: map[string]*Attachment{},
		host:     nsRunner{ns: -1},
	}
	var err error
	if opts.HostNetns != nil {
		g.hostNS, err = dupNS(*opts.HostNetns)
		g.host = nsRunner{ns: g.hostNS}
	} else {
		g.hostNS, err = netns.Get()
	}
	if err != nil {
		return nil, fmt.Errorf("egress: host netns: %w", err)
	}
	if g.hostNL, err = g.hostHandle(); err != nil {
		g.hostNS.Close()
		return nil, fmt.Errorf("egress: netlink in host netns: %w", err)
	}
	return g, nil
}

// hostHandle opens netlink in the host namespace; in our own namespace without a setns,
// which would need CAP_SYS_ADMIN even to "switch" to where we already are.
func (g *Gateway) hostHandle() (*netlink.Handle, error) {
	if g.opts.HostNetns == nil {
		return netlink.NewHandle()
	}
	return netlink.NewHandleAt(g.hostNS)
}

func privatePool(p netip.Prefix) bool {
	for _, s := range []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"} {
		q := netip.MustParsePrefix(s)
		if q.Contains(p.Addr()) && p.Bits() >= q.Bits() {
			return true
		}
	}
	return false
}

func dupNS(h netns.NsHandle) (netns.NsHandle, error) {
	if !h.IsOpen() {
		return netns.None(), fmt.Errorf("%w: netns handle %d is not open", sandbox.ErrInvalid, int(h))
	}
	fd, err := unix.FcntlInt(uintptr(h), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return netns.None(), fmt.Errorf("dup netns handle: %w", err)
	}
	return netns.NsHandle(fd), nil
}

// Close releases the Gateway's own handle. Attachments must be closed first; it refuses otherwise.
func (g *Gateway) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	if n := len(g.attached); n > 0 {
		return fmt.Errorf("%w: egress gateway still has %d attachment(s); close them first", sandbox.ErrConflict, n)
	}
	g.closed = true
	g.hostNL.Close()
	return g.hostNS.Close()
}

// hostIfName is the host end of a sandbox's link: "al" and 12 hex digits of the id's hash,
// because an interface name has at most 15 characters and a sandbox id up to 64.
func hostIfName(id string) string {
	sum := sha256.Sum256([]byte(id))
	return "al" + hex.EncodeToString(sum[:6])
}

func tableName(id string) string { return "airlock_" + id }

// Setup attaches the sandbox whose network namespace is sandboxNetns (the handle is
// duplicated) and enforces p. Under deny nothing is created but the loopback link is brought
// up; otherwise a veth pair, addresses, a default route, an nftables table, the resolver and
// the proxy. On error everything made so far is removed.
func (g *Gateway) Setup(ctx context.Context, sandboxID string, sandboxNetns netns.NsHandle, p Policy) (*Attachment, error) {
	if !spec.IsValidID(sandboxID) {
		return nil, fmt.Errorf("%w: sandbox id %q: 1 to 64 of [A-Za-z0-9_-]", sandbox.ErrInvalid, sandboxID)
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if p.Mode != spec.EgressDeny && len(g.opts.Upstream) == 0 {
		return nil, fmt.Errorf("%w: egress mode %q needs Options.Upstream (the DNS servers to forward to)", sandbox.ErrInvalid, p.Mode)
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil, fmt.Errorf("%w: egress gateway is closed", sandbox.ErrInvalid)
	}
	if _, dup := g.attached[sandboxID]; dup {
		g.mu.Unlock()
		return nil, fmt.Errorf("%w: sandbox %q is already attached", sandbox.ErrConflict, sandboxID)
	}
	a := &Attachment{g: g, id: sandboxID, log: g.log.With("sandbox", sandboxID), answers: newAnswerMemory()}
	g.attached[sandboxID] = a // reserve the id while building
	g.mu.Unlock()

	fail := func(err error) (*Attachment, error) {
		g.mu.Lock()
		delete(g.attached, sandboxID)
		g.mu.Unlock()
		if a.sbNS.IsOpen() {
			a.sbNS.Close()
		}
		return nil, err
	}
	var err error
	if a.sbNS, err = dupNS(sandboxNetns); err != nil {
		return fail(err)
	}
	pc := p.clone()
	a.pol.Store(&pc)
	if err := a.loopbackUp(); err != nil {
		return fail(err)
	}
	if p.Mode != spec.EgressDeny {
		n, err := g.buildNetwork(ctx, a)
		if err != nil {
			return fail(err)
		}
		a.net = n
	}
	return a, nil
}

// Cleanup removes what a crashed process may have left for sandboxID (the host link, which
// takes its peer along, and the nftables table). It refuses while the id is attached here.
func (g *Gateway) Cleanup(ctx context.Context, sandboxID string) error {
	if !spec.IsValidID(sandboxID) {
		return fmt.Errorf("%w: sandbox id %q: 1 to 64 of [A-Za-z0-9_-]", sandbox.ErrInvalid, sandboxID)
	}
	g.mu.Lock()
	_, live := g.attached[sandboxID]
	g.mu.Unlock()
	if live {
		return fmt.Errorf("%w: sandbox %q is attached; close its attachment instead", sandbox.ErrConflict, sandboxID)
	}
	return errors.Join(g.deleteTable(tableName(sandboxID)), g.deleteLink(hostIfName(sandboxID)))
}

func (p Policy) clone() Policy {
	return Policy{Mode: p.Mode, Domains: append([]string(nil), p.Domains...)}
}

// Attachment is one sandbox's live egress enforcement.
type Attachment struct {
	g       *Gateway
	id      string
	sbNS    netns.NsHandle
	log     *slog.Logger
	pol     atomic.Pointer[Policy]
	answers *answerMemory
	ctr     counters

	mu     sync.Mutex // serialises SetPolicy and Close; guards net and closed
	net    *network
	closed bool

	// inPlace: the sandbox shares the gateway's namespace (ServeInPlace); no link, no table.
	inPlace bool
}

// SandboxAddr is the sandbox's address on its link, invalid under deny.
func (a *Attachment) SandboxAddr() netip.Addr {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.net == nil {
		return netip.Addr{}
	}
	return a.net.sb
}

// Resolver is the address the sandbox must use as its only DNS server (its gateway),
// invalid under deny.
func (a *Attachment) Resolver() netip.Addr {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.net == nil {
		return netip.Addr{}
	}
	return a.net.gw
}

// ResolvConf is the /etc/resolv.conf the sandbox should see: our resolver only, or no
// server at all under deny. It changes when SetPolicy moves between deny and another mode.
func (a *Attachment) ResolvConf() []byte {
	r := a.Resolver()
	if !r.IsValid() {
		return []byte("# airlock: egress denied, no DNS\n")
	}
	return []byte("nameserver " + r.String() + "\noptions edns0\n")
}

// Policy returns the policy in force.
func (a *Attachment) Policy() Policy { return a.pol.Load().clone() }

// SetPolicy changes the policy of a live sandbox; it applies to new connections and DNS
// queries. Between allow and allowDomains (or another domain list) only the proxy's and
// resolver's view changes. Moving to deny removes the link, cutting existing connections;
// moving from deny builds it (write ResolvConf into the sandbox afterwards).
func (a *Attachment) SetPolicy(ctx context.Context, p Policy) error {
	if err := p.Validate(); err != nil {
		return err
	}
	if p.Mode != spec.EgressDeny && len(a.g.opts.Upstream) == 0 {
		return fmt.Errorf("%w: egress mode %q needs Options.Upstream (the DNS servers to forward to)", sandbox.ErrInvalid, p.Mode)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return fmt.Errorf("%w: egress attachment for sandbox %q is closed", sandbox.ErrInvalid, a.id)
	}
	if a.inPlace && p.Mode == spec.EgressDeny {
		// Its traffic reaches the proxy by the namespace's own rules, not a link to remove.
		return fmt.Errorf("%w: in-place egress cannot move to deny while it runs", sandbox.ErrUnsupported)
	}
	pc := p.clone()
	switch {
	case p.Mode == spec.EgressDeny && a.net != nil:
		a.pol.Store(&pc) // refuse new work before the link goes
		err := a.net.teardown()
		a.net = nil
		return err
	case p.Mode != spec.EgressDeny && a.net == nil:
		n, err := a.g.buildNetwork(ctx, a)
		if err != nil {
			return err
		}
		a.net = n
	}
	a.pol.Store(&pc)
	return nil
}

// Close removes every link, address, route, rule, table and listener the attachment made
// and ends its proxied connections. It is safe to call twice.
func (a *Attachment) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil
	}
	a.closed = true
	var err error
	if a.net != nil {
		err = a.net.teardown()
		a.net = nil
	}
	a.g.mu.Lock()
	delete(a.g.attached, a.id)
	a.g.mu.Unlock()
	if a.sbNS.IsOpen() {
		err = errors.Join(err, a.sbNS.Close())
	}
	return err
}

func (a *Attachment) loopbackUp() error {
	h, err := netlink.NewHandleAt(a.sbNS)
	if err != nil {
		return fmt.Errorf("egress: netlink in sandbox netns: %w", err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("egress: sandbox loopback: %w", err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("egress: sandbox loopback up: %w", err)
	}
	return nil
}

// Counters are one sandbox's egress totals since Setup.
type Counters struct {
	ConnsAllowed  uint64 // TCP connections the policy allowed
	ConnsDenied   uint64 // TCP connections refused by the policy, and later requests refused on an allowed plaintext HTTP one
	DialFailures  uint64 // allowed connections whose destination could not be reached
	BytesSent     uint64 // sandbox → destination on allowed connections
	BytesReceived uint64 // destination → sandbox on allowed connections
	DNSAllowed    uint64 // queries answered from upstream
	DNSDenied     uint64 // queries refused (not allowed) or stripped of non-public answers
	// PacketsDropped counts packets the kernel rules dropped: UDP other than DNS to our
	// resolver, anything the host would otherwise forward, any other protocol.
	PacketsDropped uint64
}

type counters struct {
	connsAllowed, connsDenied, dialFailures atomic.Uint64
	bytesSent, bytesReceived                atomic.Uint64
	dnsAllowed, dnsDenied                   atomic.Uint64
	droppedBase                             atomic.Uint64 // drops of links already torn down
}

// Counters returns the current totals.
func (a *Attachment) Counters() Counters {
	c := Counters{
		ConnsAllowed:  a.ctr.connsAllowed.Load(),
		ConnsDenied:   a.ctr.connsDenied.Load(),
		DialFailures:  a.ctr.dialFailures.Load(),
		BytesSent:     a.ctr.bytesSent.Load(),
		BytesReceived: a.ctr.bytesReceived.Load(),
		DNSAllowed:    a.ctr.dnsAllowed.Load(),
		DNSDenied:     a.ctr.dnsDenied.Load(),
	}
	a.mu.Lock() // so a teardown cannot move the kernel count into droppedBase meanwhile
	defer a.mu.Unlock()
	c.PacketsDropped = a.ctr.droppedBase.Load()
	if a.net != nil && !a.inPlace {
		if d, err := a.g.readDropped(tableName(a.id)); err == nil {
			c.PacketsDropped += d
		}
	}
	return c
}
