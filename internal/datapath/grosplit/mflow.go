package grosplit

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"
)

// MFlow turns a split into MFLOW's IRQ split with elephant detection (bpf/mflow.h): a flow whose
// rate over the last window is at or above ElephantPPS packets/s or ElephantBPS bits/s is cut
// into micro-flows of Batch consecutive packets that rotate round-robin over the split CPUs;
// other flows (mice) pass to the normal path, or keep flow affinity with MiceAffine.
// Both thresholds 0 make every flow an elephant from its first packet.
type MFlow struct {
	Batch       int
	ElephantPPS uint64
	ElephantBPS uint64
	Window      time.Duration
	MiceAffine  bool
}

// Limits of MFlow.
const (
	MaxMFlowBatch = 1 << 16 // larger than any flow's packets in flight: the split would never rotate
	MinWindow     = time.Millisecond
	MaxWindow     = 10 * time.Second
)

func (m *MFlow) check(batch int) error {
	if m == nil {
		return nil
	}
	if batch != 0 {
		return errors.New("grosplit: Batch and MFlow are exclusive (MFlow has its own batch size)")
	}
	if m.Batch < 1 || m.Batch > MaxMFlowBatch {
		return fmt.Errorf("grosplit: micro-flow batch %d out of range 1..%d", m.Batch, MaxMFlowBatch)
	}
	if m.Window < MinWindow || m.Window > MaxWindow {
		return fmt.Errorf("grosplit: elephant window %v out of range %v..%v", m.Window, MinWindow, MaxWindow)
	}
	return nil
}

func (m *MFlow) fill(v *gsGsCfg) {
	if m == nil {
		return
	}
	v.Mflow = 1
	if m.MiceAffine {
		v.MiceAffine = 1
	}
	v.Mf.Batch = uint32(m.Batch)
	v.Mf.ElephPps = m.ElephantPPS
	v.Mf.ElephBps = m.ElephantBPS
	v.Mf.WindowNs = uint64(m.Window.Nanoseconds())
}

// mflowOf reads the MFLOW settings back from a live config (nil when off).
func mflowOf(v gsGsCfg) *MFlow {
	if v.Mflow == 0 {
		return nil
	}
	return &MFlow{Batch: int(v.Mf.Batch), ElephantPPS: v.Mf.ElephPps, ElephantBPS: v.Mf.ElephBps,
		Window: time.Duration(v.Mf.WindowNs), MiceAffine: v.MiceAffine != 0}
}

// FlowState is one flow the MFLOW split has seen (its inner 5-tuple for VXLAN frames).
type FlowState struct {
	Src, Dst     netip.Addr
	Sport, Dport uint16
	Proto        uint8
	Elephant     bool
	RatePPS      uint64 // last full window
	RateBPS      uint64
	Packets      uint64 // every packet seen
	Bytes        uint64
	Split        uint64 // packets numbered into micro-flows
	Batches      uint64
	Promotions   uint32
	Demotions    uint32
	// Reorder guard: out-of-order TCP segments seen at the merge point, holds, and until when
	// (CLOCK_MONOTONIC coarse) the flow is held on one path.
	OutOfOrder  uint32
	Holds       uint32
	HoldUntil   time.Duration
	LastSlot    int
	First, Last time.Duration // CLOCK_MONOTONIC of the first and last packet
}

// ReadFlows lists the flows of the MFLOW split pinned under pinDir (LRU: idle flows age out).
func ReadFlows(pinDir string) ([]FlowState, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, gsMapPrgGsMflows), nil)
	if err != nil {
		return nil, fmt.Errorf("grosplit: open flow states of %s (is an MFLOW split attached there?): %w", pinDir, err)
	}
	defer m.Close()
	var out []FlowState
	var k gsPrgFlow
	var v gsMfFlowState
	it := m.Iterate()
	for it.Next(&k, &v) {
		out = append(out, flowState(k, v))
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("grosplit: read flow states: %w", err)
	}
	return out, nil
}

func flowState(k gsPrgFlow, v gsMfFlowState) FlowState {
	return NewFlowState(k.Saddr, k.Daddr, k.Sport, k.Dport, k.Proto, RawFlow{FirstNs: v.FirstNs, LastNs: v.LastNs,
		RatePps: v.RatePps, RateBps: v.RateBps, Pkts: v.Pkts, Bytes: v.Bytes, Seq: v.Seq, Batches: v.Batches,
		Elephant: v.Elephant, LastSlot: v.LastSlot, Promotions: v.Promotions, Demotions: v.Demotions,
		HoldUntil: v.HoldUntil, OooTotal: v.OooTotal, Holds: v.Holds})
}

// RawFlow is the value of a flow map (struct mf_flow_state of bpf/mflow.h), for other packages
// that load programs sharing that layout (mflow's skb-level split).
type RawFlow struct {
	FirstNs, LastNs, RatePps, RateBps, Pkts, Bytes, Seq, Batches uint64
	Elephant, LastSlot, Promotions, Demotions                    uint32
	HoldUntil                                                    uint64
	OooTotal, Holds                                              uint32
}

// NewFlowState decodes a flow key (struct prg_flow of bpf/parse.h: words and ports as loaded from
// the packet) and state.
func NewFlowState(src, dst [4]uint32, sport, dport uint16, proto uint8, v RawFlow) FlowState {
	f := FlowState{Src: addrOf(src), Dst: addrOf(dst), Proto: proto, Sport: portOf(sport), Dport: portOf(dport),
		Elephant: v.Elephant != 0, RatePPS: v.RatePps, RateBPS: v.RateBps, Packets: v.Pkts, Bytes: v.Bytes,
		Split: v.Seq, Batches: v.Batches, Promotions: v.Promotions, Demotions: v.Demotions,
		OutOfOrder: v.OooTotal, Holds: v.Holds, HoldUntil: time.Duration(v.HoldUntil),
		LastSlot: int(v.LastSlot), First: time.Duration(v.FirstNs), Last: time.Duration(v.LastNs)}
	if isV6(src, dst) {
		f.Src, f.Dst = addr6Of(src), addr6Of(dst)
	}
	return f
}

// The key holds packet bytes loaded as native (little-endian) words.
func isV6(a, b [4]uint32) bool { return a[1]|a[2]|a[3]|b[1]|b[2]|b[3] != 0 }

func addrOf(w [4]uint32) netip.Addr {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], w[0])
	return netip.AddrFrom4(b)
}

func addr6Of(w [4]uint32) netip.Addr {
	var b [16]byte
	for i, x := range w {
		binary.LittleEndian.PutUint32(b[i*4:], x)
	}
	return netip.AddrFrom16(b)
}

// portOf turns a network-order half loaded little-endian into the port number.
func portOf(p uint16) uint16 { return p>>8 | p<<8 }
