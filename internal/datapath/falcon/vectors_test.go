package falcon

import (
	"net/netip"
	"testing"
)

// Known vectors: decisions of bpf/falcon.bpf.c's port program (flow hash, kind, index and the
// hash written), recorded through BPF_PROG_TEST_RUN on 2026-11-28. TestVectorsModel checks the Go
// mirror (flow.Hash, Choose, RPSHash) against them without root, so a change to the mirror alone
// fails in every `go test`, not only in the root fuzz runs; TestVectorsMatchProgram checks the
// same table against the program (root), so the table cannot drift from the C either.
type vector struct {
	name string
	flow Flow
	cpus []int
	load map[int]uint32 // busy percent; the harness's threshold is 80
	two  bool           // two choices
	gate bool           // gate open
	fh   uint32         // prg_flow_hash
	kind uint32
	idx  uint32
	hash uint32 // what bpf_set_hash wrote (0: gate closed)
}

var vectors = []vector{
	{name: "ipv4 udp, 8 cpus", flow: Flow{Src: netip.MustParseAddr("198.19.2.1"), Dst: netip.MustParseAddr("198.19.1.2"), Sport: 10000, Dport: 5201, Proto: 17},
		cpus: []int{0, 1, 2, 3, 4, 5, 6, 7}, two: true, gate: true, fh: 0xf921f116, kind: KindFirst, idx: 7, hash: 0xf921f116},
	{name: "ipv4 tcp, 3 cpus", flow: Flow{Src: netip.MustParseAddr("10.244.1.7"), Dst: netip.MustParseAddr("10.244.2.9"), Sport: 43512, Dport: 80, Proto: 6},
		cpus: []int{0, 2, 5}, two: true, gate: true, fh: 0x80aea95d, kind: KindFirst, idx: 2, hash: 0xd603feb3},
	{name: "ipv6 udp, 4 cpus", flow: Flow{Src: netip.MustParseAddr("fd00::1"), Dst: netip.MustParseAddr("fd00:1::2"), Sport: 5353, Dport: 4000, Proto: 17},
		cpus: []int{1, 3, 5, 7}, two: true, gate: true, fh: 0x1c251f6d, kind: KindFirst, idx: 1, hash: 0x5c251f6d},
	{name: "ipv6 tcp, 1 cpu", flow: Flow{Src: netip.MustParseAddr("2001:db8::a"), Dst: netip.MustParseAddr("2001:db8::b"), Sport: 1, Dport: 65535, Proto: 6},
		cpus: []int{3}, two: true, gate: true, fh: 0xed6fb18c, kind: KindFirst, idx: 0, hash: 0xed6fb18c},
	{name: "first choice busy: second", flow: Flow{Src: netip.MustParseAddr("198.19.2.9"), Dst: netip.MustParseAddr("198.19.1.2"), Sport: 10008, Dport: 5201, Proto: 17},
		cpus: []int{0, 1, 2, 3, 4, 5, 6, 7}, load: busyAll(8), two: true, gate: true, fh: 0xa2a6cb3e, kind: KindSecond, idx: 5, hash: 0xa2a6cb3e},
	{name: "static ignores load", flow: Flow{Src: netip.MustParseAddr("198.19.2.9"), Dst: netip.MustParseAddr("198.19.1.2"), Sport: 10008, Dport: 5201, Proto: 17},
		cpus: []int{0, 1, 2, 3, 4, 5, 6, 7}, load: busyAll(8), two: false, gate: true, fh: 0xa2a6cb3e, kind: KindFirst, idx: 4, hash: 0x82a6cb3e},
	{name: "gate closed", flow: Flow{Src: netip.MustParseAddr("198.19.2.1"), Dst: netip.MustParseAddr("198.19.1.2"), Sport: 10000, Dport: 5201, Proto: 17},
		cpus: []int{0, 1}, two: true, gate: false, fh: 0xf921f116, kind: KindGate, idx: 0, hash: 0x0},
	{name: "sctp ports", flow: Flow{Src: netip.MustParseAddr("172.16.0.1"), Dst: netip.MustParseAddr("172.16.0.2"), Sport: 2905, Dport: 2905, Proto: 132},
		cpus: []int{0, 1, 2, 3, 4, 5}, two: true, gate: true, fh: 0xa27057bc, kind: KindFirst, idx: 5, hash: 0xf7c5ad14},
}

func busyAll(n int) map[int]uint32 {
	m := map[int]uint32{}
	for i := 0; i < n; i++ {
		m[i] = 95
	}
	return m
}

func TestVectorsModel(t *testing.T) {
	for _, v := range vectors {
		fh := v.flow.Hash()
		if fh != v.fh {
			t.Errorf("%s: flow hash %#x, the program's %#x", v.name, fh, v.fh)
		}
		d := Choose(Params{CPUs: v.cpus, Threshold: 80, TwoChoice: v.two, GateOpen: v.gate, Load: v.load}, v.fh, testSalt)
		cpu := -1
		if v.gate {
			cpu = v.cpus[v.idx]
		}
		if d.Kind != v.kind || d.Idx != v.idx || d.Hash != v.hash || d.CPU != cpu {
			t.Errorf("%s: model %s idx %d cpu %d hash %#x, the program's %s idx %d cpu %d hash %#x",
				v.name, KindName(d.Kind), d.Idx, d.CPU, d.Hash, KindName(v.kind), v.idx, cpu, v.hash)
		}
	}
}

func TestVectorsMatchProgram(t *testing.T) {
	for _, v := range vectors {
		h := newHarness(t, v.cpus, v.two, v.gate)
		for cpu, pct := range v.load {
			h.setLoad(cpu, pct)
		}
		got := h.run(h.o.PrgFalconPort, innerFrame(v.flow))
		idx := got.Idx
		if !v.gate {
			idx = 0 // not a choice: the program records the current CPU
		}
		if got.FlowHash != v.fh || got.Kind != v.kind || idx != v.idx || got.Hash != v.hash {
			t.Errorf("%s: the program says fh: %#x, kind: %d, idx: %d, hash: %#x; the table fh: %#x, kind: %d, idx: %d, hash: %#x",
				v.name, got.FlowHash, got.Kind, idx, got.Hash, v.fh, v.kind, v.idx, v.hash)
		}
	}
}
