package egress

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/airlock-sandbox/airlock/sandbox"
)

// nonPublic4 are the IPv4 ranges that are not reachable public internet (IANA special-purpose
// registry plus multicast and reserved). The documentation ranges are here: real TEST-NET
// traffic never routes, so only a test may declare them public via Options.ExtraPublic.
var nonPublic4 = mustPrefixes(
	"0.0.0.0/8",       // "this network"
	"10.0.0.0/8",      // RFC 1918
	"100.64.0.0/10",   // CGNAT shared space
	"127.0.0.0/8",     // loopback
	"169.254.0.0/16",  // link-local, incl. 169.254.169.254 cloud metadata
	"172.16.0.0/12",   // RFC 1918
	"192.0.0.0/24",    // IETF protocol assignments
	"192.0.2.0/24",    // TEST-NET-1
	"192.88.99.0/24",  // deprecated 6to4 relay anycast
	"192.168.0.0/16",  // RFC 1918
	"198.18.0.0/15",   // benchmarking
	"198.51.100.0/24", // TEST-NET-2
	"203.0.113.0/24",  // TEST-NET-3
	"224.0.0.0/4",     // multicast
	"240.0.0.0/4",     // reserved, incl. 255.255.255.255 broadcast
)

// nonPublic6 are IPv6 ranges inside 2000::/3 (global unicast) that are still not public.
// Everything outside 2000::/3 is non-public except NAT64 of a public IPv4 address.
var nonPublic6 = mustPrefixes(
	"2001::/23",     // IETF protocol assignments: Teredo, benchmarking, ORCHID
	"2001:db8::/32", // documentation
	"2002::/16",     // 6to4: tunnels into arbitrary IPv4, including private space
	"3fff::/20",     // documentation (RFC 9637)
)

var (
	global6   = netip.MustParsePrefix("2000::/3")
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	docRanges = mustPrefixes("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32", "3fff::/20")
)

func mustPrefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

func inAny(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// IsPublic reports whether ip is a public unicast address: not private (RFC 1918, ULA),
// CGNAT, loopback, link-local (incl. metadata 169.254.169.254 and fd00:ec2::254), multicast,
// broadcast, unspecified, reserved, benchmarking or documentation. IPv4-mapped and NAT64
// (64:ff9b::/96) addresses are judged by the IPv4 address they carry. A zoned address is never
// public.
func IsPublic(ip netip.Addr) bool {
	if !ip.IsValid() || ip.Zone() != "" {
		return false
	}
	if ip.Is4In6() {
		ip = ip.Unmap()
	}
	if ip.Is4() {
		return !inAny(nonPublic4, ip)
	}
	if nat64.Contains(ip) {
		b := ip.As16()
		return IsPublic(netip.AddrFrom4([4]byte(b[12:16])))
	}
	return global6.Contains(ip) && !inAny(nonPublic6, ip)
}

// classifier is IsPublic widened by the test-only documentation prefixes.
type classifier struct{ extra []netip.Prefix }

func (c classifier) public(ip netip.Addr) bool {
	ip = ip.Unmap()
	if ip.Zone() == "" && inAny(c.extra, ip) {
		return true
	}
	return IsPublic(ip)
}

// DocumentationPrefix reports whether p lies inside a documentation range (TEST-NET-1/2/3,
// 2001:db8::/32): the only prefixes Options.ExtraPublic may declare public.
func DocumentationPrefix(p netip.Prefix) bool { return checkExtraPublic([]netip.Prefix{p}) == nil }

// checkExtraPublic refuses any ExtraPublic prefix outside the documentation ranges: the
// option exists so tests can build a fake internet, not to open private space.
func checkExtraPublic(ps []netip.Prefix) error {
	for i, p := range ps {
		p = p.Masked()
		ok := false
		for _, d := range docRanges {
			if p.Addr().Is4() == d.Addr().Is4() && p.Bits() >= d.Bits() && d.Contains(p.Addr()) {
				ok = true
			}
		}
		if !ok {
			return fmt.Errorf("%w: Options.ExtraPublic[%d] %s: only documentation ranges (%v) may be declared public", sandbox.ErrInvalid, i, p, docRanges)
		}
	}
	return nil
}

// NonPublicPrefixes are the ranges IsPublic refuses, for a platform that enforces public-only
// egress with address blocks (a Kubernetes NetworkPolicy) rather than by asking IsPublic: the
// IPv4 ones; IPv6 global unicast (2000::/3, the only IPv6 space that can be public); and the
// IPv6 ones inside it. NAT64 of a public IPv4 address, which IsPublic allows, lies outside
// 2000::/3, so a block list built from these refuses it.
func NonPublicPrefixes() ([]netip.Prefix, netip.Prefix, []netip.Prefix) {
	return slices.Clone(nonPublic4), global6, slices.Clone(nonPublic6)
}
