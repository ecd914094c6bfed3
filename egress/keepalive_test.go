package egress

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/airlock-sandbox/airlock/spec"
)

// Every request on a plaintext connection is judged, not only the first: a keep-alive or
// pipelined request must not switch to another virtual host of the same address (a CDN).

const kaAddr = "198.51.100.10:80" // allowed.example.com; its server answers any Host

func get(host string) string { return "GET / HTTP/1.1\r\nHost: " + host + "\r\n\r\n" }

// exchange sends reqs on one connection, each after the previous answer (or all in one write
// when pipelined), and returns the bodies answered before the first failure.
func exchange(ctx context.Context, dial func(context.Context, string, string) (net.Conn, error), dialAddr string, reqs []string, pipelined bool) ([]string, error) {
	c, err := dial(ctx, "tcp", dialAddr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	br := bufio.NewReader(c)
	if pipelined {
		if _, err := io.WriteString(c, strings.Join(reqs, "")); err != nil {
			return nil, err
		}
	}
	var bodies []string
	for _, r := range reqs {
		if !pipelined {
			if _, err := io.WriteString(c, r); err != nil {
				return bodies, err
			}
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return bodies, err
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return bodies, err
		}
		bodies = append(bodies, string(b))
	}
	return bodies, nil
}

// kaCases numbers keepAliveCase's cases (their requests' paths).
var kaCases atomic.Int64

// underPath puts the request r's target under the path prefix tag (its request line only: a
// body that looks like a request stays as it is).
func underPath(t testing.TB, r, tag string) string {
	t.Helper()
	method, rest, ok := strings.Cut(r, " /")
	if !ok || strings.ContainsAny(method, "\r\n") {
		t.Fatalf("test request %q: no origin-form target", r)
	}
	return method + " " + tag + "/" + rest
}

// keepAliveCase sends reqs to kaAddr on one connection. deny cannot connect; allow and open
// pass every request; allowDomains passes the first refuseAt requests and refuses the one at
// refuseAt (-1: none) with reason, and the server never sees it (nor any later one).
func (b *bctx) keepAliveCase(pipelined bool, reqs []string, refuseAt int, reason Reason, name string) {
	b.t.Helper()
	// This case's requests under a path of their own, counted by it: a request an earlier case
	// left in flight (forwarded, then its connection refused on a pipelined one behind it) may
	// reach the server after that case ended, and must not count as one of these.
	tag := fmt.Sprintf("/ka%d", kaCases.Add(1))
	for i, r := range reqs {
		reqs[i] = underPath(b.t, r, tag)
	}
	hostDial := hostDial(b.e)
	if bodies, err := exchange(b.ctx, hostDial, kaAddr, reqs, pipelined); err != nil || len(bodies) != len(reqs) {
		b.t.Fatalf("positive control: the host's exchange with %s: %d of %d answers, %v", kaAddr, len(bodies), len(reqs), err)
	}
	before := map[string]int{}
	hostsOf := func(r string) string {
		req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(r)))
		if err != nil {
			b.t.Fatalf("test request %q: %v", r, err)
		}
		return req.Host + "@" + kaAddr
	}
	for _, r := range reqs {
		before[hostsOf(r)] = b.e.hits.get(hostsOf(r))
	}
	total, m := b.e.hits.get(tag+"@"+kaAddr), b.s.mark()
	bodies, err := exchange(b.ctx, b.s.dial, kaAddr, reqs, pipelined)
	switch {
	case b.is(spec.EgressDeny):
		b.unreachable(err)
	case b.is(spec.EgressAllow) || b.is(spec.EgressOpen) || refuseAt < 0:
		if err != nil || len(bodies) != len(reqs) {
			b.t.Fatalf("%s: %d of %d answers: %v", b.mode, len(bodies), len(reqs), err)
		}
		for i, body := range bodies {
			if !contains(body, "local="+kaAddr) {
				b.t.Fatalf("answer %d from the wrong server: %q", i, body)
			}
		}
	default:
		if err == nil {
			b.t.Fatalf("want request %d refused (%s), all %d were answered: %q", refuseAt, reason, len(reqs), bodies)
		}
		if len(bodies) > refuseAt || (!pipelined && len(bodies) != refuseAt) {
			b.t.Fatalf("%d answers before the refusal, want %d", len(bodies), refuseAt)
		}
		// The server saw at most the requests before the refused one, and never its host.
		if got := b.e.hits.get(tag+"@"+kaAddr) - total; got > refuseAt {
			b.t.Fatalf("the server saw %d requests, want at most %d", got, refuseAt)
		}
		if h := hostsOf(reqs[refuseAt]); b.e.hits.get(h) != before[h] && !strings.HasPrefix(h, "allowed.example.com@") {
			b.t.Fatalf("the server was asked for %s", h)
		}
		b.s.requireRefusal(b.t, m, reason, name)
	}
}

var keepAliveCases = []struct {
	name string
	run  func(b *bctx)
}{
	{"KeepAlive/SameHost", func(b *bctx) {
		b.keepAliveCase(false, []string{get("allowed.example.com"), get("allowed.example.com:80")}, -1, "", "")
	}},
	{"KeepAlive/HostSwitch", func(b *bctx) {
		b.keepAliveCase(false, []string{get("allowed.example.com"), get("evil-example.com")}, 1, ReasonNameNotAllowed, "evil-example.com")
	}},
	{"KeepAlive/HostSwitchToIPLiteral", func(b *bctx) {
		b.keepAliveCase(false, []string{get("allowed.example.com"), get("198.51.100.10")}, 1, ReasonIPLiteral, "198.51.100.10")
	}},
	{"KeepAlive/SwitchToAllowedNameOnAnotherAddress", func(b *bctx) {
		// a.example.com is allowed, but its address is not the one this connection goes to.
		b.keepAliveCase(false, []string{get("allowed.example.com"), get("a.example.com")}, 1, ReasonAddrMismatch, "a.example.com")
	}},
	{"KeepAlive/ThirdRequest", func(b *bctx) {
		b.keepAliveCase(false, []string{get("allowed.example.com"), get("allowed.example.com"), get("evil-example.com")}, 2, ReasonNameNotAllowed, "evil-example.com")
	}},
	{"Pipelined/HostSwitch", func(b *bctx) {
		b.keepAliveCase(true, []string{get("allowed.example.com"), get("evil-example.com")}, 1, ReasonNameNotAllowed, "evil-example.com")
	}},
	{"Pipelined/SameHost", func(b *bctx) {
		b.keepAliveCase(true, []string{get("allowed.example.com"), get("allowed.example.com"), get("allowed.example.com")}, -1, "", "")
	}},
	{"KeepAlive/BodyThatLooksLikeARequest", func(b *bctx) {
		// A body is a body: the request inside it is not one, and it is not refused.
		inner := get("evil-example.com")
		post := "POST / HTTP/1.1\r\nHost: allowed.example.com\r\nContent-Length: " + strconv.Itoa(len(inner)) + "\r\n\r\n" + inner
		b.keepAliveCase(true, []string{post, get("allowed.example.com")}, -1, "", "")
	}},
	{"KeepAlive/AfterChunkedBody", func(b *bctx) {
		post := "POST / HTTP/1.1\r\nHost: allowed.example.com\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
		b.keepAliveCase(true, []string{post, get("evil-example.com")}, 1, ReasonNameNotAllowed, "evil-example.com")
	}},
	{"Framing/ContentLengthAndChunked", func(b *bctx) {
		// Framing two parsers may read differently is how a request hides in a body.
		post := "POST / HTTP/1.1\r\nHost: allowed.example.com\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
		if b.is(spec.EgressAllowDomains) {
			b.keepAliveCase(false, []string{post}, 0, ReasonAmbiguousFraming, "")
		}
	}},
	{"Upgrade/NotAccepted", func(b *bctx) {
		// The server ignores the Upgrade and answers 200: the connection stays HTTP and
		// the next request is judged.
		up := "GET / HTTP/1.1\r\nHost: allowed.example.com\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n"
		b.keepAliveCase(false, []string{up, get("evil-example.com")}, 1, ReasonNameNotAllowed, "evil-example.com")
	}},
	{"Upgrade/AfterTheFirstRequest", func(b *bctx) {
		up := "GET /upgrade HTTP/1.1\r\nHost: allowed.example.com\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n"
		if b.is(spec.EgressAllowDomains) {
			b.keepAliveCase(false, []string{get("allowed.example.com"), up}, 1, ReasonUpgrade, "allowed.example.com")
		}
	}},
	{"Upgrade/H2C", func(b *bctx) {
		// After an h2c upgrade every stream names its own authority; we do not parse HTTP/2.
		up := "GET / HTTP/1.1\r\nHost: allowed.example.com\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
		b.keepAliveCase(false, []string{up}, 0, ReasonUpgrade, "allowed.example.com")
	}},
	{"Upgrade/Accepted", func(b *bctx) { upgradeAccepted(b) }},
}

// upgradeAccepted: after a 101 the bytes are another protocol's, relayed as they are.
func upgradeAccepted(b *bctx) {
	b.t.Helper()
	c, err := b.s.dial(b.ctx, "tcp", kaAddr)
	if b.is(spec.EgressDeny) {
		b.unreachable(err)
		return
	}
	if err != nil {
		b.t.Fatal(err)
	}
	defer c.Close()
	dl, _ := b.ctx.Deadline()
	c.SetDeadline(dl)
	io.WriteString(c, "GET /upgrade HTTP/1.1\r\nHost: allowed.example.com\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		b.t.Fatalf("upgrade: %v %v", resp, err)
	}
	payload := get("evil-example.com") // not HTTP any more: echoed, never parsed
	io.WriteString(c, payload)
	got := make([]byte, len(payload))
	if _, err := io.ReadFull(br, got); err != nil || string(got) != payload {
		b.t.Fatalf("echo after upgrade: %q %v", got, err)
	}
}
