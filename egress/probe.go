//go:build linux

package egress

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/sandbox"
)

// Probe reports whether this host can enforce egress policies: network namespaces, veth
// pairs, and nftables with NAT redirect, conntrack state and named counters. It works in a
// throwaway namespace of its own and changes nothing on the host. The error wraps
// sandbox.ErrUnsupported and says what is missing.
func Probe() error {
	ns, err := newThrowawayNetns()
	if err != nil {
		return fmt.Errorf("%w: egress: cannot create a network namespace: %v", sandbox.ErrUnsupported, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("%w: egress: netlink: %v", sandbox.ErrUnsupported, err)
	}
	defer h.Close()
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "probe0"}, PeerName: "probe1"}); err != nil {
		return fmt.Errorf("%w: egress: veth pairs: %v", sandbox.ErrUnsupported, err)
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		return fmt.Errorf("%w: egress: nftables: %v", sandbox.ErrUnsupported, err)
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "airlock_probe"})
	c.AddObj(&nftables.NamedObj{Table: t, Name: droppedCounter, Type: nftables.ObjTypeCounter, Obj: &expr.Counter{}})
	accept := nftables.ChainPolicyAccept
	pre := c.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: pre, Exprs: cat(matchIif("probe0"), matchL4(unix.IPPROTO_TCP), []expr.Any{
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(1)},
		&expr.Redir{RegisterProtoMin: 1, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED},
	})})
	in := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: cat(matchIif("probe0"), matchCtState(expr.CtStateBitESTABLISHED), verdictAccept)})
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: cat(matchIif("probe0"), countDropped())})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("%w: egress: nftables NAT redirect, conntrack or counters: %v", sandbox.ErrUnsupported, err)
	}
	return nil
}

// newThrowawayNetns makes an anonymous namespace without moving any goroutine into it; it
// disappears when the returned handle is closed.
func newThrowawayNetns() (netns.NsHandle, error) {
	type res struct {
		h   netns.NsHandle
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			ch <- res{h: netns.None(), err: err}
			return
		}
		defer orig.Close()
		h, err := netns.New()
		if serr := netns.Set(orig); serr != nil {
			if h.IsOpen() {
				h.Close()
			}
			ch <- res{h: netns.None(), err: errors.Join(err, serr)}
			return // the thread stays locked and dies with this goroutine
		}
		runtime.UnlockOSThread()
		ch <- res{h: h, err: err}
	}()
	r := <-ch
	return r.h, r.err
}
