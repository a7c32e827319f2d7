package ezpath

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Counters of the switch programs (enum in bpf/ezpath_tor.bpf.c).
const (
	torEncap = iota
	torDecap
	torTransit
	torMissVNI
	torMissEncap
	torMissRoute
	torMissDecap
	torNotIP
	torErr
	torStatN
)

var torStatNames = [torStatN]string{"encap", "decap", "transit", "miss_vni", "miss_encap", "miss_route", "miss_decap", "not_ip", "errors"}

// FlowKey is one overlay flow as a switch counts it: the tenant's VNI and the inner 5-tuple.
type FlowKey struct {
	VNI   uint32     `json:"vni"`
	Src   netip.Addr `json:"src"`
	Dst   netip.Addr `json:"dst"`
	Proto uint8      `json:"proto"`
	SPort uint16     `json:"sport"`
	DPort uint16     `json:"dport"`
}

func (k FlowKey) String() string {
	p := map[uint8]string{6: "tcp", 17: "udp", 1: "icmp"}[k.Proto]
	if p == "" {
		p = fmt.Sprintf("proto%d", k.Proto)
	}
	return fmt.Sprintf("%s %s:%d > %s:%d vni %d", p, k.Src, k.SPort, k.Dst, k.DPort, k.VNI)
}

// FlowCount is a flow's register in ezp_flow_bytes.
type FlowCount struct {
	Key              FlowKey `json:"key"`
	Bytes            uint64  `json:"bytes"`
	Packets          uint64  `json:"packets"`
	OffloadedPackets uint64  `json:"offloaded_packets"`
	LastNs           uint64  `json:"last_ns"`
}

func ntohs(v uint16) uint16 { return v>>8 | v<<8 }

// readFlowTable reads every flow register of a switch (IPv4 flows; the data plane offloads IPv4).
func readFlowTable(m *ebpf.Map) ([]FlowCount, error) {
	var out []FlowCount
	var k torEzpFlowKey
	var v torEzpFlowVal
	it := m.Iterate()
	for it.Next(&k, &v) {
		out = append(out, FlowCount{
			Key: FlowKey{VNI: k.Vni, Src: fromNBO(k.Flow.Saddr[0]), Dst: fromNBO(k.Flow.Daddr[0]), Proto: k.Flow.Proto,
				SPort: ntohs(k.Flow.Sport), DPort: ntohs(k.Flow.Dport)},
			Bytes: v.Bytes, Packets: v.Packets, OffloadedPackets: v.OffloadedPackets, LastNs: v.LastNs,
		})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("ezpath: read flow registers: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key.String() < out[j].Key.String() })
	return out, nil
}

// ErrTableFull says a switch table has no room: the flow stays on the overlay.
var ErrTableFull = errors.New("ToR table full")

// isTableFull tells a full hash map (the switch's SRAM is used up) from other update errors.
func isTableFull(err error) bool { return errors.Is(err, unix.E2BIG) || errors.Is(err, unix.ENOSPC) }

// torEntry is one switch table entry a pair of containers needs.
type torEntry struct {
	ToR    int        // host index whose ToR holds it
	Decap  bool       // ezp_decap (else ezp_encap)
	Tenant int        // the pair's tenant: its VNI keys the entry, its VID tags the decapsulated frame
	Addr   netip.Addr // inner destination
}

// putEntry installs e in the ToR's tables; created tells whether it was new (so a failed offload
// removes only what it added). A full table returns ErrTableFull.
func putEntry(tt *torTables, p *rack, e torEntry) (created bool, err error) {
	var m *ebpf.Map
	var key, val any
	vni := p.vni(e.Tenant)
	if e.Decap {
		m = tt.EzpDecap
		key = torEzpDecapKey{Vtep: nbo(p.vtep(e.ToR)), Vni: vni, Dst: nbo(e.Addr)}
		val = torEzpDecapVal{Ifindex: uint32(p.downIfindex(e.ToR)), Vid: uint32(p.vid(e.Tenant))}
	} else {
		dst, ok := p.endpointAt(e.Tenant, e.Addr)
		if !ok {
			return false, fmt.Errorf("ezpath: tenant %d has no container %s", e.Tenant, e.Addr)
		}
		m = tt.EzpEncap
		key = torEzpEncapKey{Vni: vni, Dst: nbo(e.Addr)}
		val = torEzpEncapVal{RemoteVtep: nbo(p.remoteVTEP(dst)), Vni: vni}
	}
	err = m.Update(key, val, ebpf.UpdateNoExist)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, ebpf.ErrKeyExist):
		return false, m.Update(key, val, ebpf.UpdateExist)
	case isTableFull(err):
		return false, fmt.Errorf("%w (tor%d %s, %d entries)", ErrTableFull, e.ToR, tableName(e), m.MaxEntries())
	}
	return false, fmt.Errorf("ezpath: tor%d %s: %w", e.ToR, tableName(e), err)
}

func delEntry(tt *torTables, p *rack, e torEntry) error {
	var err error
	if e.Decap {
		err = tt.EzpDecap.Delete(torEzpDecapKey{Vtep: nbo(p.vtep(e.ToR)), Vni: p.vni(e.Tenant), Dst: nbo(e.Addr)})
	} else {
		err = tt.EzpEncap.Delete(torEzpEncapKey{Vni: p.vni(e.Tenant), Dst: nbo(e.Addr)})
	}
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil
	}
	return err
}

func tableName(e torEntry) string {
	if e.Decap {
		return "ezp_decap"
	}
	return "ezp_encap"
}

// torStats reads a switch's counters by name.
func torStats(tt *torTables) (map[string]uint64, error) {
	return namedCounters(tt.PrgEzpTstat, torStatNames[:])
}

// namedCounters reads a per-CPU counter array whose indexes have these names.
func namedCounters(m *ebpf.Map, names []string) (map[string]uint64, error) {
	s, err := sumPerCPU(m, len(names))
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for i, n := range names {
		out[n] = s[i]
	}
	return out, nil
}

// countEntries counts a hash map's entries (the switch's table occupancy).
func countEntries(m *ebpf.Map) int {
	n := 0
	var k, v []byte
	it := m.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	return n
}
