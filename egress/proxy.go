//go:build linux

package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/spec"
)

// Reason says why a connection or a query was refused; it is logged and stable.
type Reason string

const (
	ReasonDNSRefused       Reason = "dns query refused"                                // not IN class, empty name, or deny
	ReasonNameNotAllowed   Reason = "name not allowed by policy"                       //
	ReasonNonPublicAnswer  Reason = "name resolves to a non-public address"            // rebinding; answer stripped
	ReasonNoName           Reason = "no TLS server name or HTTP Host"                  // IP-literal TLS, HTTP/1.0 without Host
	ReasonNotTLSOrHTTP     Reason = "neither a TLS ClientHello nor an HTTP/1 request"  // other protocols, or nothing sent in time
	ReasonIPLiteral        Reason = "server name is an IP literal"                     //
	ReasonBadName          Reason = "server name is not a valid host name"             //
	ReasonAmbiguousHost    Reason = "request URI host and Host header differ"          //
	ReasonNonPublicDst     Reason = "destination is not a public address"              // private, metadata, other sandboxes
	ReasonHostAddr         Reason = "destination is an address of the host"            //
	ReasonSandboxLink      Reason = "destination is a sandbox link"                    // open: the pool (other sandboxes, gateways); loopback
	ReasonAddrMismatch     Reason = "destination is not an address of the server name" // SNI/Host disagrees with the IP dialled
	ReasonNoPublicAddr     Reason = "server name has no public address"                //
	ReasonResolveFailed    Reason = "server name could not be resolved"                //
	ReasonPolicyDeny       Reason = "egress denied"                                    //
	ReasonNoOriginalDst    Reason = "original destination unknown"                     //
	ReasonUnexpectedSource Reason = "connection not from the sandbox"                  //
	ReasonTooManyConns     Reason = "too many simultaneous connections"                // Options.MaxConns
	ReasonAmbiguousFraming Reason = "ambiguous request framing"                        // Transfer-Encoding with Content-Length, repeated Content-Length
	ReasonUpgrade          Reason = "protocol upgrade refused"                         // h2c, with a body, or after the first request
)

func (a *Attachment) refuse(proto, name string, dst netip.AddrPort, r Reason) {
	attrs := []any{"proto", proto, "reason", string(r)}
	if name != "" {
		attrs = append(attrs, "name", name)
	}
	if dst.IsValid() {
		attrs = append(attrs, "dst", dst.String())
	}
	a.log.Warn("egress refused", attrs...)
}

func (n *network) serveProxy() {
	for {
		c, ok := n.accept(n.proxyLn)
		if !ok {
			return
		}
		if n.active.Add(1) > int64(n.a.g.opts.MaxConns) {
			n.active.Add(-1)
			n.a.ctr.connsDenied.Add(1)
			n.a.refuse("tcp", "", netip.AddrPort{}, ReasonTooManyConns)
			n.untrack(c)
			resetClose(c.(*net.TCPConn))
			continue
		}
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			defer n.active.Add(-1)
			defer n.untrack(c)
			defer c.Close()
			n.handle(c.(*net.TCPConn))
		}()
	}
}

// resetClose makes Close send RST, so a refused client sees "connection reset" at once.
func resetClose(c *net.TCPConn) {
	c.SetLinger(0)
	c.Close()
}

func (n *network) handle(c *net.TCPConn) {
	a := n.a
	src, _ := netip.ParseAddrPort(c.RemoteAddr().String())
	if !a.inPlace && src.Addr().Unmap() != n.sb {
		a.ctr.connsDenied.Add(1)
		a.refuse("tcp", "", netip.AddrPort{}, ReasonUnexpectedSource)
		resetClose(c)
		return
	}
	dst, err := originalDst(c)
	if err != nil {
		a.ctr.connsDenied.Add(1)
		a.refuse("tcp", "", netip.AddrPort{}, ReasonNoOriginalDst)
		resetClose(c)
		return
	}
	pol := a.pol.Load()
	var name string
	var head []byte
	reason := Reason("")
	switch pol.Mode {
	case spec.EgressAllowDomains:
		name, head, reason = peekName(c, a.g.opts.PeekLimit, time.Now().Add(a.g.opts.PeekTimeout))
	case spec.EgressAllow, spec.EgressOpen:
	default:
		reason = ReasonPolicyDeny
	}
	if reason == "" {
		reason = a.decide(n.ctx, pol, name, dst)
	}
	if reason != "" {
		a.ctr.connsDenied.Add(1)
		a.refuse("tcp", name, dst, reason)
		resetClose(c)
		return
	}
	a.ctr.connsAllowed.Add(1)

	dctx, cancel := context.WithTimeout(n.ctx, a.g.opts.DialTimeout)
	uc, err := a.g.host.dial(dctx, &net.Dialer{}, "tcp", dst.String())
	cancel()
	if err != nil {
		a.ctr.dialFailures.Add(1)
		a.log.Info("egress: destination unreachable", "name", name, "dst", dst.String(), "err", err)
		resetClose(c)
		return
	}
	up := uc.(*net.TCPConn)
	if !n.track(up) {
		up.Close()
		return
	}
	defer n.untrack(up)
	defer up.Close()
	if pol.Mode == spec.EgressAllowDomains && len(head) > 0 && head[0] != 0x16 {
		// Plaintext HTTP: every request is judged, not only the one peeked.
		n.forwardHTTP(c, up, pol, dst, head)
		return
	}
	if len(head) > 0 {
		k, err := up.Write(head)
		a.ctr.bytesSent.Add(uint64(k))
		if err != nil {
			return
		}
	}
	splice(c, up, &a.ctr)
}

// forwardHTTP relays a plaintext HTTP/1 connection under allowDomains request by request.
// Each request head is parsed and judged like the first (name, then decide against the
// policy the connection was opened under) before any byte of it goes upstream, so a
// keep-alive or pipelined request cannot switch to another virtual host of the same
// address. Bodies are framed by net/http and relayed as the client sent them, so the
// next head is found where the server will find it; framing two parsers could read
// differently is refused (requestName). A protocol switch (Upgrade, CONNECT) is allowed
// only on the first request: its response is read here, and after a 101 (or a CONNECT's
// 2xx) the bytes are relayed unparsed. first is what peekName consumed, which may already
// hold more than the first head.
func (n *network) forwardHTTP(c, up *net.TCPConn, pol *Policy, dst netip.AddrPort, first []byte) {
	a := n.a
	fr := bytes.NewReader(first)
	t := &tap{r: io.MultiReader(fr, c)}
	br := bufio.NewReader(t)
	send := func(b []byte) bool {
		k, err := up.Write(b)
		a.ctr.bytesSent.Add(uint64(k))
		return err == nil
	}
	flush := func() bool { return t.relay(len(t.pending)-br.Buffered(), send) }

	var respWG sync.WaitGroup
	defer respWG.Wait()
	startResponses := func() {
		respWG.Add(1)
		go func() {
			defer respWG.Done()
			if err := copyCounting(c, up, &a.ctr.bytesReceived); err != nil {
				up.Close()
				c.Close()
				return
			}
			c.CloseWrite()
		}()
	}
	refuse := func(name string, r Reason) {
		a.ctr.connsDenied.Add(1)
		a.refuse("tcp", name, dst, r)
		resetClose(c)
		up.Close()
	}

	buf := make([]byte, 32<<10)
	for i := 0; ; i++ {
		t.limit = br.Buffered() + a.g.opts.PeekLimit
		req, err := http.ReadRequest(br)
		t.limit = 0
		if err != nil {
			switch {
			case errors.Is(err, io.EOF) && len(t.pending) == 0: // the client is done
				up.CloseWrite()
			case broken(err): // nothing to judge
				up.Close()
				c.Close()
			default:
				refuse("", ReasonNotTLSOrHTTP)
			}
			return
		}
		head := t.pending[:len(t.pending)-br.Buffered()]
		name, reason := requestName(req, head)
		switch {
		case reason != "":
		case switchesProtocol(req) && (i > 0 || req.ContentLength != 0):
			// Only the first request's answer is read here; one with a body would need
			// answers relayed before the body is (Expect: 100-continue).
			reason = ReasonUpgrade
		case i > 0:
			reason = a.decide(n.ctx, pol, name, dst)
		}
		if reason != "" {
			refuse(name, reason)
			return
		}
		if !flush() {
			up.Close()
			return
		}
		if i == 0 && !switchesProtocol(req) {
			startResponses() // before the body: an Expect: 100-continue client waits for an answer
		}
		for {
			k, err := req.Body.Read(buf)
			if k > 0 && !flush() {
				up.Close()
				return
			}
			if errors.Is(err, io.EOF) {
				break
			}
			if broken(err) {
				up.Close()
				c.Close()
				return
			}
			if err != nil {
				// A body that is not what its framing says: the server would disagree
				// with us about where the next request starts.
				refuse(name, ReasonNotTLSOrHTTP)
				return
			}
		}
		if !flush() { // a chunked body's trailer
			up.Close()
			return
		}
		if i == 0 && switchesProtocol(req) {
			switched, ok := n.relaySwitchResponse(c, up, req)
			if !ok {
				return
			}
			if switched {
				// What bufio held was read before what is left of first, then the socket.
				if !t.relay(len(t.pending), send) || !send(first[len(first)-fr.Len():]) {
					up.Close()
					return
				}
				splice(c, up, &a.ctr)
				return
			}
			startResponses()
		}
	}
}

// broken reports whether err is the connection failing rather than what was sent on it.
func broken(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, net.ErrClosed) || errors.Is(err, io.ErrUnexpectedEOF)
}

// switchesProtocol reports whether the server may stop speaking HTTP/1 after answering req.
func switchesProtocol(req *http.Request) bool {
	return req.Method == http.MethodConnect || len(req.Header["Upgrade"]) > 0
}

// relaySwitchResponse reads the answer to a request that may switch protocols (the first
// on its connection, so its answer is the first on the wire), relays every byte read to the
// client, and reports whether the protocol switched.
func (n *network) relaySwitchResponse(c, up *net.TCPConn, req *http.Request) (switched, ok bool) {
	ut := &tap{r: up}
	ubr := bufio.NewReader(ut)
	for {
		ut.limit = len(ut.pending) + n.a.g.opts.PeekLimit
		resp, err := http.ReadResponse(ubr, req) // its Body is never read: the rest is relayed raw
		if err != nil {
			up.Close()
			c.Close()
			return false, false
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			switched = true
			break
		}
		if resp.StatusCode >= 200 || resp.StatusCode < 100 {
			switched = req.Method == http.MethodConnect && resp.StatusCode < 300
			break
		}
	}
	if !ut.relay(len(ut.pending), func(b []byte) bool {
		k, err := c.Write(b)
		n.a.ctr.bytesReceived.Add(uint64(k))
		return err == nil
	}) {
		up.Close()
		c.Close()
		return false, false
	}
	return switched, true
}

// tap records what a parser reads, so that exactly those bytes are relayed.
type tap struct {
	r       io.Reader
	pending []byte // read and not yet relayed
	limit   int    // > 0: hold at most this many bytes (bounds a head)
}

func (t *tap) Read(p []byte) (int, error) {
	if t.limit > 0 {
		room := t.limit - len(t.pending)
		if room <= 0 {
			return 0, errPeekLimit
		}
		if len(p) > room {
			p = p[:room]
		}
	}
	k, err := t.r.Read(p)
	t.pending = append(t.pending, p[:k]...)
	return k, err
}

// relay hands the first k pending bytes to send and drops them.
func (t *tap) relay(k int, send func([]byte) bool) bool {
	if k == 0 {
		return true
	}
	ok := send(t.pending[:k])
	t.pending = t.pending[:copy(t.pending, t.pending[k:])]
	return ok
}

// decide applies the policy to a connection to dst that names name (allowDomains) and returns
// "" to allow it. Each check is separate so that each has its own refusal reason.
func (a *Attachment) decide(ctx context.Context, pol *Policy, name string, dst netip.AddrPort) Reason {
	ip := dst.Addr().Unmap()
	if pol.Mode == spec.EgressOpen {
		// Anything the host can reach, private, link-local and the host's own addresses
		// included, but not airlock's own plumbing: the pool's links are other sandboxes and
		// their gateways (whose resolver and proxy serve only their own sandbox), and a
		// loopback or unspecified address here could only mean the host's, which the
		// sandbox cannot name (its 127.0.0.1 is its own).
		if a.g.opts.Pool.Contains(ip) || ip.IsLoopback() || ip.IsUnspecified() {
			return ReasonSandboxLink
		}
		return ""
	}
	if !a.g.cls.public(ip) {
		return ReasonNonPublicDst
	}
	if a.g.isHostAddr(ip) {
		return ReasonHostAddr
	}
	if pol.Mode == spec.EgressAllow {
		return ""
	}
	if pol.Mode != spec.EgressAllowDomains {
		return ReasonPolicyDeny
	}
	if !pol.allows(name) {
		return ReasonNameNotAllowed
	}
	now := time.Now()
	if a.answers.has(name, ip, now) {
		return ""
	}
	public, sawNonPublic, ttl, err := a.g.lookup(ctx, name, ip.Is6())
	if err != nil {
		return ReasonResolveFailed
	}
	if len(public) == 0 {
		if sawNonPublic {
			return ReasonNonPublicAnswer
		}
		return ReasonNoPublicAddr
	}
	a.answers.remember(name, public, time.Duration(ttl)*time.Second, now)
	for _, p := range public {
		if p == ip {
			return ""
		}
	}
	return ReasonAddrMismatch
}

// isHostAddr reports whether ip is configured on any link of the host namespace, read fresh
// for each connection because the host's addresses change (DHCP, new links); any error
// counts as "yes" so that an unknown answer refuses.
func (g *Gateway) isHostAddr(ip netip.Addr) bool {
	addrs, err := g.hostNL.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return true
	}
	for _, a := range addrs {
		if x, ok := netip.AddrFromSlice(a.IP); ok && x.Unmap() == ip {
			return true
		}
	}
	return false
}

// splice copies both ways until both directions end, counting bytes as they pass (in 1 MiB
// steps, so long transfers show up before they finish while the kernel still splices).
func splice(client, up *net.TCPConn, ctr *counters) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := copyCounting(up, client, &ctr.bytesSent)
		if err != nil {
			up.Close()
			client.Close()
			return
		}
		up.CloseWrite()
	}()
	err := copyCounting(client, up, &ctr.bytesReceived)
	if err != nil {
		up.Close()
		client.Close()
	} else {
		client.CloseWrite()
	}
	wg.Wait()
}

func copyCounting(dst, src *net.TCPConn, ctr interface{ Add(uint64) uint64 }) error {
	for {
		k, err := io.CopyN(dst, src, 1<<20)
		ctr.Add(uint64(k))
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// peekName reads the start of a client's stream, up to limit bytes and until deadline, and
// returns the TLS SNI or HTTP/1 Host it carries and every byte consumed (to be replayed to
// the destination). crypto/tls and net/http do the parsing.
func peekName(c net.Conn, limit int, deadline time.Time) (name string, consumed []byte, r Reason) {
	c.SetReadDeadline(deadline)
	defer c.SetReadDeadline(time.Time{})
	rc := &recordingConn{Conn: c, limit: limit}
	var first [1]byte
	if _, err := io.ReadFull(rc, first[:]); err != nil {
		return "", nil, ReasonNotTLSOrHTTP
	}
	rc.replay = first[:]
	var host string
	if first[0] == 0x16 { // TLS handshake record
		var hello *tls.ClientHelloInfo
		errStop := errors.New("client hello captured")
		cfg := &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			hello = h
			return nil, errStop
		}}
		_ = tls.Server(rc, cfg).Handshake() // always fails: we stop it, or the hello is bad
		if hello == nil {
			return "", rc.buf, ReasonNotTLSOrHTTP
		}
		host = hello.ServerName
	} else {
		if first[0] < 'A' || first[0] > 'Z' {
			// Not an HTTP method; refuse now rather than wait for a line that never comes.
			return "", rc.buf, ReasonNotTLSOrHTTP
		}
		req, err := http.ReadRequest(bufio.NewReader(rc))
		if err != nil {
			return "", rc.buf, ReasonNotTLSOrHTTP
		}
		name, r := requestName(req, rc.buf)
		return name, rc.buf, r
	}
	name, r = hostName(host)
	return name, rc.buf, r
}

// requestName returns the host an HTTP/1 request names (absolute-form target or Host), and
// refuses what two parsers could read differently: a target and a Host that disagree, and
// framing other than one Content-Length or chunked alone. It refuses an h2c upgrade too,
// after which every HTTP/2 stream names its own authority. head is the raw request head.
func requestName(req *http.Request, head []byte) (string, Reason) {
	h := rawHeader(head)
	if hh := h.Get("Host"); req.URL != nil && req.URL.Host != "" && hh != "" && !strings.EqualFold(hh, req.URL.Host) {
		// Absolute-form target: servers should use it and ignore Host, but some do not.
		return "", ReasonAmbiguousHost
	}
	host := req.Host
	if hp, _, err := net.SplitHostPort(host); err == nil {
		host = hp
	}
	name, r := hostName(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"))
	if r != "" {
		return name, r
	}
	if cl := len(h["Content-Length"]); cl > 1 || cl > 0 && len(h["Transfer-Encoding"]) > 0 {
		return name, ReasonAmbiguousFraming
	}
	for _, v := range req.Header["Upgrade"] {
		for tok := range strings.SplitSeq(v, ",") {
			if p, _, _ := strings.Cut(strings.TrimSpace(tok), "/"); strings.EqualFold(p, "h2c") {
				return name, ReasonUpgrade
			}
		}
	}
	return name, ""
}

// hostName checks a TLS server name or an HTTP host without its port.
func hostName(host string) (string, Reason) {
	if host == "" {
		return "", ReasonNoName
	}
	if i := strings.IndexByte(host, '%'); i >= 0 { // zone of a literal
		host = host[:i]
	}
	if _, err := netip.ParseAddr(strings.TrimSuffix(host, ".")); err == nil {
		return host, ReasonIPLiteral
	}
	if name := normalizeName(host); name != "" {
		return name, ""
	}
	return "", ReasonBadName
}

// rawHeader returns the header fields of the request head in b as sent (http.ReadRequest
// hides Host when the request line carries an absolute URI, and a Content-Length beside
// chunked); nil when unreadable.
func rawHeader(b []byte) textproto.MIMEHeader {
	tp := textproto.NewReader(bufio.NewReader(bytes.NewReader(b)))
	if _, err := tp.ReadLine(); err != nil {
		return nil
	}
	h, _ := tp.ReadMIMEHeader()
	return h
}

// recordingConn keeps a copy of what is read (bounded by limit) and refuses every write, so
// the parsers can neither answer the client nor read past the bound.
type recordingConn struct {
	net.Conn
	limit  int
	buf    []byte
	replay []byte // bytes already recorded, to be read again first
}

var errPeekLimit = errors.New("egress: peek limit reached")

func (r *recordingConn) Read(p []byte) (int, error) {
	if len(r.replay) > 0 {
		k := copy(p, r.replay)
		r.replay = r.replay[k:]
		return k, nil
	}
	room := r.limit - len(r.buf)
	if room <= 0 {
		return 0, errPeekLimit
	}
	if len(p) > room {
		p = p[:room]
	}
	k, err := r.Conn.Read(p)
	r.buf = append(r.buf, p[:k]...)
	return k, err
}

func (r *recordingConn) Write(p []byte) (int, error) {
	return 0, errors.New("egress: peek is read-only")
}

// originalDst returns where the sandbox meant to connect before the redirect.
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var out netip.AddrPort
	var serr error
	err = raw.Control(func(fd uintptr) {
		if la, ok := c.LocalAddr().(*net.TCPAddr); ok && la.IP.To4() == nil {
			// IP6T_SO_ORIGINAL_DST has the same value at SOL_IPV6; sockaddr_in6 fits the MTU-info buffer.
			mi, e := unix.GetsockoptIPv6MTUInfo(int(fd), unix.SOL_IPV6, unix.SO_ORIGINAL_DST)
			if e != nil {
				serr = e
				return
			}
			port := mi.Addr.Port
			port = port>>8 | port<<8 // network byte order
			out = netip.AddrPortFrom(netip.AddrFrom16(mi.Addr.Addr), port)
			return
		}
		// sockaddr_in in the first 8 bytes of the 16-byte mreq buffer: family, port (BE), addr.
		m, e := unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
		if e != nil {
			serr = e
			return
		}
		b := m.Multiaddr
		out = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), uint16(b[2])<<8|uint16(b[3]))
	})
	if err != nil {
		return netip.AddrPort{}, err
	}
	return out, serr
}
