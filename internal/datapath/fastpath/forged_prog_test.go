package fastpath

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// forger is a second veth for the test runs: BPF_PROG_TEST_RUN sets skb->dev from the
// context's ifindex (a device of the running thread's namespace), so frames run "on" a veth
// of a namespace of the test's own, where pod V (on "lo", ifindex 1, as in every other
// test) is not.
type forger struct {
	ns      string
	ifindex uint32
}

func newForger(t *testing.T) *forger {
	t.Helper()
	fg := &forger{ns: fmt.Sprintf("fpforge%d", os.Getpid())}
	_ = netnsutil.Delete(fg.ns)
	if err := netnsutil.Create(fg.ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netnsutil.Delete(fg.ns) })
	err := netnsutil.Do(fg.ns, func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "fpforge0"}, PeerName: "fpforge1"}); err != nil {
			return err
		}
		l, err := netlink.LinkByName("fpforge0")
		if err != nil {
			return err
		}
		fg.ifindex = uint32(l.Attrs().Index)
		return nil
	})
	if err != nil {
		t.Fatalf("forger's veth: %v", err)
	}
	return fg
}

// run runs prog on pkt as if it arrived on the forger's veth (tag: skb->tc_index for the
// tagged test programs, cb[0]); the verdict, the tag it left and the frame.
func (fg *forger) run(t *testing.T, prog *ebpf.Program, pkt []byte, tag uint32) (uint32, uint32, []byte) {
	t.Helper()
	ctx, ctxOut := make([]byte, 192), make([]byte, 192) // struct __sk_buff: ifindex at 40, cb[0] at 48
	binary.LittleEndian.PutUint32(ctx[40:], fg.ifindex)
	binary.LittleEndian.PutUint32(ctx[48:], tag)
	opts := &ebpf.RunOptions{Data: pkt, DataOut: make([]byte, len(pkt)+128), Context: ctx, ContextOut: ctxOut}
	var ret uint32
	err := netnsutil.Do(fg.ns, func() error {
		var err error
		ret, err = prog.Run(opts)
		return err
	})
	if err != nil {
		t.Fatalf("test run on the forger's veth: %v", err)
	}
	return ret, binary.LittleEndian.Uint32(ctxOut[48:]), opts.DataOut
}

// expect is progEnv.expect on the forger's veth.
func (fg *forger) expect(t *testing.T, e *progEnv, what string, prog *ebpf.Program, pkt []byte, verdict uint32, reason string) {
	t.Helper()
	before, _ := e.counters(t)
	ret, _, out := fg.run(t, prog, pkt, 0)
	after, _ := e.counters(t)
	if ret != verdict {
		t.Fatalf("%s: verdict %d, want %d (counters %v)", what, int32(ret), int32(verdict), after)
	}
	if reason != "" && after[reason] != before[reason]+1 {
		t.Fatalf("%s: counter %s %d -> %d, want +1 (all: %v)", what, reason, before[reason], after[reason], after)
	}
	if verdict == tcxNext && !bytes.Equal(out, pkt) {
		t.Fatalf("%s: the normal path's packet changed", what)
	}
}

// moveTo lists addr as a pod on the forger's veth (a replaced pod: its new veth, a new slot).
func (fg *forger) moveTo(t *testing.T, e *progEnv, key fpPrgPodKey, slot uint32) {
	t.Helper()
	var pod fpPrgPod
	if err := e.o.PrgFastpathEp.Lookup(key, &pod); err != nil {
		t.Fatal(err)
	}
	pod.Slot, pod.Ifindex = slot, fg.ifindex
	err := netnsutil.Do(fg.ns, func() error { // the devmap holds the device of this namespace
		return e.o.PrgFastpathPort.Put(slot, fpBpfDevmapVal{Ifindex: fg.ifindex})
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.o.PrgFastpathEp.Put(key, pod); err != nil {
		t.Fatal(err)
	}
}

// A pod sending with another pod's source address (pod V's, learned on V's veth) from its own
// veth changes nothing of V's flow, whatever it sends (data, SYN, FIN, RST): the frame goes to
// the normal path, counted "forged", and V's next packet still takes the fast path. The
// forger's frames with V's address make no entries charged to V's budget, and frames from
// nobody's address make none at all ("no-src"). A replaced pod (V's entry moved to the new
// veth) re-learns from the new veth; the old veth is then the forger.
func TestForgedSourceLeavesFlow(t *testing.T) {
	e := newProgEnv(t)
	fg := newForger(t)
	tp := e.tagProgs(t)
	e.putPod(t, podA, macPod, 100) // V: pod A on "lo"
	k := keyOf(podA, podB, 40000, 5201, 6)
	e.learn(t, k, 1)
	want := e.flow(t, k)

	data := podFrame()
	syn, fin, rst := podFrame(), podFrame(), podFrame()
	syn.tcpFlags, syn.payload = 0x02, nil
	fin.tcpFlags = 0x11
	rst.tcpFlags, rst.payload = 0x04, nil
	for _, c := range []struct {
		what string
		f    frame
	}{{"data", data}, {"syn", syn}, {"fin", fin}, {"rst", rst}, {"data again", data}} {
		before, _ := e.counters(t)
		ret, _, _ := fg.run(t, e.o.PrgFastpathTx, c.f.bytes(), 0)
		if got := e.flow(t, k); got != want {
			t.Fatalf("forged %s changed V's flow:\n got %+v\nwant %+v", c.what, got, want)
		}
		if after, _ := e.counters(t); ret != tcxNext || after["forged"] != before["forged"]+1 {
			t.Fatalf("forged %s: verdict %d, counted %v", c.what, int32(ret), after)
		}
	}
	// Tagged "nothing to learn": the learners at the far end of the normal path skip it.
	if ret, tag, _ := fg.run(t, tp.Tx, data.bytes(), 0); ret != tcxNext || tag != tagNoOut {
		t.Fatalf("forged frame: verdict %d tag %#x, want the normal path tagged %#x", int32(ret), tag, tagNoOut)
	}
	// V's own next packet: still the fast path.
	if ret, _ := e.run(t, e.o.PrgFastpathTx, data.bytes(), 0); ret != tcActRedirect {
		t.Fatalf("V's packet after the forgeries: verdict %d, want the fast path", int32(ret))
	}

	// V's budget: the forger's new flows with V's address take no entry and no count.
	e.setBudget(t, 2)
	for i := range 10 {
		f := podFrame()
		f.sport = uint16(42000 + i)
		fg.run(t, e.o.PrgFastpathTx, f.bytes(), 0)
		var g fpFpFlow
		if err := e.o.PrgFastpathFlow.Lookup(keyOf(podA, podB, 42000+uint16(i), 5201, 6), &g); err == nil {
			t.Fatalf("forged flow %d got an entry: %+v", i, g)
		}
	}
	if out, _ := e.counters(t); out["forged"] < 10 {
		t.Fatalf("forged new flows not counted: %v", out)
	}
	// Nobody's address: no entry, no per-address counter.
	nobody := netip.MustParseAddr("10.99.0.1")
	for i := range 10 {
		f := podFrame()
		f.saddr, f.sport = nobody, uint16(43000+i)
		fg.expect(t, e, "nobody's new flow", e.o.PrgFastpathTx, f.bytes(), tcxNext, "no-src")
	}
	var n uint32
	if err := e.o.PrgFastpathPcnt.Lookup(uint64(word(nobody)), &n); err == nil {
		t.Fatalf("nobody's address holds a flow counter (%d)", n)
	}
	// V's own new flows still get their budget's entries (V holds one flow: two more fit
	// with a budget of 3).
	e.setBudget(t, 3)
	for i := range 2 {
		f := podFrame()
		f.sport = uint16(44000 + i)
		if ret, tag := e.runTag(t, tp.Tx, f.bytes(), 0); ret != tcxNext || tag != tagOut {
			t.Fatalf("V's new flow %d: verdict %d tag %#x, want an entry (%#x)", i, int32(ret), tag, tagOut)
		}
	}

	// V replaced: its address on a new veth (the forger's device here). From there its frame
	// is V's: the flow moves and re-learns; from the old veth it is now forged.
	fg.moveTo(t, e, fpPrgPodKey{Netns: e.cfg.Netns, Family: 4, Addr: [4]uint32{word(podA)}}, 102)
	fg.expect(t, e, "replaced V's packet", e.o.PrgFastpathTx, data.bytes(), tcxNext, "stale")
	if g := e.flow(t, k); g.OutIfindex != fg.ifindex || g.Flags&fOut != 0 || g.OutTtlSeen != 64 {
		t.Fatalf("replaced V's flow: veth %d flags %#x ttl seen %d, want veth %d, egress unlearned, recorded", g.OutIfindex, g.Flags, g.OutTtlSeen, fg.ifindex)
	}
	e.expect(t, "the old veth", e.o.PrgFastpathTx, data.bytes(), tcxNext, 0, "forged")
	if g := e.flow(t, k); g.OutIfindex != fg.ifindex {
		t.Fatalf("the old veth took the flow back: veth %d", g.OutIfindex)
	}
}

// IPv6: the same for tx6, and for a same-node flow (its learned delivery to the other pod
// untouched by a forged SYN, which would otherwise reset it: local_syn).
func TestForgedSourceLeavesFlowIPv6(t *testing.T) {
	e := newProgEnv(t)
	fg := newForger(t)
	e.learn6(t) // pod A (listed on "lo") <-> pod B, learned both ways
	k := key6(pod6A, pod6B, 40000, 5201, 6)
	want := e.flow6(t, k)
	data := pod6Frame()
	syn, rst := pod6Frame(), pod6Frame()
	syn.tcpFlags = 0x02
	rst.tcpFlags = 0x04
	for _, c := range []struct {
		what string
		f    frame6
	}{{"data", data}, {"syn", syn}, {"rst", rst}} {
		before, _ := e.counters(t)
		ret, _, _ := fg.run(t, e.o.PrgFastpathTx, c.f.bytes(), 0)
		if got := e.flow6(t, k); got != want {
			t.Fatalf("forged %s changed V's flow:\n got %+v\nwant %+v", c.what, got, want)
		}
		if after, _ := e.counters(t); ret != tcxNext || after["forged"] != before["forged"]+1 {
			t.Fatalf("forged %s: verdict %d, counted %v", c.what, int32(ret), after)
		}
	}
	e.expect(t, "V's packet", e.o.PrgFastpathTx, data.bytes(), tcActRedirect, 0, "hit")
	e.setBudget(t, 1) // V holds one flow: no room, and the forger must not take it
	for i := range 5 {
		f := pod6Frame()
		f.sport = uint16(42000 + i)
		fg.expect(t, e, "forged new flow", e.o.PrgFastpathTx, f.bytes(), tcxNext, "forged")
		var g fpFpFlow
		if err := e.o.PrgFastpathFlow6.Lookup(key6(pod6A, pod6B, 42000+uint16(i), 5201, 6), &g); err == nil {
			t.Fatalf("forged flow %d got an entry: %+v", i, g)
		}
	}
	nobody := pod6Frame()
	nobody.saddr = netip.MustParseAddr("fd70:7267:0:99::1")
	fg.expect(t, e, "nobody's new flow", e.o.PrgFastpathTx, nobody.bytes(), tcxNext, "no-src")
	e.setBudget(t, 0)

	// Same node: pod A's flow to pod A2, learned on "lo".
	e.learnLocal6(t)
	kl := key6(pod6A, pod6A2, 40000, 5201, 6)
	wl := e.flow6(t, kl)
	local, _ := local6Frames()
	lsyn := local
	lsyn.tcpFlags = 0x02
	fg.expect(t, e, "forged same-node syn", e.o.PrgFastpathTx, lsyn.bytes(), tcxNext, "forged")
	fg.expect(t, e, "forged same-node data", e.o.PrgFastpathTx, local.bytes(), tcxNext, "forged")
	if got := e.flow6(t, kl); got != wl {
		t.Fatalf("forged frames changed V's same-node flow:\n got %+v\nwant %+v", got, wl)
	}
}
