package egresswire

import (
	"fmt"
	"strings"
	"sync"

	"github.com/airlock-sandbox/airlock/capability"
	"github.com/airlock-sandbox/airlock/egress"
	"github.com/airlock-sandbox/airlock/sandbox"
	"github.com/airlock-sandbox/airlock/spec"
)

// Probe is egress.Probe once per process: the kernel's abilities do not change, and
// the probe builds and drops a network namespace (a few milliseconds).
var Probe = sync.OnceValue(egress.Probe)

// Capabilities sets publicOnlyEgress and domainEgressRules from egress.Probe: both need
// a veth pair and nftables (NAT redirect, conntrack, counters) in the host namespace, which is
// what the probe tries in a throwaway namespace of its own.
func Capabilities(entries map[capability.Name]capability.Status) {
	st := capability.Status{Supported: true}
	if err := Probe(); err != nil {
		st = capability.Status{Reason: strings.TrimPrefix(err.Error(), sandbox.ErrUnsupported.Error()+": ")}
	}
	entries[capability.PublicOnlyEgress] = st
	entries[capability.DomainEgressRules] = st
	entries[capability.LiveEgress] = st // SetEgress: the same gateway, rewired
}

// Enforceable tells whether this host can enforce egress needing a capability: the
// published set says so, else the probe says why not.
func Enforceable(published func() capability.Set, probe func() error) func(capability.Name) error {
	return func(name capability.Name) error {
		if published != nil && published().Entries[name].Supported {
			return nil
		}
		return probe()
	}
}

// Check refuses an egress block the runtime cannot enforce here; enforceable reports
// (as Enforceable) whether the capability the mode needs holds.
func Check(e spec.Egress, gvisor bool, enforceable func(capability.Name) error) error {
	p := egress.PolicyFromSpec(e)
	if err := p.Validate(); err != nil {
		return err
	}
	if p.Mode == spec.EgressDeny {
		return nil
	}
	if gvisor {
		return fmt.Errorf("%w: egress mode %q under runtime gvisor: runsc has its own network stack, which the egress gateway is not wired to; use runtime native, or egress deny", sandbox.ErrUnsupported, p.Mode)
	}
	name := capability.PublicOnlyEgress
	if p.Mode == spec.EgressAllowDomains {
		name = capability.DomainEgressRules
	}
	if err := enforceable(name); err != nil {
		if p.Mode == spec.EgressOpen {
			// open restricts nothing, but its path out is the same gateway (veth, nftables
			// redirect to the proxy) that publicOnlyEgress probes.
			return fmt.Errorf("%w: egress mode %q needs the egress gateway (a veth pair and nftables in the host namespace; probed as capability %s), which this host lacks: %v", sandbox.ErrUnsupported, p.Mode, name, err)
		}
		return fmt.Errorf("%w: egress mode %q needs capability %s, which this host lacks: %v", sandbox.ErrUnsupported, p.Mode, name, err)
	}
	return nil
}
