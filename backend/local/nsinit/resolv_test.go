package nsinit

import (
	"net/netip"
	"testing"
)

func TestResolvConf(t *testing.T) {
	if got := string(ResolvConf(netip.MustParseAddr("10.200.0.1"))); got != "nameserver 10.200.0.1\noptions edns0\n" {
		t.Errorf("with a resolver: %q", got)
	}
	if got := ResolvConf(netip.Addr{}); len(got) != 0 {
		t.Errorf("under deny: %q, want an empty file", got)
	}
}
