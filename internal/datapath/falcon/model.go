package falcon

import (
	"net/netip"

	"github.com/peregrine-net/peregrine/internal/datapath/flow"

	"github.com/peregrine-net/peregrine/internal/datapath"
)

// This file mirrors bpf/falcon.bpf.c's arithmetic in pure Go, so the choice of CPU can be
// reasoned about (and tested against the program through BPF_PROG_TEST_RUN) without a kernel.

// Kinds of decision, as the program records them (enum falcon_kind).
const (
	KindPass   = 0 // not an IP flow we understand: the packet is untouched
	KindGate   = 1 // gate closed: hash 0, the stage stays on the current CPU
	KindFirst  = 2 // first choice
	KindSecond = 3 // first choice busy: second choice, kept even if busy
	KindSticky = 4 // the flow's earlier choice for this stage
)

// Stage ids of the program (STAGE_*): which transition a program decides.
const (
	StageIDVXLAN = 0 // decided at the underlay's ingress, applied by the VXLAN device's RPS
	StageIDVeth  = 1 // decided at a bridge port's egress, applied by the container veth's RPS
)

// Limits shared with the C side.
const (
	MaxCPUs  = 64   // entries of the FALCON CPU set
	MaxCPUID = 1024 // size of the load map (CPU ids)
	stages   = 4
	slots    = 72
)

// KindName names a decision kind for people.
func KindName(k uint32) string {
	switch k {
	case KindPass:
		return "pass"
	case KindGate:
		return "gate-closed"
	case KindFirst:
		return "first"
	case KindSecond:
		return "second"
	case KindSticky:
		return "sticky"
	}
	return "?"
}

// Fmix32 is murmur3's finaliser, the program's hash step (flow.Fmix32).
func Fmix32(h uint32) uint32 { return flow.Fmix32(h) }

// Flow is an inner 5-tuple as the program reads it: addresses as the 32-bit words it loads from
// the packet (network byte order in memory, read as little-endian words on this machine), ports
// in host order.
type Flow struct {
	Src, Dst     netip.Addr
	Sport, Dport uint16
	Proto        uint8
}

// Hash is prg_flow_hash (bpf/parse.h): the flow's hash before any stage salt.
func (f Flow) Hash() uint32 { return flow.Hash(f.Src, f.Dst, f.Sport, f.Dport, f.Proto) }

// DeviceSalt is the namespace-unique salt of a device: ifindex repeats across namespaces (Docker's
// vxlan0 and a container's eth0 can share one), so the namespace inode goes in too.
func DeviceSalt(netnsInode uint64, ifindex int) uint32 {
	s := Fmix32(uint32(netnsInode) ^ 0x5bd1e995)
	s = Fmix32(s ^ uint32(netnsInode>>32))
	return Fmix32(s ^ uint32(ifindex))
}

// VNISalt is the VXLAN stage's salt as the underlay program forms it: the underlay sees only the
// VNI, which tells VXLAN devices that share the underlay apart.
func VNISalt(devSalt uint32, vni uint32) uint32 { return Fmix32(devSalt ^ vni) }

// ReciprocalScale is the kernel's reciprocal_scale(): how RPS turns a hash into a map index.
func ReciprocalScale(hash uint32, n uint32) uint32 { return datapath.ReciprocalScale(hash, n) }

// RPSHash is rps_hash(): a non-zero hash that RPS maps to index idx of an n-CPU map (shared with
// prism's HP isolation: datapath.RPSHash, bpf/rps.h).
func RPSHash(idx, n, flowHash uint32) uint32 { return datapath.RPSHash(idx, n, flowHash) }

// Params are the settings a decision depends on.
type Params struct {
	CPUs      []int // the FALCON set, ascending
	Threshold uint32
	TwoChoice bool
	GateOpen  bool
	Load      map[int]uint32 // busy percent per CPU id; missing = 0
}

// Decision is what the program does with one packet at one stage transition.
type Decision struct {
	Kind uint32
	Idx  uint32 // index into CPUs
	CPU  int    // -1 when the gate is closed (the current CPU)
	Hash uint32 // the hash written (0 when the gate is closed)
}

// Choose is Algorithm 1 for a packet of flow hash fh entering the stage salted with salt, when no
// earlier choice of the flow is remembered (the program's sticky map is a cache of this result).
func Choose(p Params, fh, salt uint32) Decision {
	if !p.GateOpen {
		return Decision{Kind: KindGate, CPU: -1}
	}
	n := uint32(len(p.CPUs))
	h := Fmix32(fh + salt)
	idx, kind := h%n, uint32(KindFirst)
	if p.TwoChoice && p.Load[p.CPUs[idx]] >= p.Threshold {
		idx, kind = Fmix32(h)%n, KindSecond
	}
	return Decision{Kind: kind, Idx: idx, CPU: p.CPUs[idx], Hash: RPSHash(idx, n, fh)}
}
