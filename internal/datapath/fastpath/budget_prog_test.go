package fastpath

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// The hand-over tags (skb->tc_index) of bpf/fastpath.h.
const (
	tagLearn = 0xfa57 // PRG_TC_INDEX_LEARN: rx handed the frame over, its flow has an entry
	tagOut   = 0xfa58 // FP_TC_INDEX_OUT: tx handed it over, its flow has an entry
	tagNoOut = 0xfa5b // FP_TC_INDEX_NOOUT: tx handed it over, its flow has none (budget, full)
	tagNoIn  = 0xfa5c // FP_TC_INDEX_NOIN: rx handed it over, its flow has none
)

// tcProgs are the programs of the tests' object (bpf/fastpath_tctest.bpf.c) that run with their
// hand-over tag in cb[0], over progEnv's maps.
type tcProgs struct {
	Tx    *ebpf.Program `ebpf:"prg_fastpath_tx_t"`
	Rx    *ebpf.Program `ebpf:"prg_fastpath_rx_t"`
	LrnTx *ebpf.Program `ebpf:"prg_fastpath_lrn_tx_t"`
	LrnRx *ebpf.Program `ebpf:"prg_fastpath_lrn_rx_t"`
}

func (e *progEnv) tagProgs(t *testing.T) *tcProgs {
	t.Helper()
	spec, err := loadFptc()
	if err != nil {
		t.Fatal(err)
	}
	keepFlowSizes(spec, &e.o.fpMaps)
	repl := map[string]*ebpf.Map{}
	for name, mp := range mapsOf(&e.o.fpMaps) {
		repl[name] = *mp
	}
	var p tcProgs
	if err := spec.LoadAndAssign(&p, &ebpf.CollectionOptions{MapReplacements: repl}); err != nil {
		t.Fatalf("load the tagged test programs: %v", err)
	}
	t.Cleanup(func() {
		for _, q := range []*ebpf.Program{p.Tx, p.Rx, p.LrnTx, p.LrnRx} {
			q.Close()
		}
	})
	return &p
}

// runTag runs one of the tagged test programs (bpf/fastpath.bpf.c) with skb->tc_index = tag and
// returns the verdict and the tc_index the program left (both travel in cb[0]).
func (e *progEnv) runTag(t *testing.T, p *ebpf.Program, pkt []byte, tag uint32) (uint32, uint32) {
	t.Helper()
	ctx, ctxOut := make([]byte, 192), make([]byte, 192) // struct __sk_buff; cb[0] at 48
	binary.LittleEndian.PutUint32(ctx[48:], tag)
	opts := &ebpf.RunOptions{Data: pkt, DataOut: make([]byte, len(pkt)+128), Context: ctx, ContextOut: ctxOut}
	ret, err := p.Run(opts)
	if err != nil {
		t.Fatalf("test run: %v", err)
	}
	return ret, binary.LittleEndian.Uint32(ctxOut[48:])
}

func (e *progEnv) setBudget(t *testing.T, n uint32) {
	t.Helper()
	e.cfg.Budget = n
	if err := e.o.PrgFastpathCfg.Put(uint32(0), e.cfg); err != nil {
		t.Fatal(err)
	}
}

// budgetFrames are the frames of flow pod A:lport <-> pod B:5201 at each program: leaving pod A
// (tx), on the wire as flannel.1 encapsulated it (the underlay's egress learner), arriving from
// node B (rx) and delivered to pod A by the normal path (the veth's egress learner).
type budgetFrames struct{ sent, wire, arriving, delivered []byte }

func framesOf(lport uint16) budgetFrames {
	sent := podFrame()
	sent.sport = lport
	fwd := sent
	fwd.dst, fwd.src, fwd.ttl = macVxB, macVxA, 63
	wire := frame{dst: macNicB, src: macNicA, saddr: vtepA, daddr: vtepB, proto: 17, sport: 45678, dport: 8472,
		payload: append([]byte{8, 0, 0, 0, 0, 0, 1, 0}, fwd.bytes()...)}.bytes()
	binary.BigEndian.PutUint16(wire[40:], 0)
	lo := net.HardwareAddr{0, 0, 0, 0, 0, 0} // test runs deliver on lo: frames to its MAC are PACKET_HOST
	reply := frame{dst: macVxA, src: macVxB, saddr: podB, daddr: podA, proto: 6, sport: 5201, dport: lport, tcpFlags: 0x10,
		payload: make([]byte, 64)}
	arriving := frame{dst: lo, src: macNicB, saddr: vtepB, daddr: vtepA, proto: 17, sport: 40001, dport: 8472,
		payload: append([]byte{8, 0, 0, 0, 0, 0, 1, 0}, reply.bytes()...)}.bytes()
	del := reply
	del.dst, del.src, del.ttl = macPod, macBridge, 63
	return budgetFrames{sent.bytes(), wire, arriving, del.bytes()}
}

// A flow over its pod's budget is handed to the normal path tagged "no entry" both ways, and the
// learners then look nothing up: even an entry that appeared meanwhile (another CPU's) is not
// learned from such a frame, while the same frame tagged as usual is. A flow within the budget is
// tagged as before and learned.
func TestOverBudgetSkipsLearners(t *testing.T) {
	e := newProgEnv(t)
	tp := e.tagProgs(t)
	e.putPod(t, podA, macPod, 100) // the sender, listed on its veth (src_refused)
	e.setBudget(t, 1)
	in, over := framesOf(40000), framesOf(40001)
	kIn, kOver := keyOf(podA, podB, 40000, 5201, 6), keyOf(podA, podB, 40001, 5201, 6)

	if ret, tag := e.runTag(t, tp.Tx, in.sent, 0); ret != tcxNext || tag != tagOut {
		t.Fatalf("tx, flow within the budget: verdict %d tag %#x, want the normal path tagged %#x", int32(ret), tag, tagOut)
	}
	if ret, tag := e.runTag(t, tp.Tx, over.sent, 0); ret != tcxNext || tag != tagNoOut {
		t.Fatalf("tx, flow over the budget: verdict %d tag %#x, want the normal path tagged %#x", int32(ret), tag, tagNoOut)
	}
	if b, err := e.o.PrgFastpathFlow.LookupBytes(kOver); err != nil || b != nil {
		t.Fatalf("a flow over the budget got an entry (%v)", err)
	}
	if ret, tag := e.runTag(t, tp.Rx, in.arriving, 0); ret != tcxNext || tag != tagLearn {
		t.Fatalf("rx, flow within the budget: verdict %d tag %#x, want the normal path tagged %#x", int32(ret), tag, tagLearn)
	}
	if ret, tag := e.runTag(t, tp.Rx, over.arriving, 0); ret != tcxNext || tag != tagNoIn {
		t.Fatalf("rx, flow over the budget: verdict %d tag %#x, want the normal path tagged %#x", int32(ret), tag, tagNoIn)
	}
	out, rin := e.counters(t)
	if out["budget"] != 1 || rin["budget"] != 1 {
		t.Fatalf("counters %v / %v: want one budget refusal each way", out, rin)
	}

	// The flow within the budget is learned both ways from frames tagged as usual.
	if _, tag := e.runTag(t, tp.LrnTx, in.wire, tagOut); tag != 0 {
		t.Fatalf("egress learner left tag %#x, want it given back", tag)
	}
	if _, tag := e.runTag(t, tp.LrnRx, in.delivered, tagLearn); tag != 0 {
		t.Fatalf("receive learner left tag %#x, want it given back", tag)
	}
	if f := e.flow(t, kIn); f.Flags&(fOut|fIn) != fOut|fIn || f.OutTtlDec != 1 || f.InTtlDec != 1 {
		t.Fatalf("flow within the budget: flags %#x ttl dec %d/%d, want learned both ways", f.Flags, f.OutTtlDec, f.InTtlDec)
	}

	// An entry for the refused flow appears (another CPU's insert, after the budget was freed)
	// with both directions waiting for a learner: the "no entry" tags still skip it...
	pending := fpFpFlow{OutTtlSeen: 64, InTtlSeen: 64, OutIfindex: 1, Gen: e.cfg.Gen, SeenNs: monoNs()}
	if err := e.o.PrgFastpathFlow.Put(kOver, pending); err != nil {
		t.Fatal(err)
	}
	if _, tag := e.runTag(t, tp.LrnTx, over.wire, tagNoOut); tag != 0 {
		t.Fatalf("egress learner left tag %#x, want it given back", tag)
	}
	if _, tag := e.runTag(t, tp.LrnRx, over.delivered, tagNoIn); tag != 0 {
		t.Fatalf("receive learner left tag %#x, want it given back", tag)
	}
	if f := e.flow(t, kOver); f.Flags&(fOut|fIn) != 0 || f.OutTtlSeen != 64 || f.InTtlSeen != 64 {
		t.Fatalf("learned from frames tagged without an entry: flags %#x", f.Flags)
	}
	// ...and the same frames without them are learned (what the tags skipped was a lookup).
	e.runTag(t, tp.LrnTx, over.wire, 0)
	e.runTag(t, tp.LrnRx, over.delivered, 0)
	if f := e.flow(t, kOver); f.Flags&(fOut|fIn) != fOut|fIn {
		t.Fatalf("untagged frames: flags %#x, want learned both ways", f.Flags)
	}
}

// A pod at its budget gets an entry for a new flow as soon as the sweep frees one of its old
// ones: nothing remembers the refusal.
func TestBudgetFreedLearnsAgain(t *testing.T) {
	e := newProgEnv(t)
	tp := e.tagProgs(t)
	e.putPod(t, podA, macPod, 100) // the sender, listed on its veth (src_refused)
	e.setBudget(t, 1)
	old, next := framesOf(40000), framesOf(40001)
	kOld, kNext := keyOf(podA, podB, 40000, 5201, 6), keyOf(podA, podB, 40001, 5201, 6)
	if _, tag := e.runTag(t, tp.Tx, old.sent, 0); tag != tagOut {
		t.Fatalf("first flow: tag %#x", tag)
	}
	if _, tag := e.runTag(t, tp.Tx, next.sent, 0); tag != tagNoOut {
		t.Fatalf("second flow at the budget: tag %#x, want %#x", tag, tagNoOut)
	}
	// The first connection closed long ago: the sweep (armed by its insert) takes it within 1 s.
	f := e.flow(t, kOld)
	f.Flags |= fClosing
	f.SeenNs = 1
	if err := e.o.PrgFastpathFlow.Put(kOld, f); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(4 * time.Second)
	for {
		var n uint32
		if err := e.o.PrgFastpathPcnt.Lookup(uint64(word(podA)), &n); err == nil && n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod A's counter still %d 4 s after its flow closed", n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if ret, tag := e.runTag(t, tp.Tx, next.sent, 0); ret != tcxNext || tag != tagOut {
		t.Fatalf("second flow after the budget freed: verdict %d tag %#x, want tagged %#x", int32(ret), tag, tagOut)
	}
	if g := e.flow(t, kNext); g.Flags&fCounted == 0 || g.OutTtlSeen != 64 {
		t.Fatalf("second flow's entry: %+v, want a counted entry waiting for the learner", g)
	}
	e.runTag(t, tp.LrnTx, next.wire, tagOut)
	if g := e.flow(t, kNext); g.Flags&fOut == 0 {
		t.Fatalf("second flow not learned after the budget freed: flags %#x", g.Flags)
	}
}

// A pod flooding new flows beyond its budget changes nothing for another pod: the other pod's
// new flows get entries and tags as usual, its learned flows and the flooder's own flows within
// the budget stay on the fast path.
func TestFloodingPodLeavesOthersAlone(t *testing.T) {
	e := newProgEnv(t)
	tp := e.tagProgs(t)
	e.putPod(t, podA, macPod, 100) // the sender, listed on its veth (src_refused)
	e.setBudget(t, 2)
	for i := range 50 {
		f := framesOf(uint16(41000 + i))
		want := uint32(tagNoOut)
		if i < 2 {
			want = tagOut
		}
		if _, tag := e.runTag(t, tp.Tx, f.sent, 0); tag != want {
			t.Fatalf("flooder's flow %d: tag %#x, want %#x", i, tag, want)
		}
	}
	podC := netip.MustParseAddr("198.19.1.3")
	e.putPod(t, podC, macPo2, 101)
	cNew := podFrame()
	cNew.saddr = podC
	if ret, tag := e.runTag(t, tp.Tx, cNew.bytes(), 0); ret != tcxNext || tag != tagOut {
		t.Fatalf("other pod's new flow: verdict %d tag %#x, want the normal path tagged %#x", int32(ret), tag, tagOut)
	}
	if f := e.flow(t, keyOf(podC, podB, 40000, 5201, 6)); f.Flags&fCounted == 0 {
		t.Fatalf("other pod's new flow: %+v, want a counted entry", f)
	}
	cLearned := podFrame()
	cLearned.saddr, cLearned.sport = podC, 40001
	e.learn(t, keyOf(podC, podB, 40001, 5201, 6), 1)
	if ret, tag := e.runTag(t, tp.Tx, cLearned.bytes(), 0); ret != tcActRedirect || tag != 0 {
		t.Fatalf("other pod's learned flow: verdict %d tag %#x, want the fast path", int32(ret), tag)
	}
	// The flooder's own flow within its budget, once learned, is fast too.
	e.learn2(t, keyOf(podA, podB, 41000, 5201, 6))
	if ret, _ := e.runTag(t, tp.Tx, framesOf(41000).sent, 0); ret != tcActRedirect {
		t.Fatalf("flooder's flow within the budget: verdict %d, want the fast path", int32(ret))
	}
	out, _ := e.counters(t)
	if out["budget"] != 48 || out["hit"] != 2 {
		t.Fatalf("counters %v: want 48 refusals, 2 hits", out)
	}
}

// A flow only one way (nobody answers: it will never be learned both ways) is learned in that
// direction once; its next packets, while the direction is fresh, are handed over tagged "nothing
// to learn" (the learner looks nothing up) and keep the entry alive; once the direction is
// FP_REVALIDATE_NS old it is re-learned. A TCP flow learned from its handshake only is always
// handed over for learning (a data packet must clear that flag).
func TestOneWayFlowLearnsOnce(t *testing.T) {
	e := newProgEnv(t)
	tp := e.tagProgs(t)
	e.putPod(t, podA, macPod, 100) // the sender, listed on its veth (src_refused)
	fr := framesOf(40000)
	k := keyOf(podA, podB, 40000, 5201, 6)
	if _, tag := e.runTag(t, tp.Tx, fr.sent, 0); tag != tagOut {
		t.Fatalf("first packet: tag %#x, want %#x", tag, tagOut)
	}
	e.runTag(t, tp.LrnTx, fr.wire, tagOut)
	f := e.flow(t, k)
	if f.Flags&fOut == 0 || f.OutTtlSeen != 0 {
		t.Fatalf("egress not learned: %+v", f)
	}
	seen := f.SeenNs
	time.Sleep(2 * time.Millisecond)
	if ret, tag := e.runTag(t, tp.Tx, fr.sent, 0); ret != tcxNext || tag != tagNoOut {
		t.Fatalf("next packet, egress fresh: verdict %d tag %#x, want the normal path tagged %#x", int32(ret), tag, tagNoOut)
	}
	if g := e.flow(t, k); g.OutTtlSeen != 0 || g.SeenNs <= seen || g.OutNs != f.OutNs {
		t.Fatalf("next packet: %+v, want nothing to learn and the entry kept alive", g)
	}
	// The direction ages past FP_REVALIDATE_NS: re-learned from the next packet.
	g := e.flow(t, k)
	g.OutNs = monoNs() - uint64(6*time.Second)
	if err := e.o.PrgFastpathFlow.Put(k, g); err != nil {
		t.Fatal(err)
	}
	if _, tag := e.runTag(t, tp.Tx, fr.sent, 0); tag != tagOut {
		t.Fatalf("egress 6 s old: tag %#x, want %#x", tag, tagOut)
	}
	if g := e.flow(t, k); g.OutTtlSeen != 64 {
		t.Fatalf("egress 6 s old: %+v, want an entry waiting for the learner", g)
	}
	e.runTag(t, tp.LrnTx, fr.wire, tagOut)

	// Learned from a SYN only: handed over for learning every time.
	g = e.flow(t, k)
	g.Flags |= fHsOnly
	if err := e.o.PrgFastpathFlow.Put(k, g); err != nil {
		t.Fatal(err)
	}
	if _, tag := e.runTag(t, tp.Tx, fr.sent, 0); tag != tagOut {
		t.Fatalf("handshake-only flow: tag %#x, want %#x", tag, tagOut)
	}
	e.o.PrgFastpathFlow.Delete(k)

	// Ingress: a flow arriving from node B that pod A never answers.
	if _, tag := e.runTag(t, tp.Rx, fr.arriving, 0); tag != tagLearn {
		t.Fatalf("first arrival: tag %#x, want %#x", tag, tagLearn)
	}
	e.runTag(t, tp.LrnRx, fr.delivered, tagLearn)
	if f := e.flow(t, k); f.Flags&fIn == 0 {
		t.Fatalf("ingress not learned: %+v", f)
	}
	if ret, tag := e.runTag(t, tp.Rx, fr.arriving, 0); ret != tcxNext || tag != tagNoIn {
		t.Fatalf("next arrival, ingress fresh: verdict %d tag %#x, want the normal path tagged %#x", int32(ret), tag, tagNoIn)
	}
	if f := e.flow(t, k); f.InTtlSeen != 0 {
		t.Fatalf("next arrival: %+v, want nothing to learn", f)
	}
	// Pod A answers: learned both ways, the fast path both ways.
	e.runTag(t, tp.Tx, fr.sent, 0)
	e.runTag(t, tp.LrnTx, fr.wire, tagOut)
	if ret, _ := e.runTag(t, tp.Tx, fr.sent, 0); ret != tcActRedirect {
		t.Fatalf("answered flow: verdict %d, want the fast path", int32(ret))
	}
}

// An IPv6 flow over its pod's budget is tagged "no entry" as an IPv4 one is, so the egress
// learner looks nothing up for it; a flow within the budget keeps the usual tag and is learned.
func TestIPv6OverBudgetTaggedNoEntry(t *testing.T) {
	e := newProgEnv(t)
	tp := e.tagProgs(t)
	e.putPod6(t, pod6A, macPod, 7)
	e.setBudget(t, 1)
	in, over := pod6Frame(), pod6Frame()
	over.sport = 40001
	if ret, tag := e.runTag(t, tp.Tx, in.bytes(), 0); ret != tcxNext || tag != tagOut {
		t.Fatalf("tx, flow within the budget: verdict %d tag %#x, want the normal path tagged %#x", int32(ret), tag, tagOut)
	}
	if ret, tag := e.runTag(t, tp.Tx, over.bytes(), 0); ret != tcxNext || tag != tagNoOut {
		t.Fatalf("tx, flow over the budget: verdict %d tag %#x, want the normal path tagged %#x", int32(ret), tag, tagNoOut)
	}
	if b, err := e.o.PrgFastpathFlow6.LookupBytes(key6(pod6A, pod6B, 40001, 5201, 6)); err != nil || b != nil {
		t.Fatalf("a flow over the budget got an entry (%v)", err)
	}
	if out, _ := e.counters(t); out["budget"] != 1 {
		t.Fatalf("counters %v: want one budget refusal", out)
	}
	// The flow within the budget is learned from its frame tagged as usual.
	if _, tag := e.runTag(t, tp.LrnTx, encap6(in), tagOut); tag != 0 {
		t.Fatalf("egress learner left tag %#x, want it given back", tag)
	}
	if f := e.flow6(t, key6(pod6A, pod6B, 40000, 5201, 6)); f.Flags&fOut == 0 || f.OutTtlDec != 1 {
		t.Fatalf("flow within the budget: flags %#x hop limit change %d, want learned", f.Flags, f.OutTtlDec)
	}
}
