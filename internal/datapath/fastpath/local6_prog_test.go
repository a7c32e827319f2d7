package fastpath

import (
	"bytes"
	"net/netip"
	"testing"
)

// Same-node IPv6 pods (bpf/fastpath_local6.h) with crafted frames: learned from the normal
// path's delivery at the receiver's veth, then handed from the sender's veth straight to the
// receiver with the MACs and hop limit change of the normal path. Every program runs on "lo"
// (ifindex 1), which stands for both pods' veths.

var pod6A2 = netip.MustParseAddr("fd70:7267:0:1::3") // a second pod on pod A's node

func local6Frames() (ab, ba frame6) {
	ab = frame6{dst: macPo2, src: macPod, saddr: pod6A, daddr: pod6A2, proto: 6, sport: 40000, dport: 5201, tcpFlags: 0x10,
		payload: []byte("same node over IPv6: the bridge is skipped")}
	ba = frame6{dst: macPod, src: macPo2, saddr: pod6A2, daddr: pod6A, proto: 6, sport: 5201, dport: 40000, tcpFlags: 0x10,
		payload: []byte("and the answer")}
	return ab, ba
}

// learnLocal6 takes both directions through the normal path as the programs see it: pod A's
// segments are routed by the node (delivered with the bridge's MAC as source, hop limit one
// lower), pod A2's replies are bridged (unchanged).
func (e *progEnv) learnLocal6(t *testing.T) {
	t.Helper()
	e.putPod6(t, pod6A, macPod, 3)
	e.putPod6(t, pod6A2, macPo2, 4)
	ab, ba := local6Frames()
	e.expect(t, "A's first segment", e.o.PrgFastpathTx, ab.bytes(), tcxNext, 0, "miss")
	routed := ab
	routed.src, routed.hlim = macBridge, 63
	e.expect(t, "its delivery to A2", e.o.PrgFastpathLrnRx, routed.bytes(), tcxNext, 0, "learned")
	e.expect(t, "A2's first reply", e.o.PrgFastpathTx, ba.bytes(), tcxNext, 0, "miss")
	e.expect(t, "its delivery to A", e.o.PrgFastpathLrnRx, ba.bytes(), tcxNext, 0, "learned")
}

// TestLocal6LearnAndDeliver: both directions learned, then each is delivered straight to the
// other pod (redirect), byte for byte what the normal path delivered: A's with the hop limit
// one lower and the bridge's MAC, A2's unchanged. Counted hit and local.
func TestLocal6LearnAndDeliver(t *testing.T) {
	e := newProgEnv(t)
	e.learnLocal6(t)
	f := e.flow6(t, key6(pod6A, pod6A2, 40000, 5201, 6))
	if f.Flags&(fOut|fIn|fLocal) != fOut|fIn|fLocal || f.LocIfindex != 1 || f.OutTtlDec != 1 || f.Vtep != 0 {
		t.Fatalf("A's flow: flags %#x, veth %d, hop limit change %d, vtep %x", f.Flags, f.LocIfindex, f.OutTtlDec, f.Vtep)
	}
	r := e.flow6(t, key6(pod6A2, pod6A, 5201, 40000, 6))
	if r.Flags&(fOut|fIn|fLocal) != fOut|fIn|fLocal || r.OutTtlDec != 0 {
		t.Fatalf("A2's flow: flags %#x, hop limit change %d", r.Flags, r.OutTtlDec)
	}
	ab, ba := local6Frames()
	want := ab
	want.src, want.hlim = macBridge, 63
	out := e.expect(t, "A to A2", e.o.PrgFastpathTx, ab.bytes(), tcActRedirect, 0, "local")
	if w := want.bytes(); !bytes.Equal(out[:len(w)], w) {
		t.Fatalf("A to A2 delivered\n got %x\nwant %x", out[:len(w)], w)
	}
	out = e.expect(t, "A2 to A", e.o.PrgFastpathTx, ba.bytes(), tcActRedirect, 0, "hit")
	if w := ba.bytes(); !bytes.Equal(out[:len(w)], w) {
		t.Fatalf("A2 to A delivered\n got %x\nwant %x", out[:len(w)], w)
	}
	// The receiver vanished: the normal path again, counted stale.
	k := fpPrgPodKey{Netns: e.cfg.Netns, Family: 6, Addr: key6(pod6A2, pod6A, 0, 0, 0).Local}
	if err := e.o.PrgFastpathEp.Delete(k); err != nil {
		t.Fatal(err)
	}
	e.expect(t, "receiver gone", e.o.PrgFastpathTx, ab.bytes(), tcxNext, 0, "stale")
}

// TestLocal6Refusals: what stays on the normal path of a learned same-node IPv6 flow: a hop
// limit the routed hop would exhaust, extension headers, fragments, ICMPv6 (neighbour
// discovery), and a pod sending with another pod's source address from its own veth. Nothing
// of it learns either.
func TestLocal6Refusals(t *testing.T) {
	e := newProgEnv(t)
	e.learnLocal6(t)
	ab, _ := local6Frames()
	hop1 := ab
	hop1.hlim = 1
	hbh := ab
	hbh.hopByHop = true
	frag := ab
	frag.frag = true
	icmp := ab
	icmp.proto = 58
	for _, c := range []struct {
		name, reason string
		f            frame6
	}{{"hop limit 1", "ttl", hop1}, {"hop-by-hop header", "ip-options", hbh}, {"fragment", "fragment", frag}, {"icmpv6", "proto", icmp}} {
		e.expect(t, c.name, e.o.PrgFastpathTx, c.f.bytes(), tcxNext, 0, c.reason)
	}
	// An extension header's delivery teaches nothing: a fresh flow with one stays unlearned.
	x := ab
	x.hopByHop, x.sport = true, 40001
	e.expect(t, "extension header, first", e.o.PrgFastpathTx, x.bytes(), tcxNext, 0, "ip-options")
	e.expect(t, "extension header, delivered", e.o.PrgFastpathLrnRx, x.bytes(), tcxNext, 0, "")
	var nf fpFpFlow
	if err := e.o.PrgFastpathFlow6.Lookup(key6(pod6A, pod6A2, 40001, 5201, 6), &nf); err == nil {
		t.Fatalf("a flow with an extension header was entered: %+v", nf)
	}
	// Forged source: the flow was learned on pod A's veth (made ifindex 2 here); the same
	// addresses from another veth (lo, 1: pod A2's or a third pod's) miss and go the normal way.
	k := key6(pod6A, pod6A2, 40000, 5201, 6)
	f := e.flow6(t, k)
	f.OutIfindex = 2
	if err := e.o.PrgFastpathFlow6.Put(k, f); err != nil {
		t.Fatal(err)
	}
	e.expect(t, "forged source", e.o.PrgFastpathTx, ab.bytes(), tcxNext, 0, "stale")
	if g := e.flow6(t, k); g.OutIfindex != 1 || g.OutTtlSeen != 64 {
		t.Fatalf("the forged frame was recorded as %d/%d, want the normal path's relearning on veth 1", g.OutIfindex, g.OutTtlSeen)
	}
}
