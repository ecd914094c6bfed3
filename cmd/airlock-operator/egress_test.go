package main

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestParseUpstream(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []netip.AddrPort
		err  string
	}{
		{"", nil, ""},
		{"10.96.0.10:53", []netip.AddrPort{netip.MustParseAddrPort("10.96.0.10:53")}, ""},
		{" 203.0.113.90:53 , [fd00::a]:5353 ", []netip.AddrPort{netip.MustParseAddrPort("203.0.113.90:53"), netip.MustParseAddrPort("[fd00::a]:5353")}, ""},
		{"10.96.0.10", nil, `"10.96.0.10" is not ip:port`},
		{"dns.local:53", nil, `"dns.local:53" is not ip:port`},
	} {
		got, err := parseUpstream(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("parseUpstream(%q) = %v, %v; want an error naming %s", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("parseUpstream(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

// The sidecar and the init step refuse bad flags before touching anything.
func TestEgressFlagsRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func([]string) error
		args []string
		want string
	}{
		{"init port", egressInit, []string{"-proxy-port", "70000"}, "1..65535"},
		{"init same ports", egressInit, []string{"-proxy-port", "5", "-dns-port", "5"}, "two different ports"},
		{"init root proxy", egressInit, []string{"-proxy-uid", "0"}, "uid 0"},
		{"proxy upstream", egressProxy, []string{"-domains", "a.test", "-upstream", "nope"}, "-upstream"},
		{"proxy public", egressProxy, []string{"-domains", "a.test", "-upstream", "192.0.2.1:53", "-egress-public", "10.0.0.0/8"}, "documentation range"},
		{"proxy domains", egressProxy, []string{"-sandbox", "x", "-domains", "exa mple.org", "-upstream", "192.0.2.1:53"}, "exa mple.org"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.run(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v: %v, want an error naming %q", tc.args, err, tc.want)
			}
		})
	}
}
