package fastpath

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
)

// Same-node pods (bpf/fastpath_local.h) with crafted frames: learned from the normal path's
// delivery at the receiver's veth, then handed from the sender's veth straight to the
// receiver with the MACs (and translation, TTL change) of the normal path. Every program runs
// on "lo" (ifindex 1), which stands for both pods' veths.

var (
	podA2  = netip.MustParseAddr("198.19.1.3") // a second pod on pod A's node
	macPo2 = net.HardwareAddr{0x02, 0, 0, 0, 1, 3}
)

// putPod makes addr a live local pod on "lo" with MAC mac.
func (e *progEnv) putPod(t *testing.T, addr netip.Addr, mac net.HardwareAddr, slot uint32) {
	t.Helper()
	pod := fpPrgPod{Slot: slot, Ifindex: 1}
	copy(pod.CtrMac[:], mac)
	copy(pod.BrMac[:], macBridge)
	if err := e.o.PrgFastpathPort.Put(slot, fpBpfDevmapVal{Ifindex: 1}); err != nil {
		t.Fatal(err)
	}
	if err := e.o.PrgFastpathEp.Put(fpPrgPodKey{Netns: e.cfg.Netns, Family: 4, Addr: [4]uint32{word(addr)}}, pod); err != nil {
		t.Fatal(err)
	}
}

func (e *progEnv) flow(t *testing.T, k fpFpKey) fpFpFlow {
	t.Helper()
	var f fpFpFlow
	if err := e.o.PrgFastpathFlow.Lookup(k, &f); err != nil {
		t.Fatalf("flow %+v: %v", k, err)
	}
	return f
}

// TestLocalLearnAndDeliver: a flow between two pods of one node takes the normal path until
// the receive learner has seen both directions delivered, then goes from the sender's veth to
// the receiver's with the MACs the bridge used, payload untouched, counted as hit and local.
// A vanished receiver sends it back to the normal path.
func TestLocalLearnAndDeliver(t *testing.T) {
	e := newProgEnv(t)
	e.putPod(t, podA, macPod, 3)
	e.putPod(t, podA2, macPo2, 4)
	ab := frame{dst: macPo2, src: macPod, saddr: podA, daddr: podA2, proto: 6, sport: 40000, dport: 5201, tcpFlags: 0x10,
		payload: []byte("same node, one bridge hop skipped: 41 bytes")}
	ba := frame{dst: macPod, src: macPo2, saddr: podA2, daddr: podA, proto: 6, sport: 5201, dport: 40000, tcpFlags: 0x10,
		payload: []byte("and the answer")}
	for i, f := range []frame{ab, ba} {
		pkt := f.bytes()
		if ret, out := e.run(t, e.o.PrgFastpathTx, pkt, 0); ret != tcxNext || !bytes.Equal(out, pkt) {
			t.Fatalf("frame %d before learning: verdict %d, changed %v", i, int32(ret), !bytes.Equal(out, pkt))
		}
		// The bridge delivers it unchanged to the receiver's veth, where the learner sees it.
		if ret, _ := e.run(t, e.o.PrgFastpathLrnRx, pkt, 0); ret != tcxNext {
			t.Fatalf("learner verdict %d", int32(ret))
		}
	}
	k := keyOf(podA, podA2, 40000, 5201, 6)
	f := e.flow(t, k)
	if f.Flags&(fOut|fIn|fLocal) != fOut|fIn|fLocal || f.LocIfindex != 1 || !bytes.Equal(f.Tmpl[:12], append(append([]byte{}, macPo2...), macPod...)) {
		t.Fatalf("learned flow: flags %#x, veth %d, macs %x", f.Flags, f.LocIfindex, f.Tmpl[:12])
	}
	eg0, _ := e.counters(t)
	pkt := ab.bytes()
	ret, out := e.run(t, e.o.PrgFastpathTx, pkt, 0)
	eg1, _ := e.counters(t)
	if ret != tcActRedirect || !bytes.Equal(out[:len(pkt)], pkt) {
		t.Fatalf("learned: verdict %d (%v)\n got %x\nwant %x", int32(ret), eg1, out[:len(pkt)], pkt)
	}
	if eg1["hit"] != eg0["hit"]+1 || eg1["local"] != eg0["local"]+1 {
		t.Fatalf("counters %v -> %v: want one hit, one local", eg0, eg1)
	}
	// Frames of the flow addressed to the bridge (a routed hop) are delivered with the MACs
	// learned, not their own.
	routed := ab
	routed.dst = macBridge
	if ret, out := e.run(t, e.o.PrgFastpathTx, routed.bytes(), 0); ret != tcActRedirect || !bytes.Equal(out[:len(pkt)], pkt) {
		t.Fatalf("MACs not the learned ones: verdict %d, %x", int32(ret), out[:14])
	}
	// The receiver vanished: the normal path again, counted stale.
	if err := e.o.PrgFastpathEp.Delete(fpPrgPodKey{Netns: e.cfg.Netns, Family: 4, Addr: [4]uint32{word(podA2)}}); err != nil {
		t.Fatal(err)
	}
	ret, out = e.run(t, e.o.PrgFastpathTx, pkt, 0)
	eg2, _ := e.counters(t)
	if ret != tcxNext || !bytes.Equal(out, pkt) || eg2["stale"] != eg1["stale"]+1 {
		t.Fatalf("receiver gone: verdict %d, changed %v, counters %v", int32(ret), !bytes.Equal(out, pkt), eg2)
	}
}

// TestLocalServiceNAT: a Service connection between two pods of one node, as learned: the
// client's packets to the ClusterIP reach the backend translated (destination, port, TTL of
// the routed hop, the bridge's MACs); the backend's replies reach the client with the Service
// as their source. Checksums are checked by building the expected frame from scratch (TCP and
// UDP).
func TestLocalServiceNAT(t *testing.T) {
	for _, proto := range []uint8{6, 17} {
		e := newProgEnv(t)
		cl, be := e.localSvc(t)
		for k, f := range map[fpFpKey]fpFpFlow{keyOf(podA, svcAddr, 40000, 80, proto): cl, keyOf(podA2, podA, 5201, 40000, proto): be} {
			if err := e.o.PrgFastpathFlow.Put(k, f); err != nil {
				t.Fatal(err)
			}
		}
		req := frame{dst: macBridge, src: macPod, saddr: podA, daddr: svcAddr, proto: proto, sport: 40000, dport: 80, tcpFlags: 0x10,
			payload: []byte("to the ClusterIP, backend on this node (odd)")}
		want := req
		want.dst, want.src, want.daddr, want.dport, want.ttl = macPo2, macBridge, podA2, 5201, 63
		if ret, out := e.run(t, e.o.PrgFastpathTx, req.bytes(), 0); ret != tcActRedirect || !bytes.Equal(out[:len(want.bytes())], want.bytes()) {
			t.Fatalf("proto %d request: verdict %d\n got %x\nwant %x", proto, int32(ret), out[:len(want.bytes())], want.bytes())
		}
		rep := frame{dst: macPod, src: macPo2, saddr: podA2, daddr: podA, proto: proto, sport: 5201, dport: 40000, tcpFlags: 0x10,
			payload: []byte("reply from the backend")}
		want = rep
		want.saddr, want.sport = svcAddr, 80
		if ret, out := e.run(t, e.o.PrgFastpathTx, rep.bytes(), 0); ret != tcActRedirect || !bytes.Equal(out[:len(want.bytes())], want.bytes()) {
			t.Fatalf("proto %d reply: verdict %d\n got %x\nwant %x", proto, int32(ret), out[:len(want.bytes())], want.bytes())
		}
		if eg, _ := e.counters(t); eg["local"] != 2 || eg["hit"] != 2 {
			t.Fatalf("proto %d: counters %v, want 2 local hits", proto, eg)
		}
	}
}

// localSvc registers pods A and A2 and returns, learned now, pod A's same-node flow to the
// Service (translated to A2:5201) and the backend's reply flow (source NAT back to the Service).
func (e *progEnv) localSvc(t *testing.T) (cl, be fpFpFlow) {
	t.Helper()
	e.putPod(t, podA, macPod, 3)
	e.putPod(t, podA2, macPo2, 4)
	now := monoNs()
	cl = fpFpFlow{OutIfindex: 1, LocIfindex: 1, OutNs: now, InNs: now, Flags: fOut | fIn | fLocal | fDNAT, OutTtlDec: 1,
		NatAddr: word(podA2), NatPort: htons(5201)}
	copy(cl.Tmpl[:], append(append([]byte{}, macPo2...), macBridge...))
	be = fpFpFlow{OutIfindex: 1, LocIfindex: 1, OutNs: now, InNs: now, Flags: fOut | fIn | fLocal | fSNAT,
		NatAddr: word(svcAddr), NatPort: htons(80)}
	copy(be.Tmpl[:], append(append([]byte{}, macPod...), macPo2...))
	return cl, be
}

// TestLocalForgottenByOverlayLearn: a same-node flow whose receiver moved to another node is
// relearned by the overlay's learner, which makes it an overlay flow again (no local flag).
func TestLocalForgottenByOverlayLearn(t *testing.T) {
	e := newProgEnv(t)
	k := keyOf(podA, podB, 40000, 5201, 6)
	f := fpFpFlow{OutIfindex: 1, LocIfindex: 1, OutNs: monoNs(), Flags: fOut | fIn | fLocal, OutTtlSeen: 64}
	if err := e.o.PrgFastpathFlow.Put(k, f); err != nil {
		t.Fatal(err)
	}
	inner := podFrame().bytes()
	copy(inner[:12], append(append([]byte{}, macVxB...), macVxA...))
	pkt := append(append([]byte{}, template()...), inner[14:]...)
	binary.BigEndian.PutUint16(pkt[16:], uint16(len(pkt)-14))
	binary.BigEndian.PutUint16(pkt[38:], uint16(len(pkt)-34))
	binary.BigEndian.PutUint16(pkt[24:], 0)
	binary.BigEndian.PutUint16(pkt[24:], csum(pkt[14:34], 0))
	if ret, _ := e.run(t, e.o.PrgFastpathLrnTx, pkt, 0); ret != tcxNext {
		t.Fatalf("verdict %d", int32(ret))
	}
	if g := e.flow(t, k); g.Flags&fLocal != 0 || g.Flags&fOut == 0 || !bytes.Equal(g.Tmpl[:], pkt[:64]) {
		t.Fatalf("after the overlay's learner: flags %#x, template %x", g.Flags, g.Tmpl[:])
	}
}

// TestLocalSynUnlearns: a new connection on a learned same-node flow's ports (a reused port)
// un-learns both directions at its SYN, and the backend's SYN-ACK its reply flow's, so the new
// connection's third ACK and first data take the normal path (conntrack sees it established)
// instead of riding the old learn (its FIN then INVALID: kube-proxy drops it).
func TestLocalSynUnlearns(t *testing.T) {
	e := newProgEnv(t)
	cl, be := e.localSvc(t)
	ck, bk := keyOf(podA, svcAddr, 40000, 80, 6), keyOf(podA2, podA, 5201, 40000, 6)
	for k, f := range map[fpFpKey]fpFpFlow{ck: cl, bk: be} {
		if err := e.o.PrgFastpathFlow.Put(k, f); err != nil {
			t.Fatal(err)
		}
	}
	req := frame{dst: macBridge, src: macPod, saddr: podA, daddr: svcAddr, proto: 6, sport: 40000, dport: 80, tcpFlags: 0x10,
		payload: []byte("request")}
	e.expect(t, "learned request", e.o.PrgFastpathTx, req.bytes(), tcActRedirect, 0, "local")
	syn := req
	syn.tcpFlags, syn.payload = 0x02, nil
	e.expect(t, "SYN of a new connection, same ports", e.o.PrgFastpathTx, syn.bytes(), tcxNext, 0, "proto")
	if f := e.flow(t, ck); f.Flags&(fOut|fIn) != 0 {
		t.Fatalf("client's flow after a new SYN: flags %#x, want neither direction learned", f.Flags)
	}
	e.expect(t, "its third ACK", e.o.PrgFastpathTx, req.bytes(), tcxNext, 0, "miss")
	synack := frame{dst: macPod, src: macPo2, saddr: podA2, daddr: podA, proto: 6, sport: 5201, dport: 40000, tcpFlags: 0x12}
	e.expect(t, "the backend's SYN-ACK", e.o.PrgFastpathTx, synack.bytes(), tcxNext, 0, "proto")
	if f := e.flow(t, bk); f.Flags&(fOut|fIn) != 0 {
		t.Fatalf("reply flow after the SYN-ACK: flags %#x, want neither direction learned", f.Flags)
	}
}
