//go:build linux

package egress

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/airlock-sandbox/airlock/spec"
)

// The resolver the sandbox sees: it answers only names the policy allows (NXDOMAIN for the
// rest, so clients fail fast), forwards them to Options.Upstream, strips every non-public
// A/AAAA record (DNS rebinding) and all additional records, and remembers what it handed
// out so the proxy can accept connections to exactly those addresses.

const (
	maxDNSInFlight = 64               // concurrent UDP queries per sandbox
	dnsTCPIdle     = 10 * time.Second // idle time before a DNS-over-TCP connection is closed
	minMemory      = 5 * time.Minute  // clients cache answers beyond the TTL; so do we
	maxMemoryNames = 4096
)

// upstreamExchange sends q (one question) to each upstream in turn and returns the first
// well-formed answer. Sockets are made in the host namespace.
func (g *Gateway) upstreamExchange(ctx context.Context, q dnsmessage.Question) (*dnsmessage.Message, error) {
	var errs []error
	for _, up := range g.opts.Upstream {
		m, err := g.exchangeOne(ctx, up, q, false)
		if err == nil && m.Truncated {
			m, err = g.exchangeOne(ctx, up, q, true)
		}
		if err == nil {
			return m, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", up, err))
	}
	return nil, fmt.Errorf("egress: upstream DNS: %w", errors.Join(errs...))
}

func (g *Gateway) exchangeOne(ctx context.Context, up netip.AddrPort, q dnsmessage.Question, useTCP bool) (*dnsmessage.Message, error) {
	ctx, cancel := context.WithTimeout(ctx, g.opts.DNSTimeout)
	defer cancel()
	var idb [2]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return nil, err
	}
	id := binary.BigEndian.Uint16(idb[:])
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(q); err != nil {
		return nil, err
	}
	if err := b.StartAdditionals(); err != nil {
		return nil, err
	}
	var opt dnsmessage.ResourceHeader
	if err := opt.SetEDNS0(1232, dnsmessage.RCodeSuccess, false); err != nil {
		return nil, err
	}
	if err := b.OPTResource(opt, dnsmessage.OPTResource{}); err != nil {
		return nil, err
	}
	msg, err := b.Finish()
	if err != nil {
		return nil, err
	}
	network := "udp"
	if useTCP {
		network = "tcp"
	}
	c, err := g.host.dial(ctx, &net.Dialer{}, network, up.String())
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()

	var resp []byte
	if useTCP {
		if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(msg))), msg...)); err != nil {
			return nil, err
		}
		resp, err = readTCPMsg(c)
		if err != nil {
			return nil, err
		}
	} else {
		if _, err := c.Write(msg); err != nil {
			return nil, err
		}
		buf := make([]byte, 65535)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return nil, err
			}
			if n >= 2 && binary.BigEndian.Uint16(buf[:2]) == id {
				resp = buf[:n]
				break
			}
			// a stray datagram with another id: keep waiting for ours
		}
	}
	var m dnsmessage.Message
	if err := m.Unpack(resp); err != nil {
		return nil, fmt.Errorf("malformed answer: %w", err)
	}
	if m.ID != id || !m.Response || len(m.Questions) != 1 || !sameQuestion(m.Questions[0], q) {
		return nil, fmt.Errorf("answer does not match the question")
	}
	return &m, nil
}

func sameQuestion(a, b dnsmessage.Question) bool {
	return a.Type == b.Type && a.Class == b.Class && normalizeName(a.Name.String()) == normalizeName(b.Name.String())
}

func readTCPMsg(r io.Reader) ([]byte, error) {
	var l [2]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return nil, err
	}
	b := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	return b, nil
}

// chainAddrs returns the A/AAAA addresses that answer qname in m, following CNAMEs, split
// into public ones and whether any non-public one was present, plus the smallest TTL seen.
func chainAddrs(m *dnsmessage.Message, qname string, pub func(netip.Addr) bool) (public []netip.Addr, sawNonPublic bool, ttl uint32) {
	names := map[string]bool{qname: true}
	ttl = ^uint32(0)
	for changed := true; changed; {
		changed = false
		for _, rr := range m.Answers {
			if c, ok := rr.Body.(*dnsmessage.CNAMEResource); ok && names[normalizeName(rr.Header.Name.String())] {
				t := normalizeName(c.CNAME.String())
				if t != "" && !names[t] {
					names[t] = true
					changed = true
				}
			}
		}
	}
	for _, rr := range m.Answers {
		if !names[normalizeName(rr.Header.Name.String())] {
			continue
		}
		var a netip.Addr
		switch b := rr.Body.(type) {
		case *dnsmessage.AResource:
			a = netip.AddrFrom4(b.A)
		case *dnsmessage.AAAAResource:
			a = netip.AddrFrom16(b.AAAA)
		default:
			continue
		}
		if !pub(a) {
			sawNonPublic = true
			continue
		}
		public = append(public, a)
		ttl = min(ttl, rr.Header.TTL)
	}
	return public, sawNonPublic, ttl
}

// lookup resolves name for the proxy (A for IPv4, AAAA for IPv6) with our upstream and
// returns its public addresses; sawNonPublic says some answer was private or reserved.
func (g *Gateway) lookup(ctx context.Context, name string, v6 bool) (public []netip.Addr, sawNonPublic bool, ttl uint32, err error) {
	qt := dnsmessage.TypeA
	if v6 {
		qt = dnsmessage.TypeAAAA
	}
	qn, err := dnsmessage.NewName(name + ".")
	if err != nil {
		return nil, false, 0, err
	}
	m, err := g.upstreamExchange(ctx, dnsmessage.Question{Name: qn, Type: qt, Class: dnsmessage.ClassINET})
	if err != nil {
		return nil, false, 0, err
	}
	if m.RCode != dnsmessage.RCodeSuccess {
		return nil, false, 0, fmt.Errorf("egress: %s: %v", name, m.RCode)
	}
	public, sawNonPublic, ttl = chainAddrs(m, name, g.cls.public)
	return public, sawNonPublic, ttl, nil
}

// answerMemory is what the resolver told one sandbox: name → address → until when.
type answerMemory struct {
	mu sync.Mutex
	m  map[string]map[netip.Addr]time.Time
}

func newAnswerMemory() *answerMemory { return &answerMemory{m: map[string]map[netip.Addr]time.Time{}} }

func (am *answerMemory) remember(name string, addrs []netip.Addr, ttl time.Duration, now time.Time) {
	if len(addrs) == 0 {
		return
	}
	until := now.Add(max(ttl, minMemory))
	am.mu.Lock()
	defer am.mu.Unlock()
	if _, ok := am.m[name]; !ok && len(am.m) >= maxMemoryNames {
		am.pruneLocked(now)
		for k := range am.m { // still full: forget an arbitrary name; the proxy re-resolves
			if len(am.m) < maxMemoryNames {
				break
			}
			delete(am.m, k)
		}
	}
	set := am.m[name]
	if set == nil {
		set = map[netip.Addr]time.Time{}
		am.m[name] = set
	}
	for _, a := range addrs {
		if until.After(set[a]) {
			set[a] = until
		}
	}
}

func (am *answerMemory) pruneLocked(now time.Time) {
	for name, set := range am.m {
		for a, t := range set {
			if now.After(t) {
				delete(set, a)
			}
		}
		if len(set) == 0 {
			delete(am.m, name)
		}
	}
}

func (am *answerMemory) has(name string, a netip.Addr, now time.Time) bool {
	am.mu.Lock()
	defer am.mu.Unlock()
	t, ok := am.m[name][a.Unmap()]
	return ok && !now.After(t)
}

// answer builds the reply to one query from the sandbox; nil means send nothing.
func (n *network) answer(ctx context.Context, query []byte, overTCP bool) []byte {
	a := n.a
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		return nil
	}
	qs, err := p.AllQuestions()
	if err != nil || len(qs) != 1 {
		return reply(h, nil, dnsmessage.RCodeFormatError, nil, nil, 512)
	}
	q := qs[0]
	limit := 512
	if err := p.SkipAllAnswers(); err == nil {
		if err := p.SkipAllAuthorities(); err == nil {
			if adds, err := p.AllAdditionals(); err == nil {
				for _, rr := range adds {
					if rr.Header.Type == dnsmessage.TypeOPT {
						limit = min(max(int(rr.Header.Class), 512), 4096)
					}
				}
			}
		}
	}
	if overTCP {
		limit = 65535
	}
	if h.OpCode != 0 {
		return reply(h, &q, dnsmessage.RCodeNotImplemented, nil, nil, limit)
	}
	name := normalizeName(q.Name.String())
	pol := a.pol.Load()
	if name == "" || q.Class != dnsmessage.ClassINET || pol.Mode == spec.EgressDeny {
		a.ctr.dnsDenied.Add(1)
		a.refuse("dns", name, netip.AddrPort{}, ReasonDNSRefused)
		return reply(h, &q, dnsmessage.RCodeRefused, nil, nil, limit)
	}
	if !pol.allows(name) {
		a.ctr.dnsDenied.Add(1)
		a.refuse("dns", name, netip.AddrPort{}, ReasonNameNotAllowed)
		return reply(h, &q, dnsmessage.RCodeNameError, nil, nil, limit)
	}
	if q.Type == dnsmessage.TypeAAAA {
		// The sandbox link is IPv4 only; an AAAA answer would only cost it a failed attempt.
		a.ctr.dnsAllowed.Add(1)
		return reply(h, &q, dnsmessage.RCodeSuccess, nil, nil, limit)
	}
	m, err := a.g.upstreamExchange(ctx, q)
	if err != nil {
		a.log.Debug("egress: upstream DNS failed", "name", name, "err", err)
		return reply(h, &q, dnsmessage.RCodeServerFailure, nil, nil, limit)
	}
	// Under open every address is one the sandbox may reach: answers pass as upstream gave
	// them (a private name resolving to 10.x is what open is for).
	public := a.g.cls.public
	if pol.Mode == spec.EgressOpen {
		public = func(netip.Addr) bool { return true }
	}
	var answers []dnsmessage.Resource
	for _, rr := range m.Answers {
		switch b := rr.Body.(type) {
		case *dnsmessage.AResource:
			if !public(netip.AddrFrom4(b.A)) {
				continue
			}
		case *dnsmessage.AAAAResource:
			continue // IPv4-only link, as above
		}
		answers = append(answers, rr)
	}
	var auth []dnsmessage.Resource
	for _, rr := range m.Authorities {
		if rr.Header.Type == dnsmessage.TypeSOA { // for negative caching; nothing else
			auth = append(auth, rr)
		}
	}
	addrs, sawNonPublic, ttl := chainAddrs(m, name, public)
	if sawNonPublic {
		a.ctr.dnsDenied.Add(1)
		a.refuse("dns", name, netip.AddrPort{}, ReasonNonPublicAnswer)
	} else {
		a.ctr.dnsAllowed.Add(1)
	}
	a.answers.remember(name, addrs, time.Duration(ttl)*time.Second, time.Now())
	return reply(h, &q, m.RCode, answers, auth, limit)
}

// reply packs an answer to h; if it does not fit in limit it is sent truncated (TC set, no
// records) so the client retries over TCP.
func reply(h dnsmessage.Header, q *dnsmessage.Question, rc dnsmessage.RCode, answers, auth []dnsmessage.Resource, limit int) []byte {
	m := dnsmessage.Message{
		Header: dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode, RecursionDesired: h.RecursionDesired,
			RecursionAvailable: true, RCode: rc},
		Answers:     answers,
		Authorities: auth,
	}
	if q != nil {
		m.Questions = []dnsmessage.Question{*q}
	}
	b, err := m.Pack()
	if err != nil {
		m.Answers, m.Authorities, m.RCode = nil, nil, dnsmessage.RCodeServerFailure
		b, _ = m.Pack()
		return b
	}
	if len(b) > limit {
		m.Answers, m.Authorities, m.Truncated = nil, nil, true
		b, _ = m.Pack()
	}
	return b
}

func (n *network) serveDNSUDP() {
	sem := make(chan struct{}, maxDNSInFlight)
	buf := make([]byte, 65535)
	for {
		k, from, err := n.dnsUDP.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) || n.ctx.Err() != nil {
				return
			}
			continue
		}
		q := append([]byte(nil), buf[:k]...)
		select {
		case sem <- struct{}{}:
		default:
			continue // overloaded: drop, the client retries
		}
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			defer func() { <-sem }()
			if r := n.answer(n.ctx, q, false); r != nil {
				n.dnsUDP.WriteTo(r, from)
			}
		}()
	}
}

func (n *network) serveDNSTCP() {
	for {
		c, ok := n.accept(n.dnsTCP)
		if !ok {
			return
		}
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			defer n.untrack(c)
			defer c.Close()
			for {
				c.SetReadDeadline(time.Now().Add(dnsTCPIdle))
				q, err := readTCPMsg(c)
				if err != nil {
					return
				}
				r := n.answer(n.ctx, q, true)
				if r == nil {
					return
				}
				c.SetWriteDeadline(time.Now().Add(dnsTCPIdle))
				if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(r))), r...)); err != nil {
					return
				}
			}
		}()
	}
}
