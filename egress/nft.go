//go:build linux

package egress

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The per-sandbox table (family inet, in the host namespace), for host link <if>, gateway
// <gw> and proxy port <p>:
//
//	chain prerouting { type nat hook prerouting priority dstnat
//	  iifname <if> ip daddr <gw> tcp dport 53 accept      # DNS over TCP to our resolver
//	  iifname <if> meta nfproto ipv4 meta l4proto tcp redirect to :<p>   # every other TCP
//	}
//	chain input { type filter hook input priority filter
//	  iifname <if> ip saddr != <sb> counter name dropped drop   # spoofed sources
//	  iifname <if> ip daddr <gw> udp dport 53 accept
//	  iifname <if> ip daddr <gw> tcp dport 53 accept
//	  iifname <if> ip daddr <gw> tcp dport <p> accept
//	  iifname <if> ip saddr <sb> ct state established,related accept  # replies to the host's own connections
//	  iifname <if> counter name dropped drop              # the host itself, UDP, ICMP, IPv6
//	}
//	chain forward { type filter hook forward priority filter
//	  iifname <if> counter name dropped drop              # nothing is routed for a sandbox
//	  oifname <if> drop                                   # nor towards it
//	}
//
// The drop rules go in first, before the link exists, and the accepts are inserted above them
// once the listeners are bound, so there is no moment the link passes unfiltered traffic.

const droppedCounter = "dropped"

func (g *Gateway) nftConn() (*nftables.Conn, error) {
	var opts []nftables.ConnOption
	if g.opts.HostNetns != nil { // else our own namespace, with no setns
		opts = append(opts, nftables.WithNetNSFd(int(g.hostNS)))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("egress: nftables: %w", err)
	}
	return c, nil
}

func ifnameData(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

func matchIif(ifname string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifnameData(ifname)},
	}
}

func matchOif(ifname string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifnameData(ifname)},
	}
}

func matchIPv4Daddr(a netip.Addr) []expr.Any { return matchIPv4Addr(16, expr.CmpOpEq, a) }

func matchIPv4Saddr(a netip.Addr) []expr.Any { return matchIPv4Addr(12, expr.CmpOpEq, a) }

func matchIPv4SaddrNot(a netip.Addr) []expr.Any { return matchIPv4Addr(12, expr.CmpOpNeq, a) }

// matchIPv4Addr matches IPv4 packets whose address at offset in the IPv4 header (12 source,
// 16 destination) compares to a by op.
func matchIPv4Addr(offset uint32, op expr.CmpOp, a netip.Addr) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Cmp{Op: op, Register: 1, Data: a.AsSlice()},
	}
}

func matchCtState(bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(bits), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

func matchL4(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

func matchDport(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

var (
	verdictAccept = []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}
	verdictDrop   = []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}}
)

func countDropped() []expr.Any {
	return []expr.Any{&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: droppedCounter}, &expr.Verdict{Kind: expr.VerdictDrop}}
}

type nftTable struct {
	t              *nftables.Table
	input, forward *nftables.Chain
}

// installDrops creates the table with its drop rules (phase 1).
func (g *Gateway) installDrops(name, ifname string) (*nftTable, error) {
	c, err := g.nftConn()
	if err != nil {
		return nil, err
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: name})
	c.AddObj(&nftables.NamedObj{Table: t, Name: droppedCounter, Type: nftables.ObjTypeCounter, Obj: &expr.Counter{}})
	accept := nftables.ChainPolicyAccept
	input := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	forward := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: input, Exprs: cat(matchIif(ifname), countDropped())})
	c.AddRule(&nftables.Rule{Table: t, Chain: forward, Exprs: cat(matchIif(ifname), countDropped())})
	c.AddRule(&nftables.Rule{Table: t, Chain: forward, Exprs: cat(matchOif(ifname), verdictDrop)})
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("egress: install nftables table %s: %w", name, err)
	}
	return &nftTable{t: t, input: input, forward: forward}, nil
}

// installAccepts opens the resolver and the proxy and redirects TCP to the proxy (phase 2),
// in one transaction.
func (g *Gateway) installAccepts(nt *nftTable, ifname string, gw, sb netip.Addr, proxyPort uint16) error {
	c, err := g.nftConn()
	if err != nil {
		return err
	}
	t := nt.t
	// InsertRule puts each at the head, so insert in reverse of the wanted order.
	c.InsertRule(&nftables.Rule{Table: t, Chain: nt.input, Exprs: cat(matchIif(ifname), matchIPv4Saddr(sb), matchCtState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), verdictAccept)})
	c.InsertRule(&nftables.Rule{Table: t, Chain: nt.input, Exprs: cat(matchIif(ifname), matchIPv4Daddr(gw), matchL4(unix.IPPROTO_TCP), matchDport(proxyPort), verdictAccept)})
	c.InsertRule(&nftables.Rule{Table: t, Chain: nt.input, Exprs: cat(matchIif(ifname), matchIPv4Daddr(gw), matchL4(unix.IPPROTO_TCP), matchDport(53), verdictAccept)})
	c.InsertRule(&nftables.Rule{Table: t, Chain: nt.input, Exprs: cat(matchIif(ifname), matchIPv4Daddr(gw), matchL4(unix.IPPROTO_UDP), matchDport(53), verdictAccept)})
	c.InsertRule(&nftables.Rule{Table: t, Chain: nt.input, Exprs: cat(matchIif(ifname), matchIPv4SaddrNot(sb), countDropped())})

	accept := nftables.ChainPolicyAccept
	pre := c.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: pre, Exprs: cat(matchIif(ifname), matchIPv4Daddr(gw), matchL4(unix.IPPROTO_TCP), matchDport(53), verdictAccept)})
	c.AddRule(&nftables.Rule{Table: t, Chain: pre, Exprs: cat(
		matchIif(ifname),
		[]expr.Any{
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		},
		matchL4(unix.IPPROTO_TCP),
		[]expr.Any{
			&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(proxyPort)},
			&expr.Redir{RegisterProtoMin: 1, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED},
		},
	)})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("egress: install nftables rules in %s: %w", t.Name, err)
	}
	return nil
}

// deleteTable removes a table if it exists.
func (g *Gateway) deleteTable(name string) error {
	c, err := g.nftConn()
	if err != nil {
		return err
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("egress: list nftables tables: %w", err)
	}
	for _, t := range tables {
		if t.Name == name {
			c.DelTable(t)
			if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("egress: delete nftables table %s: %w", name, err)
			}
		}
	}
	return nil
}

func (g *Gateway) readDropped(table string) (uint64, error) {
	c, err := g.nftConn()
	if err != nil {
		return 0, err
	}
	o, err := c.GetObject(&nftables.NamedObj{
		Table: &nftables.Table{Family: nftables.TableFamilyINet, Name: table},
		Name:  droppedCounter, Type: nftables.ObjTypeCounter,
	})
	if err != nil {
		return 0, err
	}
	if no, ok := o.(*nftables.NamedObj); ok {
		if ctr, ok := no.Obj.(*expr.Counter); ok {
			return ctr.Packets, nil
		}
	}
	return 0, fmt.Errorf("egress: unexpected counter object %T", o)
}
