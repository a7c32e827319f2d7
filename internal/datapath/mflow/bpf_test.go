package mflow

import (
	"encoding/binary"
	"math/bits"
	"net/netip"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath/flow"
	"github.com/peregrine-net/peregrine/internal/testutil"
	"github.com/peregrine-net/peregrine/internal/testutil/frames"

	"github.com/cilium/ebpf"
)

// Unit tests of the skb-level programs with BPF_PROG_TEST_RUN: device-scaling batches (a GRO
// super-packet counts its segments and is never cut), the hash RPS maps to the batch's CPU,
// mice untouched, and the merge program's one CPU per split flow.

func loadTest(t *testing.T) *mfObjects {
	t.Helper()
	o := testutil.LoadObjects(t, func() (*mfObjects, error) { return loadObjects(nil) })
	return o
}

// Frame builders (internal/testutil/frames).
func eth(proto uint16) []byte { return frames.Eth(proto, nil) }

func ip4(src, dst string, proto byte, payload []byte) []byte {
	return frames.IPv4{Src: frames.Addr(src), Dst: frames.Addr(dst), Proto: proto}.Wrap(payload)
}

func innerTCP(sport uint16) []byte {
	return append(eth(0x0800), ip4("198.19.0.2", "198.19.0.3", 6, frames.TCP(sport, 5201, make([]byte, 64)))...)
}

func vxlanFrame(inner []byte) []byte { return frames.Encap(51000, 4789, 42, inner) }

// keyOf is the flow key the programs build for innerTCP(sport).
func keyOf(sport uint16) mfPrgFlow {
	return mfPrgFlow{Saddr: flow.AddrWords(netip.MustParseAddr("198.19.0.2")),
		Daddr: flow.AddrWords(netip.MustParseAddr("198.19.0.3")),
		Sport: bits.ReverseBytes16(sport), Dport: bits.ReverseBytes16(5201), Proto: 6}
}

func configure(t *testing.T, o *mfObjects, c Config) {
	t.Helper()
	if err := writeConfig(o.PrgMfCfg, c, []uint16{4789}); err != nil {
		t.Fatal(err)
	}
}

type runResult struct {
	slot       int
	hash       uint32
	split      uint64
	mice       uint64
	batches    uint64
	merged     uint64
	hashedSlot bool // the run wrote a hash (last_hash changed)
}

// sumStats adds up the CPUs' counters (the last hash is any CPU's that wrote one); per is
// reused across calls by the fuzz loop.
func sumStats(t testing.TB, o *mfObjects, per *[]mfMfStats) mfMfStats {
	t.Helper()
	if err := o.PrgMfStats.Lookup(uint32(0), per); err != nil {
		t.Fatal(err)
	}
	var s mfMfStats
	for _, v := range *per {
		s.Split += v.Split
		s.Mice += v.Mice
		s.Passed += v.Passed
		s.Batches += v.Batches
		s.Merged += v.Merged
		if v.LastHash != 0 {
			s.LastHash, s.LastSlot = v.LastHash, v.LastSlot
		}
	}
	return s
}

func run(t *testing.T, o *mfObjects, prog *ebpf.Program, frame []byte, segs uint32) runResult {
	t.Helper()
	// Zero last_hash first, so a run that writes none is visible.
	var per []mfMfStats
	if err := o.PrgMfStats.Lookup(uint32(0), &per); err != nil {
		t.Fatal(err)
	}
	for i := range per {
		per[i].LastHash = 0
	}
	if err := o.PrgMfStats.Update(uint32(0), per, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	before := sumStats(t, o, &per)
	ctx := make([]byte, 192) // struct __sk_buff; gso_segs is at offset 164
	binary.LittleEndian.PutUint32(ctx[164:], segs)
	ret, err := prog.Run(&ebpf.RunOptions{Data: frame, Context: ctx})
	if err != nil {
		t.Fatalf("test run: %v", err)
	}
	if int32(ret) != -1 {
		t.Fatalf("program returned %d, want TCX_NEXT (-1): it must never drop or redirect", int32(ret))
	}
	after := sumStats(t, o, &per)
	return runResult{slot: int(after.LastSlot), hash: uint32(after.LastHash), split: after.Split - before.Split,
		mice: after.Mice - before.Mice, batches: after.Batches - before.Batches, merged: after.Merged - before.Merged,
		hashedSlot: after.LastHash != 0}
}

// rpsSlot is what get_rps_cpu picks from an n-CPU map for a hash.
func rpsSlot(h uint32, n int) int { return int(uint64(h) * uint64(n) >> 32) }

func TestDeviceSplitCountsSegments(t *testing.T) {
	o := loadTest(t)
	const n, batch = 2, 8
	configure(t, o, Config{CPUs: []int{0, 1}, Batch: batch, Window: time.Second})
	frame := vxlanFrame(innerTCP(40000))
	// Super-packets of 3 segments: packets 0-2, 3-5, 6-8 (crosses into batch 1: opens it, but
	// stays on batch 0's slot: a super-packet is never cut), 9-11, 12-14, 15-17 (opens batch 2).
	var slots []int
	var opened []uint64
	for i := 0; i < 6; i++ {
		r := run(t, o, o.PrgMflowDev, frame, 3)
		if r.split != 3 || !r.hashedSlot {
			t.Fatalf("super-packet %d: split %d (want 3 segments), hashed %v", i, r.split, r.hashedSlot)
		}
		if got := rpsSlot(r.hash, n); got != r.slot {
			t.Errorf("super-packet %d: hash %#x lands on RPS slot %d, the program meant %d", i, r.hash, got, r.slot)
		}
		slots = append(slots, r.slot)
		opened = append(opened, r.batches)
	}
	base := slots[0]
	want := []int{base, base, base, (base + 1) % n, (base + 1) % n, (base + 1) % n}
	wantOpen := []uint64{1, 0, 1, 0, 0, 1}
	for i := range want {
		if slots[i] != want[i] || opened[i] != wantOpen[i] {
			t.Errorf("super-packet %d: slot %d opens %d, want slot %d opens %d (slots %v)", i, slots[i], opened[i], want[i], wantOpen[i], slots)
		}
	}
	// Not VXLAN: untouched.
	plain := append(eth(0x0800), ip4("198.18.0.1", "198.18.0.2", 17, frames.UDP(1, 2, nil))...)
	if r := run(t, o, o.PrgMflowDev, plain, 1); r.split != 0 || r.mice != 0 || r.hashedSlot {
		t.Errorf("a non-VXLAN frame was touched: %+v", r)
	}
	// VXLAN port but no I flag (no valid VNI): not VXLAN either (bpf/vxlan.h).
	noI := vxlanFrame(innerTCP(40000))
	noI[14+20+8] = 0
	if r := run(t, o, o.PrgMflowDev, noI, 1); r.split != 0 || r.mice != 0 || r.hashedSlot {
		t.Errorf("a VXLAN header without the I flag was split: %+v", r)
	}
}

func TestDeviceSplitMiceUntouched(t *testing.T) {
	o := loadTest(t)
	configure(t, o, Config{CPUs: []int{0, 1}, Batch: 8, ElephantPPS: 1e9, Window: time.Millisecond})
	frame := vxlanFrame(innerTCP(40000))
	for i := 0; i < 10; i++ {
		r := run(t, o, o.PrgMflowDev, frame, 1)
		if r.mice != 1 || r.split != 0 || r.batches != 0 || r.hashedSlot {
			t.Fatalf("mouse packet %d: %+v, want counted as a mouse and no batch hash", i, r)
		}
	}
}

func TestMergeOneCPUPerSplitFlow(t *testing.T) {
	o := loadTest(t)
	c := Config{CPUs: []int{0, 1}, Batch: 8, Window: time.Second, Merge: true}
	configure(t, o, c)
	// An elephant (as the split point records it) and a mouse.
	if err := o.PrgMfFlows.Put(keyOf(40000), mfMfFlowState{Elephant: 1}); err != nil {
		t.Fatal(err)
	}
	if err := o.PrgMfFlows.Put(keyOf(40001), mfMfFlowState{Elephant: 0}); err != nil {
		t.Fatal(err)
	}
	first := -1
	for i := 0; i < 10; i++ {
		r := run(t, o, o.PrgMflowPort, innerTCP(40000), 2)
		if r.merged != 2 || !r.hashedSlot {
			t.Fatalf("elephant packet %d at the bridge port: %+v, want merged (2 segments)", i, r)
		}
		slot := rpsSlot(r.hash, len(c.CPUs))
		if first == -1 {
			first = slot
		}
		if slot != first {
			t.Errorf("elephant packet %d merged onto slot %d, earlier ones onto %d: merge must pick ONE CPU", i, slot, first)
		}
	}
	if r := run(t, o, o.PrgMflowPort, innerTCP(40001), 1); r.merged != 0 || r.hashedSlot {
		t.Errorf("a mouse was merged: %+v", r)
	}
	c.Merge = false
	configure(t, o, c)
	if r := run(t, o, o.PrgMflowPort, innerTCP(40000), 1); r.merged != 0 || r.hashedSlot {
		t.Errorf("merge off, yet the port program touched the flow: %+v", r)
	}
}

// innerTCPSeq is innerTCP(sport) with sequence number seq and a 100-byte payload.
func innerTCPSeq(sport uint16, seq uint32) []byte {
	seg := frames.TCP(sport, 5201, make([]byte, 100))
	binary.BigEndian.PutUint32(seg[4:], seq)
	return append(eth(0x0800), ip4("198.19.0.2", "198.19.0.3", 6, seg)...)
}

func flowState(t *testing.T, o *mfObjects, sport uint16) mfMfFlowState {
	t.Helper()
	var s mfMfFlowState
	if err := o.PrgMfFlows.Lookup(keyOf(sport), &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestReorderGuard: at the merge point, in-order segments of a split flow leave it split;
// guard_ooo out-of-order ones within a window put it on hold, and the device split then takes
// it as a mouse (hash 0, no batch) until the hold ends. A mouse's disorder is not counted.
func TestReorderGuard(t *testing.T) {
	o := loadTest(t)
	const guard = 3
	configure(t, o, Config{CPUs: []int{0, 1}, Batch: 4, Window: time.Hour, Guard: guard, GuardHold: time.Hour})
	const sp = 41000
	if r := run(t, o, o.PrgMflowDev, vxlanFrame(innerTCP(sp)), 1); r.split != 1 {
		t.Fatalf("thresholds off: the first packet must be split: %+v", r)
	}
	seq := uint32(1000)
	for i := 0; i < 10; i++ { // in order: no hold
		run(t, o, o.PrgMflowPort, innerTCPSeq(sp, seq), 1)
		seq += 100
	}
	if s := flowState(t, o, sp); s.OooTotal != 0 || s.Holds != 0 || s.TopSeq != seq {
		t.Fatalf("in-order segments: %+v, want no out-of-order, top %d", s, seq)
	}
	// A pure ACK (no payload) with an old sequence number is no disorder.
	ack := append(eth(0x0800), ip4("198.19.0.2", "198.19.0.3", 6, frames.TCP(sp, 5201, nil))...)
	run(t, o, o.PrgMflowPort, ack, 1)
	for i := 1; i <= guard; i++ { // segments from a batch that landed late
		run(t, o, o.PrgMflowPort, innerTCPSeq(sp, seq-uint32(400-100*i)), 1)
		s := flowState(t, o, sp)
		if s.OooTotal != uint32(i) {
			t.Fatalf("late segment %d: out of order %d, want %d", i, s.OooTotal, i)
		}
		if held := s.Holds == 1 && s.HoldUntil > 0; held != (i == guard) {
			t.Fatalf("after %d late segments (guard %d): holds %d until %d", i, guard, s.Holds, s.HoldUntil)
		}
	}
	var st []mfMfStats
	if err := o.PrgMfStats.Lookup(uint32(0), &st); err != nil {
		t.Fatal(err)
	}
	var holds uint64
	for _, v := range st {
		holds += v.Holds
	}
	if holds != 1 {
		t.Errorf("stats count %d holds, want 1", holds)
	}
	// Held: the device split leaves the flow on one path.
	if r := run(t, o, o.PrgMflowDev, vxlanFrame(innerTCP(sp)), 1); r.split != 0 || r.mice != 1 {
		t.Errorf("held flow was split: %+v", r)
	}
	// While held, disorder is not counted (the flow is on one path).
	run(t, o, o.PrgMflowPort, innerTCPSeq(sp, 5), 1)
	if s := flowState(t, o, sp); s.OooTotal != guard {
		t.Errorf("held flow's disorder counted: %d, want %d", s.OooTotal, guard)
	}

	// Guard off: the port program watches nothing when it does not merge either.
	o2 := loadTest(t)
	configure(t, o2, Config{CPUs: []int{0, 1}, Batch: 4, Window: time.Hour})
	run(t, o2, o2.PrgMflowDev, vxlanFrame(innerTCP(sp)), 1)
	for _, q := range []uint32{5000, 1000, 900, 800, 700} {
		run(t, o2, o2.PrgMflowPort, innerTCPSeq(sp, q), 1)
	}
	if s := flowState(t, o2, sp); s.OooTotal != 0 || s.Holds != 0 {
		t.Errorf("guard off but the flow was watched: %+v", s)
	}
}
