package fastpath

import (
	"context"
	"encoding/binary"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/peregrine-net/peregrine/internal/datapath/ctnl"
)

// The IPv6 half of ctliberal.go: the conntrack entries of the IPv6 TCP flows the fast path
// learned (prg_fastpath_flow6, bpf/fastpath6.h) are made liberal the same way, or a long IPv6
// flow's re-learn packet would meet conntrack beyond its window, INVALID, dropped where a rule
// drops INVALID (kube-proxy's ip6tables KUBE-FORWARD), and the flow would stall. IPv6 FINs and
// RSTs always take the normal path (no handshake-only close), so there are no entries to delete.
// A Service flow (FP_F_DNAT, bpf/fastpath_nat6.h) is keyed by what the pod sent, the ClusterIP:
// the tuple of its entry as conntrack keeps it (the original direction), so it is marked like
// any flow; its alias (the translated key) is no flow and is skipped, as IPv4's are.

// ctTuple6 is an IPv6 conntrack tuple (addresses as the map's words: the packet's bytes).
type ctTuple6 struct {
	src, dst     [4]uint32
	sport, dport uint16
}

// nl is t in the shared ctnl package's form (TCP).
func (t ctTuple6) nl() ctnl.Tuple {
	var s, d [16]byte
	for i := range 4 {
		binary.NativeEndian.PutUint32(s[4*i:], t.src[i])
		binary.NativeEndian.PutUint32(d[4*i:], t.dst[i])
	}
	return ctnl.Tuple{Src: netip.AddrFrom16(s), Dst: netip.AddrFrom16(d),
		Sport: binary.BigEndian.Uint16(be16(t.sport)), Dport: binary.BigEndian.Uint16(be16(t.dport)), Proto: 6}
}

// appendCT6Liberal is appendCTLiberal for an IPv6 TCP entry.
func appendCT6Liberal(b []byte, t ctTuple6, seq uint32) []byte {
	return ctnl.AppendLiberal(b, t.nl(), seq)
}

// walkFlows6 is walkFlows for the IPv6 table.
func walkFlows6(m *ebpf.Map, fn func(k fpFpKey6, f *fpFpFlow)) error {
	walkTable(m, fn)
	return nil
}

// table6 is the IPv6 flow table (ctliberal.go's flowTable): the same marking and forgetting
// as IPv4's, with its own tuples (AF_INET6 requests) and per-address counter keys.
func (a *agent) table6() flowTable[fpFpKey6, ctTuple6] {
	return flowTable[fpFpKey6, ctTuple6]{m: a.p.PrgFastpathFlow6, label: "liberal TCP tracking (IPv6)",
		tuple: tuple6, send: send6, pcnt: pcnt6Key, side: a.p.PrgFastpathNat6}
}

func tuple6(k fpFpKey6) (ctTuple6, uint8) {
	return ctTuple6{src: k.Local, dst: k.Remote, sport: k.Lport, dport: k.Rport}, k.Proto
}

// liberalTCP6 is liberalTCP for the IPv6 table, until ctx ends.
func (a *agent) liberalTCP6(ctx context.Context, nss []string) { a.table6().liberalLoop(ctx, a, nss) }

// liberalBeforeForget6 is liberalBeforeForget for IPv6 TCP flows about to be forgotten: ts,
// or with all every learned one of the table.
func (a *agent) liberalBeforeForget6(all bool, ts []ctTuple6) {
	if all {
		a.table6().liberalAll(a)
	}
	a.table6().liberalBeforeForget(a, ts)
}

// send6 marks the entries of IPv6 tuples ts liberal (markLiberal's IPv6 requests).
func send6(s *ctSock, ts []ctTuple6) error { return sendAll(s, ts, appendCT6Liberal) }

// forget6 deletes the IPv6 flows drop selects and returns how many, counting each deleted
// entry down in its address's counter (pcnt6Key), their TCP entries made liberal first.
func (a *agent) forget6(drop func(fpFpKey6, *fpFpFlow) bool) int { return a.table6().forget(a, drop) }

func pcnt6Key(k fpFpKey6) uint64 {
	return 1<<48 | uint64(k.Ovl)<<32 | uint64(k.Local[0]^k.Local[1]^k.Local[2]^k.Local[3])
}
