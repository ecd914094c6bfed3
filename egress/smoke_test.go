package egress

import (
	"testing"

	"github.com/airlock-sandbox/airlock/spec"
)

func TestSmoke(t *testing.T) {
	e := newEnv(t)
	s := e.newSandbox("smoke", Policy{Mode: spec.EgressAllowDomains, Domains: []string{"*.example.com"}})
	ctx := ctx10(t)
	rc, addrs, err := s.resolve(ctx, "udp", "allowed.example.com")
	t.Logf("resolve: %v %v %v", rc, addrs, err)
	body, err := s.request(ctx, "198.51.100.10:80", "allowed.example.com", nil)
	t.Logf("http: %q %v", body, err)
	body, err = s.request(ctx, "198.51.100.10:443", "allowed.example.com", strp("allowed.example.com"))
	t.Logf("https: %q %v", body, err)
	body, err = s.request(ctx, "198.51.100.10:80", "198.51.100.10", nil)
	t.Logf("ip: %q %v", body, err)
	t.Logf("counters %+v", s.att.Counters())
	t.Logf("refusals %v", e.logs.refusals("smoke"))
}
