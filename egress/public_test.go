package egress

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/airlock-sandbox/airlock/sandbox"
)

func TestIsPublic(t *testing.T) {
	cases := []struct {
		ip   string
		want bool
		why  string
	}{
		{"8.8.8.8", true, "public v4"},
		{"1.1.1.1", true, "public v4"},
		{"9.255.255.255", true, "just below 10/8"},
		{"11.0.0.0", true, "just above 10/8"},
		{"0.0.0.0", false, "unspecified"},
		{"0.1.2.3", false, "this network 0/8"},
		{"10.0.0.5", false, "RFC1918 10/8"},
		{"10.255.255.255", false, "RFC1918 10/8 top"},
		{"100.64.0.1", false, "CGNAT"},
		{"100.127.255.255", false, "CGNAT top"},
		{"100.63.255.255", true, "just below CGNAT"},
		{"100.128.0.0", true, "just above CGNAT"},
		{"127.0.0.1", false, "loopback"},
		{"127.255.255.254", false, "loopback /8"},
		{"169.254.169.254", false, "cloud metadata"},
		{"169.254.0.1", false, "link-local"},
		{"172.16.0.1", false, "RFC1918 172.16/12"},
		{"172.31.255.255", false, "RFC1918 172.16/12 top"},
		{"172.15.255.255", true, "just below 172.16/12"},
		{"172.32.0.0", true, "just above 172.16/12"},
		{"192.0.0.8", false, "IETF protocol assignments 192.0.0/24"},
		{"192.0.2.1", false, "TEST-NET-1"},
		{"192.88.99.1", false, "6to4 relay anycast"},
		{"192.168.1.1", false, "RFC1918 192.168/16"},
		{"198.18.0.1", false, "benchmarking"},
		{"198.19.255.255", false, "benchmarking top"},
		{"198.20.0.0", true, "just above benchmarking"},
		{"198.51.100.10", false, "TEST-NET-2"},
		{"203.0.113.66", false, "TEST-NET-3"},
		{"224.0.0.1", false, "multicast"},
		{"239.255.255.250", false, "multicast SSDP"},
		{"240.0.0.1", false, "reserved 240/4"},
		{"255.255.255.255", false, "broadcast"},
		{"::", false, "v6 unspecified"},
		{"::1", false, "v6 loopback"},
		{"fe80::1", false, "v6 link-local"},
		{"fe80::1%eth0", false, "zoned link-local"},
		{"fc00::1", false, "ULA fc00::/7"},
		{"fd00::1", false, "ULA fd00::/8"},
		{"fd00:ec2::254", false, "AWS IPv6 metadata"},
		{"ff02::1", false, "v6 multicast"},
		{"ff0e::1", false, "v6 global multicast"},
		{"::ffff:10.0.0.5", false, "IPv4-mapped private"},
		{"::ffff:169.254.169.254", false, "IPv4-mapped metadata"},
		{"::ffff:8.8.8.8", true, "IPv4-mapped public"},
		{"::10.0.0.5", false, "IPv4-compatible (deprecated) is outside 2000::/3"},
		{"64:ff9b::a00:5", false, "NAT64 of 10.0.0.5"},
		{"64:ff9b::a9fe:a9fe", false, "NAT64 of metadata"},
		{"64:ff9b::808:808", true, "NAT64 of 8.8.8.8"},
		{"64:ff9b:1::808:808", false, "local-use NAT64 64:ff9b:1::/48"},
		{"2001:db8::1", false, "v6 documentation"},
		{"3fff::1", false, "v6 documentation 3fff::/20"},
		{"2001::1", false, "Teredo"},
		{"2001:2::1", false, "v6 benchmarking"},
		{"2002:a00:5::1", false, "6to4"},
		{"2606:4700:4700::1111", true, "public v6"},
		{"2a00:1450:4001::1", true, "public v6"},
		{"4000::1", false, "outside 2000::/3"},
		{"100::1", false, "discard-only 100::/64"},
	}
	for _, c := range cases {
		t.Run(c.why+"/"+c.ip, func(t *testing.T) {
			ip := netip.MustParseAddr(c.ip)
			if got := IsPublic(ip); got != c.want {
				t.Fatalf("IsPublic(%s) = %v, want %v (%s)", c.ip, got, c.want, c.why)
			}
		})
	}
	if IsPublic(netip.Addr{}) {
		t.Fatal("the zero Addr must not be public")
	}
}

func TestClassifierExtraPublic(t *testing.T) {
	c := classifier{extra: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}}
	for ip, want := range map[string]bool{
		"198.51.100.10":          true,
		"::ffff:198.51.100.10":   true,
		"203.0.113.1":            false,
		"10.0.0.5":               false,
		"8.8.8.8":                true,
		"169.254.169.254":        false,
		"::ffff:169.254.169.254": false,
	} {
		if got := c.public(netip.MustParseAddr(ip)); got != want {
			t.Errorf("public(%s) = %v, want %v", ip, got, want)
		}
	}
}

func TestCheckExtraPublic(t *testing.T) {
	for _, ok := range []string{"198.51.100.0/24", "203.0.113.0/24", "192.0.2.0/24", "198.51.100.10/32", "2001:db8::/32", "2001:db8:1::/48"} {
		if err := checkExtraPublic([]netip.Prefix{netip.MustParsePrefix(ok)}); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, bad := range []string{"10.0.0.0/8", "169.254.0.0/16", "198.51.0.0/16", "0.0.0.0/0", "::/0", "fd00::/8", "127.0.0.1/32"} {
		err := checkExtraPublic([]netip.Prefix{netip.MustParsePrefix(bad)})
		if !errors.Is(err, sandbox.ErrInvalid) {
			t.Errorf("%s: want ErrInvalid, got %v", bad, err)
		}
	}
}
