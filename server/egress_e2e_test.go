package server_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/backend/local"
	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/client"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/plan"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
	"github.com/airlock-sandbox/airlock/token"
)

func egressHarness(t *testing.T, wrap func(*local.Backend) sandbox.Backend) *harness {
	t.Helper()
	host := testutil.NewNetns(t)
	return newHarnessWith(t, harnessConfig{wrap: wrap, egress: local.EgressOptions{
		HostNetns: &host,
		// Never asked in these tests (no name is resolved); TEST-NET-3, unrouted.
		Upstream: []netip.AddrPort{netip.MustParseAddrPort("203.0.113.53:53")},
	}})
}

// TestSetEgressOverSDK changes a live sandbox's egress through the daemon and reads its
// counters: deny → allowDomains (resolv.conf appears, a refused connection is counted) → deny.
func TestSetEgressOverSDK(t *testing.T) {
	h := egressHarness(t, nil)
	ctx := ctxT(t)
	sb := create(t, h.c, "eg", nil)
	resolv := func() string {
		out, _, res := execShell(t, sb, "cat /etc/resolv.conf")
		if res.ExitCode != 0 {
			t.Fatalf("cat /etc/resolv.conf: %+v", res)
		}
		return out
	}
	if got := resolv(); strings.Contains(got, "nameserver") {
		t.Fatalf("deny: resolv.conf %q", got)
	}
	c0, err := sb.EgressCounters(ctx)
	if err != nil || c0 != (client.EgressCounters{}) {
		t.Fatalf("counters under deny: %+v %v", c0, err)
	}

	if err := sb.SetEgress(ctx, spec.Egress{Mode: spec.EgressAllowDomains, Domains: []string{"api.example.com"}}); err != nil {
		t.Fatal(err)
	}
	if got := resolv(); !strings.Contains(got, "nameserver 10.") {
		t.Fatalf("allowDomains: resolv.conf %q", got)
	}
	// A private address: the proxy refuses it (nothing leaves the test's namespaces).
	out, _, res := execShell(t, sb, "bash -c 'exec 3<>/dev/tcp/10.0.0.5/80; head -c1 <&3' 2>&1; echo done")
	if !strings.Contains(out, "done") {
		t.Fatalf("connect attempt: %q %+v", out, res)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := sb.EgressCounters(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if c.ConnsDenied >= 1 {
			if c.ConnsAllowed != 0 {
				t.Fatalf("counters: %+v", c)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the refused connection was not counted: %+v", c)
		}
		time.Sleep(20 * time.Millisecond)
	}

	if err := sb.SetEgress(ctx, spec.Egress{Mode: spec.EgressDeny}); err != nil {
		t.Fatal(err)
	}
	if got := resolv(); strings.Contains(got, "nameserver") {
		t.Fatalf("back to deny: resolv.conf %q", got)
	}
}

// TestSetEgressErrors: every refusal arrives typed, and nothing changes.
func TestSetEgressErrors(t *testing.T) {
	h := egressHarness(t, nil)
	ctx := ctxT(t)
	sb := create(t, h.c, "egerr", nil)
	var fe *spec.FieldError
	for _, tc := range []struct {
		name  string
		e     spec.Egress
		field string
	}{
		{"unknown mode", spec.Egress{Mode: "wide"}, "egress.mode"},
		{"allowDomains without domains", spec.Egress{Mode: spec.EgressAllowDomains}, "egress.domains"},
		{"domains under allow", spec.Egress{Mode: spec.EgressAllow, Domains: []string{"a.example.com"}}, "egress.domains"},
		{"an IP literal", spec.Egress{Mode: spec.EgressAllowDomains, Domains: []string{"10.0.0.1"}}, "egress.domains[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := sb.SetEgress(ctx, tc.e)
			if !errors.Is(err, sandbox.ErrInvalid) || !errors.As(err, &fe) || fe.Path != tc.field {
				t.Fatalf("want ErrInvalid naming %s, got %v", tc.field, err)
			}
		})
	}
	if err := h.c.Sandbox("s-0000000000000000").SetEgress(ctx, spec.Egress{Mode: spec.EgressAllow}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("unknown session: %v", err)
	}
	if _, err := h.c.Sandbox("s-0000000000000000").EgressCounters(ctx); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("unknown session counters: %v", err)
	}

	// A delegated token reads counters but may not widen what its sandbox reaches.
	manage, err := sb.MintToken(ctx, token.Manage, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	tc := h.clientWith(t, client.Options{BaseURL: h.tcpURL, TLSConfig: h.tlsConf, Token: manage.Token})
	if err := tc.Sandbox(sb.ID).SetEgress(ctx, spec.Egress{Mode: spec.EgressAllow}); !errors.Is(err, sandbox.ErrForbidden) {
		t.Fatalf("token: want ErrForbidden, got %v", err)
	}
	if _, err := tc.Sandbox(sb.ID).EgressCounters(ctx); err != nil {
		t.Fatalf("token reading counters: %v", err)
	}
	out, _, _ := execShell(t, sb, "cat /etc/resolv.conf")
	if strings.Contains(out, "nameserver") {
		t.Fatalf("a refused change was applied: resolv.conf %q", out)
	}
}

// plainBackend hides every optional interface of the backend it holds.
type plainBackend struct{ sandbox.Backend }

// noDomainRules is a backend whose host cannot enforce allowDomains.
type noDomainRules struct{ *local.Backend }

func (b noDomainRules) Capabilities(ctx context.Context) capability.Set {
	s := b.Backend.Capabilities(ctx)
	s.Entries[capability.DomainEgressRules] = capability.Status{Supported: false, Reason: "this test says so"}
	return s
}

func TestSetEgressUnsupportedAndRefused(t *testing.T) {
	t.Run("backend without it", func(t *testing.T) {
		h := egressHarness(t, func(b *local.Backend) sandbox.Backend { return plainBackend{b} })
		sb := create(t, h.c, "egplain", nil)
		if err := sb.SetEgress(ctxT(t), spec.Egress{Mode: spec.EgressAllow}); !errors.Is(err, sandbox.ErrUnsupported) {
			t.Fatalf("SetEgress: want ErrUnsupported, got %v", err)
		}
		if _, err := sb.EgressCounters(ctxT(t)); !errors.Is(err, sandbox.ErrUnsupported) {
			t.Fatalf("EgressCounters: want ErrUnsupported, got %v", err)
		}
	})
	t.Run("capability missing", func(t *testing.T) {
		h := egressHarness(t, func(b *local.Backend) sandbox.Backend { return noDomainRules{b} })
		sb := create(t, h.c, "egcap", nil)
		err := sb.SetEgress(ctxT(t), spec.Egress{Mode: spec.EgressAllowDomains, Domains: []string{"a.example.com"}})
		var r *plan.Refusal
		if !errors.Is(err, sandbox.ErrRefused) || !errors.As(err, &r) || r.Capability != capability.DomainEgressRules {
			t.Fatalf("want ErrRefused naming %s, got %v", capability.DomainEgressRules, err)
		}
		// allow needs another capability, which the host has.
		if err := sb.SetEgress(ctxT(t), spec.Egress{Mode: spec.EgressAllow}); err != nil {
			t.Fatal(err)
		}
	})
}
