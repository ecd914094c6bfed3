package egress

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"errors"
	"log/slog"
	"math/big"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/net/dns/dnsmessage"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeDNS is an authoritative-looking server for test names; it counts the queries that
// reach it, per local address, so a test can prove a query never arrived.
type fakeDNS struct {
	records  map[string][]netip.Addr // name (no trailing dot) → addresses
	cnames   map[string]string
	truncate map[string]bool // answer these over UDP with TC set and no records

	mu     sync.Mutex
	counts map[string]int // local address → queries
	wg     sync.WaitGroup
	pc     net.PacketConn
	ln     net.Listener
}

func newFakeDNS() *fakeDNS {
	return &fakeDNS{records: map[string][]netip.Addr{}, cnames: map[string]string{}, truncate: map[string]bool{}, counts: map[string]int{}}
}

func (f *fakeDNS) count(local string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.counts[local]
}

func (f *fakeDNS) serve(pc net.PacketConn, ln net.Listener) {
	f.pc, f.ln = pc, ln
	f.wg.Add(2)
	go func() {
		defer f.wg.Done()
		buf := make([]byte, 65535)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			// A wildcard-bound UDP socket does not tell the local address; the tests bind
			// one socket per address they care about, so the socket's own address is it.
			if r := f.answer(buf[:n], pc.LocalAddr().String(), false); r != nil {
				pc.WriteTo(r, from)
			}
		}
	}()
	go func() {
		defer f.wg.Done()
		var cwg sync.WaitGroup
		defer cwg.Wait()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			cwg.Add(1)
			go func() {
				defer cwg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				q, err := readTCPMsg(c)
				if err != nil {
					return
				}
				r := f.answer(q, c.LocalAddr().String(), true)
				c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(r))), r...))
			}()
		}
	}()
}

func (f *fakeDNS) close() {
	f.pc.Close()
	f.ln.Close()
	f.wg.Wait()
}

func (f *fakeDNS) answer(q []byte, local string, tcp bool) []byte {
	var m dnsmessage.Message
	if err := m.Unpack(q); err != nil || len(m.Questions) != 1 {
		return nil
	}
	f.mu.Lock()
	f.counts[local]++
	f.mu.Unlock()
	qq := m.Questions[0]
	name := strings.TrimSuffix(strings.ToLower(qq.Name.String()), ".")
	resp := dnsmessage.Message{Header: dnsmessage.Header{ID: m.ID, Response: true, Authoritative: true, RecursionDesired: m.RecursionDesired}, Questions: m.Questions}
	if f.truncate[name] && !tcp {
		resp.Truncated = true
		b, _ := resp.Pack()
		return b
	}
	owner := name
	if target, ok := f.cnames[name]; ok {
		resp.Answers = append(resp.Answers, dnsmessage.Resource{
			Header: dnsmessage.ResourceHeader{Name: qq.Name, Type: dnsmessage.TypeCNAME, Class: dnsmessage.ClassINET, TTL: 60},
			Body:   &dnsmessage.CNAMEResource{CNAME: dnsmessage.MustNewName(target + ".")},
		})
		owner = target
	}
	addrs, ok := f.records[owner]
	if !ok {
		resp.RCode = dnsmessage.RCodeNameError
	}
	on := dnsmessage.MustNewName(owner + ".")
	for _, a := range addrs {
		h := dnsmessage.ResourceHeader{Name: on, Class: dnsmessage.ClassINET, TTL: 60}
		switch {
		case a.Is4() && qq.Type == dnsmessage.TypeA:
			h.Type = dnsmessage.TypeA
			resp.Answers = append(resp.Answers, dnsmessage.Resource{Header: h, Body: &dnsmessage.AResource{A: a.As4()}})
		case a.Is6() && qq.Type == dnsmessage.TypeAAAA:
			h.Type = dnsmessage.TypeAAAA
			resp.Answers = append(resp.Answers, dnsmessage.Resource{Header: h, Body: &dnsmessage.AAAAResource{AAAA: a.As16()}})
		}
	}
	if qq.Type == dnsmessage.TypeTXT && ok {
		resp.Answers = append(resp.Answers, dnsmessage.Resource{
			Header: dnsmessage.ResourceHeader{Name: on, Type: dnsmessage.TypeTXT, Class: dnsmessage.ClassINET, TTL: 60},
			Body:   &dnsmessage.TXTResource{TXT: []string{"hello"}},
		})
	}
	b, err := resp.Pack()
	if err != nil {
		return nil
	}
	return b
}

// query asks server for name/type over udp or tcp with conn made by dial, returning the
// reply's rcode and A addresses.
func query(ctx context.Context, dial func(ctx context.Context, network, addr string) (net.Conn, error), server, network, name string, qt dnsmessage.Type) (dnsmessage.RCode, []netip.Addr, error) {
	q := dnsmessage.Message{Header: dnsmessage.Header{ID: 4242, RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: dnsmessage.MustNewName(name + "."), Type: qt, Class: dnsmessage.ClassINET}}}
	b, err := q.Pack()
	if err != nil {
		return 0, nil, err
	}
	c, err := dial(ctx, network, server)
	if err != nil {
		return 0, nil, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	var resp []byte
	if network == "tcp" {
		if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(b))), b...)); err != nil {
			return 0, nil, err
		}
		if resp, err = readTCPMsg(c); err != nil {
			return 0, nil, err
		}
	} else {
		if _, err := c.Write(b); err != nil {
			return 0, nil, err
		}
		buf := make([]byte, 65535)
		n, err := c.Read(buf)
		if err != nil {
			return 0, nil, err
		}
		resp = buf[:n]
	}
	var m dnsmessage.Message
	if err := m.Unpack(resp); err != nil {
		return 0, nil, err
	}
	if m.ID != 4242 {
		return 0, nil, errors.New("wrong id")
	}
	var out []netip.Addr
	for _, rr := range m.Answers {
		switch b := rr.Body.(type) {
		case *dnsmessage.AResource:
			out = append(out, netip.AddrFrom4(b.A))
		case *dnsmessage.AAAAResource:
			out = append(out, netip.AddrFrom16(b.AAAA))
		}
	}
	return m.RCode, out, nil
}

// logCapture is a slog handler that keeps every record's attributes.
type logCapture struct {
	mu    *sync.Mutex
	recs  *[]map[string]string
	attrs []slog.Attr
}

func newLogCapture() *logCapture {
	return &logCapture{mu: &sync.Mutex{}, recs: &[]map[string]string{}}
}

func (l *logCapture) Enabled(context.Context, slog.Level) bool { return true }

func (l *logCapture) Handle(_ context.Context, r slog.Record) error {
	m := map[string]string{"msg": r.Message}
	for _, a := range l.attrs {
		m[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
	l.mu.Lock()
	*l.recs = append(*l.recs, m)
	l.mu.Unlock()
	return nil
}

func (l *logCapture) WithAttrs(as []slog.Attr) slog.Handler {
	return &logCapture{mu: l.mu, recs: l.recs, attrs: append(append([]slog.Attr(nil), l.attrs...), as...)}
}

func (l *logCapture) WithGroup(string) slog.Handler { return l }

// refusals returns the refusal records logged for sandbox id so far.
func (l *logCapture) refusals(id string) []map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]string
	for _, r := range *l.recs {
		if r["msg"] == "egress refused" && r["sandbox"] == id {
			out = append(out, r)
		}
	}
	return out
}

// testPKI is a CA and one server certificate for every test name and address.
type testPKI struct {
	pool *x509.CertPool
	cert tls.Certificate
}

func newTestPKI(t testing.TB, names []string, ips []netip.Addr) *testPKI {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "airlock test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "test server"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		DNSNames: names, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	for _, ip := range ips {
		tmpl.IPAddresses = append(tmpl.IPAddresses, ip.AsSlice())
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &testPKI{pool: pool, cert: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}}
}
