package fastpath

import (
	"bytes"
	"testing"
)

// The sending half over an IPv6 underlay (bpf/fastpath_u6.h's tx_u6) with crafted frames: pod
// A's flow to pod B is learned both ways from the normal path (its egress from the VXLAN frame
// flannel-v6.1 built), then pod A's segment leaves for flannel-v6.1 with exactly the inner
// Ethernet header and hop limit the normal path gave it; the vxlan driver encapsulates it.

func (e *progEnv) putU6dev(t *testing.T, ifindex uint32) {
	t.Helper()
	if err := e.o.PrgFastpathU6dev.Put(uint32(0), fpFpU6dev{Ifindex: ifindex}); err != nil {
		t.Fatal(err)
	}
}

// learnU6 takes pod A's TCP flow to pod B through the normal path both ways over flannel-v6.1
// and returns pod A's segment and what flannel-v6.1 was given for it.
func (e *progEnv) learnU6(t *testing.T) (out, sent frame6) {
	t.Helper()
	e.putPod6(t, pod6A, macPod, 7)
	e.putU6(t)
	out = pod6Frame()
	e.expect(t, "first packet out", e.o.PrgFastpathTx, out.bytes(), tcxNext, 0, "miss")
	sent = out
	sent.dst, sent.src, sent.hlim = macVx6B, macVx6A, 63 // the neighbour entry's MACs, one hop
	e.expect(t, "its VXLAN frame over IPv6", e.o.PrgFastpathLrnTx, vxu6(sent.bytes(), vtep6A, vtep6B, u6opts{}), tcxNext, 0, "learned")
	// One way only: the egress still waits for the reply's direction.
	e.expect(t, "learned one way", e.o.PrgFastpathTx, out.bytes(), tcxNext, 0, "miss")
	e.expect(t, "its VXLAN frame again", e.o.PrgFastpathLrnTx, vxu6(sent.bytes(), vtep6A, vtep6B, u6opts{}), tcxNext, 0, "learned")
	in := reply6Frame()
	in.dst, in.src = macVx6A, macVx6B
	e.expect(t, "first reply", e.o.PrgFastpathRx, vxu6(in.bytes(), vtep6B, vtep6A, u6opts{}), tcxNext, 1, "miss")
	in.dst, in.src, in.hlim = macPod, macBridge, 63
	e.expect(t, "its delivery", e.o.PrgFastpathLrnRx, in.bytes(), tcxNext, 1, "learned")
	f := e.flow6(t, key6(pod6A, pod6B, 40000, 5201, 6))
	if f.Flags&(fOut|fIn|fU6) != fOut|fIn|fU6 || f.OutTtlDec != 1 || !bytes.Equal(f.Tmpl[:14], sent.bytes()[:14]) {
		t.Fatalf("flow after learning: flags %#x, hop limit change %d, template %x", f.Flags, f.OutTtlDec, f.Tmpl[:14])
	}
	return out, sent
}

// TestIPv6UnderlaySend: the hit is the inner frame flannel-v6.1 got from the normal path, byte
// for byte, redirected; everything unexpected stays on the normal path, untouched and counted.
func TestIPv6UnderlaySend(t *testing.T) {
	e := newProgEnv(t)
	out, sent := e.learnU6(t)

	e.expect(t, "no device yet", e.o.PrgFastpathTx, out.bytes(), tcxNext, 0, "unsupported")
	e.putU6dev(t, 1) // "lo" stands in for flannel-v6.1 (the test run's namespace)
	// Without the flow's whole header (u6encap_prog_test.go has it), the driver encapsulates.
	if err := e.o.PrgFastpathU6tmpl.Delete(key6(pod6A, pod6B, 40000, 5201, 6)); err != nil {
		t.Fatal(err)
	}
	got := e.expect(t, "send hit", e.o.PrgFastpathTx, out.bytes(), tcActRedirect, 0, "hit")
	if w := sent.bytes(); !bytes.Equal(got[:len(w)], w) {
		t.Fatalf("frame for flannel-v6.1\n got %x\nwant %x", got[:len(w)], w)
	}
	udp := pod6Frame()
	udp.proto = 17
	e.expect(t, "a UDP flow never learned", e.o.PrgFastpathTx, udp.bytes(), tcxNext, 0, "miss")
	other := pod6Frame()
	other.sport = 40001
	e.expect(t, "another port of the pod, never learned", e.o.PrgFastpathTx, other.bytes(), tcxNext, 0, "miss")
	hbh := pod6Frame()
	hbh.hopByHop = true
	e.expect(t, "inner hop-by-hop header", e.o.PrgFastpathTx, hbh.bytes(), tcxNext, 0, "ip-options")
	frag := pod6Frame()
	frag.frag = true
	e.expect(t, "inner fragment header", e.o.PrgFastpathTx, frag.bytes(), tcxNext, 0, "fragment")
	syn := pod6Frame()
	syn.tcpFlags = 0x02
	e.expect(t, "a SYN on the flow's key", e.o.PrgFastpathTx, syn.bytes(), tcxNext, 0, "proto")

	// The device gone (an ifindex no device has): the MTU check fails, the normal path sends.
	e.putU6dev(t, 0x7ffffff0)
	e.expect(t, "device gone", e.o.PrgFastpathTx, out.bytes(), tcxNext, 0, "mtu")
	e.putU6dev(t, 1)

	// Another pod forging pod A's source: its frame arrives on another veth than the flow was
	// learned on, and is handed to the normal path as it came (never redirected).
	k := key6(pod6A, pod6B, 40000, 5201, 6)
	f := e.flow6(t, k)
	f.OutIfindex = 2
	if err := e.o.PrgFastpathFlow6.Put(k, f); err != nil {
		t.Fatal(err)
	}
	e.expect(t, "pod A's source from another veth", e.o.PrgFastpathTx, out.bytes(), tcxNext, 0, "stale")
	e.expect(t, "and again: no longer learned there", e.o.PrgFastpathTx, out.bytes(), tcxNext, 0, "miss")

	// Re-learned over the IPv4 underlay (the flow moved to flannel.1): a whole template again,
	// FP_F_U6 cleared, encapsulated by tc as before.
	e.expect(t, "its VXLAN frame over IPv4", e.o.PrgFastpathLrnTx, encap6(out), tcxNext, 0, "learned")
	if f := e.flow6(t, k); f.Flags&(fOut|fU6) != fOut {
		t.Fatalf("flow re-learned over IPv4: flags %#x, want out without u6", f.Flags)
	}
	got = e.expect(t, "hit over IPv4", e.o.PrgFastpathTx, out.bytes(), tcActRedirect, 0, "hit")
	if len(got) < len(out.bytes())+50 || got[12] != 0x08 || got[13] != 0 {
		t.Fatalf("re-learned over IPv4: frame %x, want IPv4 outer headers", got[:16])
	}
}
