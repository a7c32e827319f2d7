package fastpath

import (
	"context"
	"encoding/binary"
	"errors"
	"net/netip"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	"github.com/peregrine-net/peregrine/internal/datapath/ctnl"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// The IPv6 half of ctliberal.go: the conntrack entries of the IPv6 TCP flows the fast path
// learned (prg_fastpath_flow6, bpf/fastpath6.h) are made liberal the same way, or a long IPv6
// flow's re-learn packet would meet conntrack beyond its window, INVALID, dropped where a rule
// drops INVALID (kube-proxy's ip6tables KUBE-FORWARD), and the flow would stall. IPv6 FINs and
// RSTs always take the normal path (no handshake-only close), so there are no entries to delete.

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

// walkFlows6 calls fn with every entry of the IPv6 flow table.
func walkFlows6(m *ebpf.Map, fn func(k fpFpKey6, f *fpFpFlow)) error {
	var k fpFpKey6
	var f fpFpFlow
	it := m.Iterate()
	for it.Next(&k, &f) {
		fn(k, &f)
	}
	return it.Err()
}

// liberalTCP6 is liberalTCP for the IPv6 table, until ctx ends.
func (a *agent) liberalTCP6(ctx context.Context, nss []string) {
	m := a.p.PrgFastpathFlow6
	if m == nil {
		return
	}
	socks := map[string]*ctSock{}
	defer func() {
		for _, s := range socks {
			s.Close()
		}
	}()
	marked := map[fpFpKey6]uint64{}
	failed := map[string]bool{}
	tick := time.NewTicker(ctLiberalEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		var todo []ctTuple6
		next := map[fpFpKey6]uint64{}
		_ = walkFlows6(m, func(k fpFpKey6, f *fpFpFlow) {
			if k.Proto != 6 || f.Flags&(fpFOut|fpFIn) != fpFOut|fpFIn || f.OutNs == 0 || f.Flags&fDone == fDone {
				return
			}
			next[k] = f.OutNs
			if marked[k] != f.OutNs {
				todo = append(todo, ctTuple6{src: k.Local, dst: k.Remote, sport: k.Lport, dport: k.Rport})
			}
		})
		marked = next
		if len(todo) == 0 {
			continue
		}
		for _, ns := range nss {
			if v, err := netnsutil.ReadFileIn(ns, conntrackLiberal); err != nil || strings.TrimSpace(v) == "1" {
				continue // no conntrack there, or every entry liberal already
			}
			s := socks[ns]
			if s == nil {
				var err error
				if s, err = openCTSock(ns); err != nil {
					if !failed[ns] {
						a.lg.Printf("liberal TCP tracking (IPv6): %v", err)
						failed[ns] = true
					}
					continue
				}
				socks[ns] = s
			}
			if err := send6(s, todo); err != nil && !failed[ns] {
				a.lg.Printf("liberal TCP tracking (IPv6) in %s: %v", netnsutil.Label(ns), err)
				failed[ns] = true
			}
		}
	}
}

// learnedTCP6 is learnedTCP (ctliberal.go) for the IPv6 table.
func learnedTCP6(k fpFpKey6, f *fpFpFlow) (ctTuple6, bool) {
	if k.Proto != 6 || f.Flags&(fpFOut|fpFIn) == 0 {
		return ctTuple6{}, false
	}
	return ctTuple6{src: k.Local, dst: k.Remote, sport: k.Lport, dport: k.Rport}, true
}

// liberalBeforeForget6 is liberalBeforeForget for the IPv6 TCP flows about to be forgotten:
// every learned one when all is set (a new generation forgets the whole table), else ts.
func (a *agent) liberalBeforeForget6(all bool, ts []ctTuple6) {
	if all && a.p.PrgFastpathFlow6 != nil {
		_ = walkFlows6(a.p.PrgFastpathFlow6, func(k fpFpKey6, f *fpFpFlow) {
			if t, ok := learnedTCP6(k, f); ok {
				ts = append(ts, t)
			}
		})
	}
	if len(ts) == 0 {
		return
	}
	for _, ns := range a.ctNS {
		if v, err := netnsutil.ReadFileIn(ns, conntrackLiberal); err != nil || strings.TrimSpace(v) == "1" {
			continue
		}
		s, err := openCTSock(ns)
		if err != nil {
			continue
		}
		_ = send6(s, ts)
		s.Close()
	}
}

// send6 sends the liberal updates of ts in buffers of up to 32 KiB.
func send6(s *ctSock, ts []ctTuple6) error {
	var b []byte
	var first error
	for i, t := range ts {
		b = appendCT6Liberal(b, t, uint32(i+1))
		if len(b) > 32<<10 {
			_, err := s.send(b)
			first = errors.Join(first, err)
			b = b[:0]
		}
	}
	_, err := s.send(b)
	return errors.Join(first, err)
}

// forget6 deletes the IPv6 flows drop selects and returns how many, counting each deleted
// counted entry down in its address's flow counter (pcnt6Key), as the sweep would.
func (a *agent) forget6(drop func(fpFpKey6, *fpFpFlow) bool) int {
	m := a.p.PrgFastpathFlow6
	if m == nil {
		return 0
	}
	var del []fpFpKey6
	var counted []bool
	var tcp []ctTuple6
	_ = walkFlows6(m, func(k fpFpKey6, f *fpFpFlow) {
		if drop(k, f) {
			del = append(del, k)
			counted = append(counted, f.Flags&fCounted != 0)
			if t, ok := learnedTCP6(k, f); ok {
				tcp = append(tcp, t)
			}
		}
	})
	a.liberalBeforeForget6(false, tcp)
	n := 0
	for i, k := range del {
		err := m.Delete(k)
		if err == nil && counted[i] {
			pk := pcnt6Key(k)
			var c uint32
			if a.p.PrgFastpathPcnt.Lookup(pk, &c) == nil && c > 0 {
				_ = a.p.PrgFastpathPcnt.Update(pk, c-1, ebpf.UpdateExist)
			}
		}
		if err == nil || errors.Is(err, ebpf.ErrKeyNotExist) {
			n++
		}
	}
	return n
}

// pcnt6Key is bpf/fastpath6.h's pcnt6_key: the flow counter's key of an IPv6 local address.
func pcnt6Key(k fpFpKey6) uint64 {
	return 1<<48 | uint64(k.Ovl)<<32 | uint64(k.Local[0]^k.Local[1]^k.Local[2]^k.Local[3])
}
