package fastpath

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/peregrine-net/peregrine/internal/datapath/endpoints"
	"github.com/peregrine-net/peregrine/internal/testutil"
)

// Calico's VXLAN layout with crafted frames, the whole cycle on "lo" (standing for the underlay
// and pod A's cali veth): vxlan.calico's VNI 4096 on port 4789, the pod's gateway MAC
// ee:ee:ee:ee:ee:ee (the cali veth's, answered by proxy ARP), one IP-forwarding hop each side.
// Learned from the normal path's frames exactly as the lab's kernel builds them, then replayed.

var (
	calPodA  = netip.MustParseAddr("10.65.1.2")
	calPodB  = netip.MustParseAddr("10.65.2.2")
	calGwMAC = net.HardwareAddr{0xee, 0xee, 0xee, 0xee, 0xee, 0xee}
	calPodM  = net.HardwareAddr{0x5a, 0x11, 0x22, 0x33, 0x44, 0x55}
	calVxA   = net.HardwareAddr{0x66, 0x0e, 0x3c, 0, 0, 1}
	calVxB   = net.HardwareAddr{0x66, 0x0e, 0x3c, 0, 0, 2}
)

// calicoVXLAN wraps inner in vxlan.calico's headers (VNI 4096, port 4789) from src to dst.
func calicoVXLAN(dstMAC, srcMAC net.HardwareAddr, src, dst netip.Addr, inner []byte) []byte {
	b := frame{dst: dstMAC, src: srcMAC, saddr: src, daddr: dst, proto: 17, sport: 51234, dport: 4789,
		payload: append([]byte{8, 0, 0, 0, 0, 0x10, 0, 0}, inner...)}.bytes()
	binary.BigEndian.PutUint16(b[40:], 0)
	return b
}

func TestCalicoFrames(t *testing.T) {
	o := testutil.LoadObjects(t, loadObjects)
	ov := &overlay{Layout: LayoutRouted, VNI: 4096, Port: 4789, VTEP: net.IP(vtepA.AsSlice()), PortMin: 32768, PortMax: 60999, MTU: 1500,
		Underlay: devOf(1), VX: endpoints.VXLAN{Dev: devOf(1), MAC: calVxA, Inode: 4026531840, Routed: true}}
	e := &progEnv{o: o, cfg: ov.cfg()}
	if err := o.PrgFastpathCfg.Put(uint32(0), e.cfg); err != nil {
		t.Fatal(err)
	}
	lo := net.HardwareAddr{0, 0, 0, 0, 0, 0}
	// Pod A as discovery finds it: its cali veth, its MAC, the veth's MAC. Its frames make and
	// change flows only once it is listed (src_refused).
	pod := fpPrgPod{Slot: 3, Ifindex: 1}
	copy(pod.CtrMac[:], calPodM)
	copy(pod.BrMac[:], calGwMAC)
	if err := o.PrgFastpathPort.Put(pod.Slot, fpBpfDevmapVal{Ifindex: 1}); err != nil {
		t.Fatal(err)
	}
	key := fpPrgPodKey{Netns: e.cfg.Netns, Family: 4, Addr: [4]uint32{word(calPodA)}}
	if err := o.PrgFastpathEp.Put(key, pod); err != nil {
		t.Fatal(err)
	}
	payload := []byte("through vxlan.calico and a cali veth, 48 bytes!!")
	// Pod A's packet to pod B as it leaves the pod: to its gateway's MAC, TTL 64.
	sent := frame{dst: calGwMAC, src: calPodM, saddr: calPodA, daddr: calPodB, proto: 6, sport: 40000, dport: 5201, tcpFlags: 0x10, payload: payload}
	// What vxlan.calico sends for it after one forwarding hop (TTL 63).
	fwd := sent
	fwd.dst, fwd.src, fwd.ttl = calVxB, calVxA, 63
	wire := calicoVXLAN(macNicB, macNicA, vtepA, vtepB, fwd.bytes())
	// Pod B's reply as it arrives (TTL 63: node B forwarded it) and as node A's forwarding
	// delivers it to pod A's cali veth (TTL 62, from the veth's MAC to the pod's).
	reply := frame{dst: calVxA, src: calVxB, saddr: calPodB, daddr: calPodA, proto: 6, sport: 5201, dport: 40000, tcpFlags: 0x10, ttl: 63, payload: payload}
	arriving := calicoVXLAN(lo, macNicB, vtepB, vtepA, reply.bytes())
	delivered := reply
	delivered.dst, delivered.src, delivered.ttl = calPodM, calGwMAC, 62

	// The normal path once each way, seen by the learners at its far ends.
	steps := []struct {
		name string
		prog func() (uint32, []byte)
	}{
		{"pod A sends (miss)", func() (uint32, []byte) { return e.run(t, o.PrgFastpathTx, sent.bytes(), 0) }},
		{"underlay egress learns", func() (uint32, []byte) { return e.run(t, o.PrgFastpathLrnTx, wire, 0) }},
		{"reply arrives (miss)", func() (uint32, []byte) { return e.run(t, o.PrgFastpathRx, arriving, 0) }},
		{"cali veth egress learns", func() (uint32, []byte) { return e.run(t, o.PrgFastpathLrnRx, delivered.bytes(), 0) }},
	}
	for _, s := range steps {
		if ret, _ := s.prog(); ret != tcxNext {
			t.Fatalf("%s: verdict %d, want TCX_NEXT", s.name, int32(ret))
		}
	}
	f := e.flow(t, keyOf(calPodA, calPodB, 40000, 5201, 6))
	if f.Flags&(fOut|fIn) != fOut|fIn || f.OutTtlDec != 1 || f.InTtlDec != 1 || f.InIfindex != 1 ||
		!bytes.Equal(f.InMac[:], append(append([]byte{}, calPodM...), calGwMAC...)) {
		t.Fatalf("learned flow: flags %#x, ttl dec %d/%d, veth %d, macs %x", f.Flags, f.OutTtlDec, f.InTtlDec, f.InIfindex, f.InMac)
	}

	// Egress: encapsulated as vxlan.calico would, inner TTL lowered by the forwarding hop.
	pkt := sent.bytes()
	ret, out := e.run(t, o.PrgFastpathTx, pkt, 0)
	if ret != tcActRedirect || len(out) != len(wire) {
		eg, _ := e.counters(t)
		t.Fatalf("egress: verdict %d, %d bytes (want redirect, %d): %v", int32(ret), len(out), len(wire), eg)
	}
	checkEncap(t, out, pkt, wire[:64])
	if !bytes.Equal(out[64:], wire[64:]) {
		t.Fatalf("egress inner packet\n got %x\nwant %x", out[64:], wire[64:])
	}

	// Ingress: no pod in the table (only addresses discovery found are delivered to).
	if err := o.PrgFastpathEp.Delete(key); err != nil {
		t.Fatal(err)
	}
	if ret, out := e.run(t, o.PrgFastpathRx, arriving, 0); ret != tcxNext || !bytes.Equal(out, arriving) {
		t.Fatalf("ingress with no pod: verdict %d, changed %v", int32(ret), !bytes.Equal(out, arriving))
	}
	if err := o.PrgFastpathEp.Put(key, pod); err != nil {
		t.Fatal(err)
	}
	// Delivered as node A's forwarding would: ee:ee:ee:ee:ee:ee to the pod's MAC, TTL 62.
	ret, out = e.run(t, o.PrgFastpathRx, arriving, 0)
	want := delivered.bytes()
	if ret != tcActRedirect || len(out) != len(want) || !bytes.Equal(out, want) {
		_, in := e.counters(t)
		t.Fatalf("ingress: verdict %d (%v)\n got %x\nwant %x", int32(ret), in, out, want)
	}
	// Host-side identity: the table naming another MAC for pod A (a pod claiming a neighbour's
	// address on another veth would be refused; a changed pod is re-learned) sends the flow back
	// to the normal path, untouched.
	pod.CtrMac[5]++
	if err := o.PrgFastpathEp.Put(key, pod); err != nil {
		t.Fatal(err)
	}
	_, in0 := e.counters(t)
	if ret, out := e.run(t, o.PrgFastpathRx, arriving, 0); ret != tcxNext || !bytes.Equal(out, arriving) {
		t.Fatalf("ingress to a pod that is not the learned one: verdict %d, changed %v", int32(ret), !bytes.Equal(out, arriving))
	}
	if _, in1 := e.counters(t); in1["stale"] != in0["stale"]+1 {
		t.Fatalf("not counted stale: %v -> %v", in0, in1)
	}
}
