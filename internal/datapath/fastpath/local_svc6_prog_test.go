package fastpath

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
)

// Same-node IPv6 Services (bpf/fastpath_local6.h) with crafted frames: pod A connects to the
// IPv6 ClusterIP svc6:80, the normal path translates it to pod A2:5201 on the same node and
// reverses the translation on A2's replies (br_netfilter). The receive learner (run with the
// hand-over tag, tcProgs) learns both flows from the frames the normal path delivers; then each
// direction goes veth to veth, translated. Every program runs on "lo" (ifindex 1), which stands
// for every pod's veth; frame6.bytes() computes the checksums from scratch, so a translated
// frame must equal the one built with the translated addresses, and l4Valid6 checks them too.

var (
	pod6A3 = netip.MustParseAddr("fd70:7267:0:1::4") // a third pod of pod A's node
	macPo3 = net.HardwareAddr{0x02, 0, 0, 0, 1, 4}
)

// svcLocal6 is pod A's packet to the ClusterIP (to the bridge: routed) and pod A2's reply from
// its own address.
func svcLocal6(proto uint8) (req, rep frame6) {
	req = frame6{dst: macBridge, src: macPod, saddr: pod6A, daddr: svc6, proto: proto, sport: 40000, dport: 80, tcpFlags: 0x10,
		payload: []byte("to an IPv6 ClusterIP whose backend is on this node")}
	rep = frame6{dst: macPod, src: macPo2, saddr: pod6A2, daddr: pod6A, proto: proto, sport: 5201, dport: 40000, tcpFlags: 0x10,
		payload: []byte("the same-node backend answers")}
	return req, rep
}

// delivered is frame f as the normal path hands it to the receiver's veth when the Service's
// translation took it to be (a backend, its MAC, routed: the bridge's MAC, hop limit - 1) or
// came back from be (bridged: unchanged but for the source, the Service's).
func deliveredReq(f frame6, be netip.Addr, mac net.HardwareAddr) frame6 {
	f.daddr, f.dport, f.dst, f.src, f.hlim = be, 5201, mac, macBridge, 63
	return f
}

func deliveredRep(f frame6) frame6 {
	f.saddr, f.sport = svc6, 80
	return f
}

// learnTagged runs the receive learner on pkt with the hand-over tag and wants one "learned".
func (e *progEnv) learnTagged(t *testing.T, tp *tcProgs, what string, pkt []byte, learned uint64) {
	t.Helper()
	b, _ := e.counters(t)
	if ret, _ := e.runTag(t, tp.LrnRx, pkt, tagOut); ret != tcxNext {
		t.Fatalf("%s: learner verdict %d", what, int32(ret))
	}
	if a, _ := e.counters(t); a["learned"]-b["learned"] != learned {
		t.Fatalf("%s: learned %d -> %d, want +%d (%v)", what, b["learned"], a["learned"], learned, a)
	}
}

// learnSvcLocal6 takes the connection through the normal path both ways: the client's first
// packet (handed over, recorded), its translated delivery to A2, A2's first reply (handed
// over), its delivery to A with the Service as source.
func (e *progEnv) learnSvcLocal6(t *testing.T, tp *tcProgs, proto uint8) {
	t.Helper()
	e.putPod6(t, pod6A, macPod, 3)
	e.putPod6(t, pod6A2, macPo2, 4)
	req, rep := svcLocal6(proto)
	e.expect(t, "first packet to the ClusterIP", e.o.PrgFastpathTx, req.bytes(), tcxNext, 0, "miss")
	e.learnTagged(t, tp, "its translated delivery to A2", deliveredReq(req, pod6A2, macPo2).bytes(), 1)
	e.expect(t, "A2's first reply", e.o.PrgFastpathTx, rep.bytes(), tcxNext, 0, "miss")
	e.learnTagged(t, tp, "its delivery to A from the ClusterIP", deliveredRep(rep).bytes(), 1)
}

// expectDelivered runs tx on sent and wants it redirected as want, byte for byte, checksums
// valid, counted local.
func (e *progEnv) expectDelivered(t *testing.T, what string, sent, want frame6) {
	t.Helper()
	out := e.expect(t, what, e.o.PrgFastpathTx, sent.bytes(), tcActRedirect, 0, "local")
	w := want.bytes()
	if len(out) < len(w) || !bytes.Equal(out[:len(w)], w) {
		t.Fatalf("%s delivered\n got %x\nwant %x", what, out, w)
	}
	if !l4Valid6(out[14:len(w)]) {
		t.Fatalf("%s: checksum invalid: %x", what, out[14:len(w)])
	}
}

// TestLocalServiceIPv6LearnAndHit: both flows are learned with their translation (the client's
// DNAT: backend in the side table, an alias under the translated key holding the Service
// address; the backend's reply flow: FP_F_SNAT, the Service address in its side entry), then
// each direction is delivered veth to veth, translated, byte for byte as the normal path
// delivered it (TCP and UDP).
func TestLocalServiceIPv6LearnAndHit(t *testing.T) {
	for _, c := range []struct {
		name  string
		proto uint8
	}{{"tcp", 6}, {"udp", 17}} {
		t.Run(c.name, func(t *testing.T) {
			onOneCPU(t)
			e := newProgEnv(t)
			tp := e.tagProgs(t)
			e.learnSvcLocal6(t, tp, c.proto)

			ck, ak, bk := key6(pod6A, svc6, 40000, 80, c.proto), key6(pod6A, pod6A2, 40000, 5201, c.proto), key6(pod6A2, pod6A, 5201, 40000, c.proto)
			if f := e.flow6(t, ck); f.Flags&(fOut|fIn|fLocal|fDNAT) != fOut|fIn|fLocal|fDNAT || f.Flags&(fSNAT|fNATX) != 0 || f.OutTtlDec != 1 {
				t.Fatalf("client's flow: flags %#x, hop limit change %d", f.Flags, f.OutTtlDec)
			}
			if be, ok := e.nat6(t, ck); !ok || be != nat6Of(pod6A2, 5201) {
				t.Fatalf("client's backend %+v (%v), want A2:5201", be, ok)
			}
			if a := e.flow6(t, ak); a.Flags != fAlias {
				t.Fatalf("alias flags %#x", a.Flags)
			}
			if s, ok := e.nat6(t, ak); !ok || s != nat6Of(svc6, 80) {
				t.Fatalf("alias's Service address %+v (%v)", s, ok)
			}
			if f := e.flow6(t, bk); f.Flags&(fOut|fIn|fLocal|fSNAT) != fOut|fIn|fLocal|fSNAT || f.Flags&(fDNAT|fNATX) != 0 || f.OutTtlDec != 0 {
				t.Fatalf("backend's flow: flags %#x, hop limit change %d", f.Flags, f.OutTtlDec)
			}
			if s, ok := e.nat6(t, bk); !ok || s != nat6Of(svc6, 80) {
				t.Fatalf("backend's Service address %+v (%v)", s, ok)
			}

			req, rep := svcLocal6(c.proto)
			for i := 0; i < 2; i++ { // the second time from the same state: nothing was consumed
				e.expectDelivered(t, "A to the ClusterIP", req, deliveredReq(req, pod6A2, macPo2))
				e.expectDelivered(t, "A2's reply", rep, deliveredRep(rep))
			}
			// A UDP datagram without a checksum (or a seed of 0) goes to the normal path unchanged.
			if c.proto == 17 {
				pkt := req.bytes()
				binary.BigEndian.PutUint16(pkt[14+40+6:], 0)
				if out := e.expect(t, "udp checksum 0", e.o.PrgFastpathTx, pkt, tcxNext, 0, "error"); !bytes.Equal(out[:len(pkt)], pkt) {
					t.Fatalf("changed on its way to the normal path: %x", out)
				}
			}
		})
	}
}

// TestLocalServiceIPv6BackendSwitch: the client's flow re-learned with another same-node
// backend (conntrack's entry was replaced) goes to that one; the former backend's replies no
// longer match the client's translation and go to the normal path (counted stale), which
// refuses or answers them as conntrack says. A backend on another node afterwards makes the
// flow an overlay one again (not local, not the same-node reply translation).
func TestLocalServiceIPv6BackendSwitch(t *testing.T) {
	onOneCPU(t)
	e := newProgEnv(t)
	tp := e.tagProgs(t)
	e.learnSvcLocal6(t, tp, 6)
	e.putPod6(t, pod6A3, macPo3, 5)
	ck := key6(pod6A, svc6, 40000, 80, 6)
	f := e.flow6(t, ck)
	f.OutNs -= 6e9 // due for re-learning
	if err := e.o.PrgFastpathFlow6.Put(ck, f); err != nil {
		t.Fatal(err)
	}
	req, rep := svcLocal6(6)
	e.expect(t, "client's packet, due", e.o.PrgFastpathTx, req.bytes(), tcxNext, 0, "stale")
	e.learnTagged(t, tp, "its delivery to A3", deliveredReq(req, pod6A3, macPo3).bytes(), 1)
	if be, ok := e.nat6(t, ck); !ok || be != nat6Of(pod6A3, 5201) {
		t.Fatalf("client's backend after the switch %+v (%v), want A3:5201", be, ok)
	}
	e.expectDelivered(t, "A to the ClusterIP, switched", req, deliveredReq(req, pod6A3, macPo3))
	e.expect(t, "the former backend's reply", e.o.PrgFastpathTx, rep.bytes(), tcxNext, 0, "stale")
}

// TestLocalServiceIPv6ReplyAfterClient: the backend's reply flow, due for re-learning, stays
// on the fast path until the client's flow was re-learned after it (conntrack's entry is then
// known to exist with its translation, or re-created by the client's packet), and for at most
// two intervals; then it goes to the normal path. Re-learned after it only counts while
// conntrack holds the client's entry (ct_known): the test inserts it in a namespace of its own.
func TestLocalServiceIPv6ReplyAfterClient(t *testing.T) {
	onOneCPU(t)
	ns := inCtNetns(t)
	e := newProgEnv(t)
	tp := e.tagProgs(t)
	e.learnSvcLocal6(t, tp, 6)
	ck, bk := key6(pod6A, svc6, 40000, 80, 6), key6(pod6A2, pod6A, 5201, 40000, 6)
	set := func(k fpFpKey6, outNs uint64) {
		t.Helper()
		f := e.flow6(t, k)
		f.OutNs = outNs
		if err := e.o.PrgFastpathFlow6.Put(k, f); err != nil {
			t.Fatal(err)
		}
	}
	_, rep := svcLocal6(6)
	now := monoNs()
	set(bk, now-6e9) // due
	set(ck, now-7e9) // the client's learned before it: not yet re-learned
	e.expectDelivered(t, "reply due, client not re-learned", rep, deliveredRep(rep))
	set(ck, now-1e9) // the client's flow re-learned since
	e.expectDelivered(t, "reply due, client re-learned, conntrack's entry gone", rep, deliveredRep(rep))
	ctInsert(t, ns, pod6A.String(), svc6.String(), pod6A2.String())
	set(bk, now-6e9)
	e.expect(t, "reply due, client re-learned", e.o.PrgFastpathTx, rep.bytes(), tcxNext, 0, "stale")
	set(bk, now-11e9) // more than two intervals old: whatever the client's flow
	set(ck, now-12e9)
	e.expect(t, "reply two intervals old", e.o.PrgFastpathTx, rep.bytes(), tcxNext, 0, "stale")
}

// TestLocalServiceIPv6Hostile: what stays on the normal path of a learned same-node IPv6
// Service connection: a forged source (either flow's addresses sent from another veth), a hop
// limit the routed hop would exhaust, a pod sending from the Service address itself, a packet
// on the translated key (the alias is no flow), and a frame delivered with a Service source
// no alias confirms (not learned as a reply). The hairpin (the client is its own backend, the
// node masquerades) is marked and counted "nat".
func TestLocalServiceIPv6Hostile(t *testing.T) {
	onOneCPU(t)
	e := newProgEnv(t)
	tp := e.tagProgs(t)
	e.learnSvcLocal6(t, tp, 6)
	req, rep := svcLocal6(6)

	hop1 := req
	hop1.hlim = 1
	e.expect(t, "hop limit 1 to the ClusterIP", e.o.PrgFastpathTx, hop1.bytes(), tcxNext, 0, "ttl")

	fromSvc := rep
	fromSvc.saddr, fromSvc.sport = svc6, 80
	e.expect(t, "a pod sending from the ClusterIP", e.o.PrgFastpathTx, fromSvc.bytes(), tcxNext, 0, "no-src")
	direct := req
	direct.daddr, direct.dport, direct.dst = pod6A2, 5201, macPo2
	e.expect(t, "the translated key sent directly", e.o.PrgFastpathTx, direct.bytes(), tcxNext, 0, "")

	// A third pod's frame delivered to A from the Service address on another connection:
	// no alias confirms it (A never connected from port 40001).
	e.putPod6(t, pod6A3, macPo3, 5)
	odd := rep
	odd.saddr, odd.src, odd.dport = pod6A3, macPo3, 40001
	e.expect(t, "A3's first packet", e.o.PrgFastpathTx, odd.bytes(), tcxNext, 0, "miss")
	odd.saddr, odd.sport = svc6, 80
	e.learnTagged(t, tp, "delivered from the ClusterIP without a client", odd.bytes(), 0)
	if f := e.flow6(t, key6(pod6A3, pod6A, 5201, 40001, 6)); f.Flags&(fOut|fSNAT) != 0 {
		t.Fatalf("A3's flow learned as a reply: flags %#x", f.Flags)
	}

	// Forged source: both flows were learned on veth 1; from veth 2 (another pod's) they miss.
	for _, k := range []fpFpKey6{key6(pod6A, svc6, 40000, 80, 6), key6(pod6A2, pod6A, 5201, 40000, 6)} {
		f := e.flow6(t, k)
		f.OutIfindex = 2
		if err := e.o.PrgFastpathFlow6.Put(k, f); err != nil {
			t.Fatal(err)
		}
	}
	e.expect(t, "forged client", e.o.PrgFastpathTx, req.bytes(), tcxNext, 0, "stale")
	e.expect(t, "forged backend", e.o.PrgFastpathTx, rep.bytes(), tcxNext, 0, "stale")

	// Hairpin: A to the ClusterIP from port 40002, its backend A itself: the node masquerades
	// (source: the gateway). Not reproduced: NATX, counted "nat" from then on.
	hp := req
	hp.sport = 40002
	e.expect(t, "hairpin's first packet", e.o.PrgFastpathTx, hp.bytes(), tcxNext, 0, "miss")
	masq := hp
	masq.saddr, masq.sport = netip.MustParseAddr("fd70:7267:0:1::1"), 61000
	masq.daddr, masq.dport, masq.dst, masq.src, masq.hlim = pod6A, 5201, macPod, macBridge, 63
	e.learnTagged(t, tp, "hairpin delivered masqueraded", masq.bytes(), 0)
	if f := e.flow6(t, key6(pod6A, svc6, 40002, 80, 6)); f.Flags&fNATX == 0 || f.Flags&(fOut|fDNAT|fLocal) != 0 {
		t.Fatalf("hairpin's flow flags %#x, want NATX only", f.Flags)
	}
	e.expect(t, "hairpin's next packet", e.o.PrgFastpathTx, hp.bytes(), tcxNext, 0, "nat")
}

// TestLocalServiceIPv6HandshakeNotLearned: the SYN and SYN-ACK of a same-node connection teach
// nothing (its FIN would otherwise meet a conntrack entry that saw only the handshake: INVALID,
// dropped by kube-proxy); its first data each way does.
func TestLocalServiceIPv6HandshakeNotLearned(t *testing.T) {
	onOneCPU(t)
	e := newProgEnv(t)
	tp := e.tagProgs(t)
	e.putPod6(t, pod6A, macPod, 3)
	e.putPod6(t, pod6A2, macPo2, 4)
	req, rep := svcLocal6(6)
	syn, synack := req, rep
	syn.tcpFlags, synack.tcpFlags = 0x02, 0x12
	e.expect(t, "SYN to the ClusterIP", e.o.PrgFastpathTx, syn.bytes(), tcxNext, 0, "proto")
	e.learnTagged(t, tp, "SYN delivered to A2", deliveredReq(syn, pod6A2, macPo2).bytes(), 0)
	e.expect(t, "SYN-ACK", e.o.PrgFastpathTx, synack.bytes(), tcxNext, 0, "proto")
	e.learnTagged(t, tp, "SYN-ACK delivered to A", deliveredRep(synack).bytes(), 0)
	if f := e.flow6(t, key6(pod6A, svc6, 40000, 80, 6)); f.Flags&(fOut|fIn|fDNAT|fLocal) != 0 {
		t.Fatalf("client's flow learned from the handshake: flags %#x", f.Flags)
	}
	e.expect(t, "third ACK", e.o.PrgFastpathTx, req.bytes(), tcxNext, 0, "miss")
	e.learnTagged(t, tp, "third ACK delivered", deliveredReq(req, pod6A2, macPo2).bytes(), 1)
	e.expect(t, "first reply data", e.o.PrgFastpathTx, rep.bytes(), tcxNext, 0, "miss")
	e.learnTagged(t, tp, "first reply delivered", deliveredRep(rep).bytes(), 1)
	e.expectDelivered(t, "A to the ClusterIP", req, deliveredReq(req, pod6A2, macPo2))
	e.expectDelivered(t, "A2's reply", rep, deliveredRep(rep))
	// A new connection on the same ports (a reused port): its SYN un-learns the client's
	// egress, so its third ACK takes the normal path too (conntrack sees it established).
	e.expect(t, "SYN of a new connection, same ports", e.o.PrgFastpathTx, syn.bytes(), tcxNext, 0, "proto")
	e.expect(t, "its third ACK", e.o.PrgFastpathTx, req.bytes(), tcxNext, 0, "miss")
	if f := e.flow6(t, key6(pod6A, svc6, 40000, 80, 6)); f.Flags&(fOut|fIn) != 0 {
		t.Fatalf("client's flow after a new SYN: flags %#x, want neither direction learned", f.Flags)
	}
}
