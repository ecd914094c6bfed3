package egress

import (
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// runPeek feeds what client writes to peekName over a pipe and returns its result and all
// the bytes the client managed to write before the peek finished.
func runPeek(t *testing.T, limit int, client func(c net.Conn)) (string, []byte, Reason, []byte) {
	t.Helper()
	srv, cli := net.Pipe()
	var sent bytes.Buffer
	var mu sync.Mutex
	rec := &teeConn{Conn: cli, w: &sent, mu: &mu}
	done := make(chan struct{})
	go func() {
		defer close(done)
		client(rec)
	}()
	// The bound keeps a broken peek from hanging the test; no case relies on it expiring
	// except the one that sends nothing.
	name, consumed, reason := peekName(srv, limit, time.Now().Add(2*time.Second))
	srv.Close()
	cli.Close()
	<-done
	mu.Lock()
	defer mu.Unlock()
	return name, consumed, reason, append([]byte(nil), sent.Bytes()...)
}

type teeConn struct {
	net.Conn
	w  io.Writer
	mu *sync.Mutex
}

func (t *teeConn) Write(p []byte) (int, error) {
	n, err := t.Conn.Write(p)
	t.mu.Lock()
	t.w.Write(p[:n])
	t.mu.Unlock()
	return n, err
}

func tlsHello(sni string) func(net.Conn) {
	return func(c net.Conn) {
		tls.Client(c, &tls.Config{ServerName: sni, InsecureSkipVerify: sni == ""}).Handshake()
	}
}

func raw(s string) func(net.Conn) {
	return func(c net.Conn) { c.Write([]byte(s)) }
}

func TestPeekName(t *testing.T) {
	cases := []struct {
		name     string
		client   func(net.Conn)
		limit    int
		wantName string
		want     Reason
	}{
		{"tls sni", tlsHello("allowed.example.com"), 0, "allowed.example.com", ""},
		{"tls sni mixed case", tlsHello("Allowed.Example.COM"), 0, "allowed.example.com", ""},
		{"tls without sni (dialled by IP)", tlsHello(""), 0, "", ReasonNoName},
		{"http host", raw("GET / HTTP/1.1\r\nHost: allowed.example.com\r\n\r\n"), 0, "allowed.example.com", ""},
		{"http host with port", raw("GET / HTTP/1.1\r\nHost: allowed.example.com:8080\r\n\r\n"), 0, "allowed.example.com", ""},
		{"http host trailing dot", raw("GET / HTTP/1.1\r\nHost: allowed.example.com.\r\n\r\n"), 0, "allowed.example.com", ""},
		{"http body follows", raw("POST / HTTP/1.1\r\nHost: a.example.com\r\nContent-Length: 5\r\n\r\nhello"), 0, "a.example.com", ""},
		{"http ip literal", raw("GET / HTTP/1.1\r\nHost: 198.51.100.10\r\n\r\n"), 0, "198.51.100.10", ReasonIPLiteral},
		{"http ip literal with port", raw("GET / HTTP/1.1\r\nHost: 198.51.100.10:80\r\n\r\n"), 0, "198.51.100.10", ReasonIPLiteral},
		{"http ipv6 literal", raw("GET / HTTP/1.1\r\nHost: [2001:db8::1]:80\r\n\r\n"), 0, "2001:db8::1", ReasonIPLiteral},
		{"http/1.0 without host (raw IP)", raw("GET / HTTP/1.0\r\n\r\n"), 0, "", ReasonNoName},
		{"absolute uri agrees with host", raw("GET http://a.example.com/ HTTP/1.1\r\nHost: a.example.com\r\n\r\n"), 0, "a.example.com", ""},
		{"absolute uri without host header", raw("GET http://a.example.com/ HTTP/1.0\r\n\r\n"), 0, "a.example.com", ""},
		{"absolute uri disagrees with host", raw("GET http://evil-example.com/ HTTP/1.1\r\nHost: a.example.com\r\n\r\n"), 0, "", ReasonAmbiguousHost},
		{"two host headers", raw("GET / HTTP/1.1\r\nHost: a.example.com\r\nHost: evil-example.com\r\n\r\n"), 0, "", ReasonNotTLSOrHTTP},
		{"bad host name", raw("GET / HTTP/1.1\r\nHost: a_b!.example.com\r\n\r\n"), 0, "", ReasonBadName},
		{"ssh banner", raw("SSH-2.0-OpenSSH_9.2\r\n"), 0, "", ReasonNotTLSOrHTTP},
		{"dns over tcp", raw("\x00\x1d\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x03com\x00\x00\x01\x00\x01"), 0, "", ReasonNotTLSOrHTTP},
		{"headers beyond the limit", raw("GET / HTTP/1.1\r\nHost: a.example.com\r\nX-Pad: " + strings.Repeat("x", 5000) + "\r\n\r\n"), 1024, "", ReasonNotTLSOrHTTP},
		{"nothing sent (server-first protocol)", func(c net.Conn) { c.Read(make([]byte, 1)) }, 0, "", ReasonNotTLSOrHTTP},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			limit := c.limit
			if limit == 0 {
				limit = 64 << 10
			}
			name, consumed, reason, sent := runPeek(t, limit, c.client)
			if reason != c.want || name != c.wantName {
				t.Fatalf("got (%q, %q), want (%q, %q)", name, reason, c.wantName, c.want)
			}
			if c.name == "dns over tcp" && len(consumed) != 1 {
				// Not an HTTP method: refused after one byte, not after a read timeout.
				t.Fatalf("consumed %d bytes before refusing a binary protocol", len(consumed))
			}
			if len(consumed) > limit {
				t.Fatalf("consumed %d bytes, beyond the limit %d", len(consumed), limit)
			}
			if !bytes.HasPrefix(sent, consumed) {
				t.Fatalf("consumed bytes are not what the client sent")
			}
			if c.want == "" && !bytes.Equal(consumed, sent) {
				// The whole first flight must be replayed to the destination, byte for byte.
				t.Fatalf("consumed %d of %d bytes the client sent", len(consumed), len(sent))
			}
		})
	}
}
