package egress

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/spec"
)

// Benchmarks compare the sandbox's path (sandbox → veth → our proxy → uplink) with the
// host's own path (host → uplink) to the same fake-internet servers. Run with
//
//	go test -run '^$' -bench . -benchtime 2s ./egress/

// serveSinkSource adds a discard server (:9, answers the byte count at EOF) and a source
// server (:19, sends as many bytes as the 8-byte request asks) to the fake internet.
func serveSinkSource(b *testing.B, e *env) {
	for _, port := range []int{9, 19} {
		ln, err := e.inetRun.listen(context.Background(), "tcp", netip.AddrPortFrom(ipAllowed, uint16(port)).String())
		must(b, err, "listen")
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer c.Close()
					if port == 9 {
						n, _ := io.Copy(io.Discard, c)
						c.Write(binary.BigEndian.AppendUint64(nil, uint64(n)))
						return
					}
					var req [8]byte
					if _, err := io.ReadFull(c, req[:]); err != nil {
						return
					}
					io.CopyN(c, zeroReader{}, int64(binary.BigEndian.Uint64(req[:])))
				}()
			}
		}()
		b.Cleanup(func() { ln.Close(); wg.Wait() })
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }

type dialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

func benchPaths(b *testing.B, e *env) map[string]dialFunc {
	s := e.newSandbox("bench-allow", Policy{Mode: spec.EgressAllow})
	d := e.newSandbox("bench-domains", Policy{Mode: spec.EgressAllowDomains, Domains: []string{"*.example.com"}})
	o := e.newSandbox("bench-open", Policy{Mode: spec.EgressOpen})
	return map[string]dialFunc{"host-direct": hostDial(e), "sandbox-allow": s.dial, "sandbox-allowDomains": d.dial, "sandbox-open": o.dial}
}

func BenchmarkThroughput(b *testing.B) {
	e := newEnv(b)
	serveSinkSource(b, e)
	paths := benchPaths(b, e)
	chunk := make([]byte, 1<<20)
	for _, name := range []string{"host-direct", "sandbox-allow"} {
		dial := paths[name]
		b.Run("upload/"+name, func(b *testing.B) {
			c, err := dial(context.Background(), "tcp", "198.51.100.10:9")
			must(b, err, "dial")
			defer c.Close()
			b.SetBytes(int64(len(chunk)))
			b.ResetTimer()
			for range b.N {
				if _, err := c.Write(chunk); err != nil {
					b.Fatal(err)
				}
			}
			c.(*net.TCPConn).CloseWrite()
			var n [8]byte
			if _, err := io.ReadFull(c, n[:]); err != nil || binary.BigEndian.Uint64(n[:]) != uint64(b.N*len(chunk)) {
				b.Fatalf("sink got %d bytes, sent %d: %v", binary.BigEndian.Uint64(n[:]), b.N*len(chunk), err)
			}
		})
		b.Run("download/"+name, func(b *testing.B) {
			c, err := dial(context.Background(), "tcp", "198.51.100.10:19")
			must(b, err, "dial")
			defer c.Close()
			total := int64(b.N) * int64(len(chunk))
			b.SetBytes(int64(len(chunk)))
			b.ResetTimer()
			c.Write(binary.BigEndian.AppendUint64(nil, uint64(total)))
			if n, err := io.Copy(io.Discard, c); err != nil || n != total {
				b.Fatalf("received %d of %d: %v", n, total, err)
			}
		})
	}
}

// BenchmarkConnect is one new connection plus one small HTTP exchange (or TLS handshake plus
// exchange) per iteration; the difference to host-direct is what the proxy adds.
func BenchmarkConnect(b *testing.B) {
	e := newEnv(b)
	paths := benchPaths(b, e)
	for _, name := range []string{"host-direct", "sandbox-allow", "sandbox-allowDomains", "sandbox-open"} {
		dial := paths[name]
		b.Run("http/"+name, func(b *testing.B) {
			for range b.N {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				body, err := request(ctx, dial, e.pki.pool, "198.51.100.10:80", "allowed.example.com", nil)
				cancel()
				if err != nil || !contains(body, "local=198.51.100.10:80") {
					b.Fatalf("%q %v", body, err)
				}
			}
		})
		b.Run("tls/"+name, func(b *testing.B) {
			for range b.N {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				body, err := request(ctx, dial, e.pki.pool, "198.51.100.10:443", "allowed.example.com", strp("allowed.example.com"))
				cancel()
				if err != nil || !contains(body, "local=198.51.100.10:443") {
					b.Fatalf("%q %v", body, err)
				}
			}
		})
	}
}
