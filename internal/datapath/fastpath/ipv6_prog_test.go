package fastpath

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// IPv6 pods (bpf/fastpath6.h) with crafted frames: IPv6 inside the overlay, the IPv4 underlay
// outside, learned from the normal path both ways and replayed. Every program runs on "lo".

var (
	pod6A = netip.MustParseAddr("fd70:7267:0:1::2")
	pod6B = netip.MustParseAddr("fd70:7267:0:2::2")
)

// frame6 builds Ethernet + IPv6 (+ one hop-by-hop header) + TCP/UDP frames with valid checksums.
type frame6 struct {
	dst, src     net.HardwareAddr
	saddr, daddr netip.Addr
	proto        uint8
	hlim, tclass uint8
	hopByHop     bool
	frag         bool
	sport, dport uint16
	tcpFlags     uint8
	payload      []byte
}

func (f frame6) bytes() []byte {
	l4 := l4Segment(f.proto, f.sport, f.dport, f.tcpFlags) // frames_test.go
	if f.proto == 58 {
		l4 = []byte{128, 0, 0, 0, 0, 1, 0, 1} // echo request
	}
	l4 = append(l4, f.payload...)
	if f.proto == 17 {
		binary.BigEndian.PutUint16(l4[4:], uint16(len(l4)))
	}
	s, d := f.saddr.As16(), f.daddr.As16()
	var ph uint32
	for i := 0; i < 16; i += 2 {
		ph += uint32(binary.BigEndian.Uint16(s[i:])) + uint32(binary.BigEndian.Uint16(d[i:]))
	}
	if f.proto == 58 { // ICMPv6 has the pseudo header too
		binary.BigEndian.PutUint16(l4[2:], csum(l4, ph+uint32(len(l4))+58))
	} else {
		l4Checksum(l4, f.proto, ph)
	}
	var ext []byte
	next := f.proto
	if f.frag {
		ext = append([]byte{next, 0, 0, 1}, 0, 0, 0x12, 0x34) // offset 0, M=1
		next = 44
	}
	if f.hopByHop {
		ext = append([]byte{next, 0, 1, 4, 0, 0, 0, 0}, ext...) // PadN
		next = 0
	}
	hlim := f.hlim
	if hlim == 0 {
		hlim = 64
	}
	ip := make([]byte, 40)
	binary.BigEndian.PutUint32(ip[0:], 6<<28|uint32(f.tclass)<<20|0x12345)
	binary.BigEndian.PutUint16(ip[4:], uint16(len(ext)+len(l4)))
	ip[6], ip[7] = next, hlim
	copy(ip[8:], s[:])
	copy(ip[24:], d[:])
	out := append(append([]byte{}, f.dst...), f.src...)
	out = binary.BigEndian.AppendUint16(out, 0x86dd)
	return append(append(append(out, ip...), ext...), l4...)
}

// pod6Frame is a TCP segment pod A sends to pod B over IPv6.
func pod6Frame() frame6 {
	return frame6{dst: macBridge, src: macPod, saddr: pod6A, daddr: pod6B, proto: 6, sport: 40000, dport: 5201,
		tcpFlags: 0x10, payload: []byte("IPv6 inside, IPv4 outside: the fast path carries both")}
}

// reply6Frame is pod B's answer as the VXLAN device on node A decapsulates it (to flannel.1's MAC).
func reply6Frame() frame6 {
	return frame6{dst: macVxA, src: macVxB, saddr: pod6B, daddr: pod6A, proto: 6, sport: 5201, dport: 40000,
		tcpFlags: 0x10, payload: []byte("the answer")}
}

// vx6 wraps an inner frame in the outer headers node B's flannel.1 sends node A.
func vx6(inner []byte) []byte {
	return frame{dst: net.HardwareAddr{0, 0, 0, 0, 0, 0}, src: macNicB, saddr: vtepB, daddr: vtepA, proto: 17, sport: 40001,
		dport: 8472, payload: append([]byte{8, 0, 0, 0, 0, 0, 1, 0}, inner...)}.bytes()
}

// encap6 is what flannel.1 on node A sends for pod A's frame (routed: inner MACs flannel.1's).
func encap6(inner frame6) []byte {
	inner.dst, inner.src = macVxB, macVxA
	inner.hlim = 63
	b := template()
	b[62], b[63] = 0x86, 0xdd
	out := append(b[:50:50], inner.bytes()...)
	binary.BigEndian.PutUint16(out[16:], uint16(len(out)-14))
	binary.BigEndian.PutUint16(out[24:], 0)
	binary.BigEndian.PutUint16(out[24:], csum(out[14:34], 0))
	binary.BigEndian.PutUint16(out[38:], uint16(len(out)-34))
	return out
}

func key6(local, remote netip.Addr, lport, rport uint16, proto uint8) fpFpKey6 {
	var k fpFpKey6
	l, r := local.As16(), remote.As16()
	for i := range 4 {
		k.Local[i] = binary.LittleEndian.Uint32(l[4*i:])
		k.Remote[i] = binary.LittleEndian.Uint32(r[4*i:])
	}
	k.Lport, k.Rport, k.Proto = htons(lport), htons(rport), proto
	return k
}

func (e *progEnv) flow6(t *testing.T, k fpFpKey6) fpFpFlow {
	t.Helper()
	var f fpFpFlow
	if err := e.o.PrgFastpathFlow6.Lookup(k, &f); err != nil {
		t.Fatalf("flow %+v: %v", k, err)
	}
	return f
}

func (e *progEnv) putPod6(t *testing.T, addr netip.Addr, mac net.HardwareAddr, slot uint32) {
	t.Helper()
	pod := fpPrgPod{Slot: slot, Ifindex: 1}
	copy(pod.CtrMac[:], mac)
	copy(pod.BrMac[:], macBridge)
	if err := e.o.PrgFastpathPort.Put(slot, fpBpfDevmapVal{Ifindex: 1}); err != nil {
		t.Fatal(err)
	}
	k := fpPrgPodKey{Netns: e.cfg.Netns, Family: 6}
	a := addr.As16()
	for i := range 4 {
		k.Addr[i] = binary.LittleEndian.Uint32(a[4*i:])
	}
	if err := e.o.PrgFastpathEp.Put(k, pod); err != nil {
		t.Fatal(err)
	}
}

// expect runs prog on pkt and checks the verdict and that reason of direction dir (0: egress)
// counted it; it returns the frame as the program left it.
func (e *progEnv) expect(t *testing.T, what string, prog *ebpf.Program, pkt []byte, verdict uint32, dir int, reason string) []byte {
	t.Helper()
	bo, bi := e.counters(t)
	ret, out := e.run(t, prog, pkt, 0)
	ao, ai := e.counters(t)
	before, after := bo, ao
	if dir == 1 {
		before, after = bi, ai
	}
	if ret != verdict {
		t.Fatalf("%s: verdict %d, want %d (counters %v)", what, int32(ret), int32(verdict), after)
	}
	if reason != "" && after[reason] != before[reason]+1 {
		t.Fatalf("%s: counter %s %d -> %d, want +1 (all: %v)", what, reason, before[reason], after[reason], after)
	}
	if verdict == tcxNext && reason != "learned" && !bytes.Equal(out, pkt) {
		t.Fatalf("%s: the normal path's packet changed", what)
	}
	return out
}

// learn6 takes pod A's flow to pod B through the normal path both ways, as the learners see it.
func (e *progEnv) learn6(t *testing.T) {
	t.Helper()
	e.putPod6(t, pod6A, macPod, 7)
	out := pod6Frame()
	e.expect(t, "first packet out", e.o.PrgFastpathTx, out.bytes(), tcxNext, 0, "miss")
	e.expect(t, "its VXLAN frame", e.o.PrgFastpathLrnTx, encap6(out), tcxNext, 0, "learned")
	in := reply6Frame()
	e.expect(t, "first reply", e.o.PrgFastpathRx, vx6(in.bytes()), tcxNext, 1, "miss")
	in.dst, in.src, in.hlim = macPod, macBridge, 63 // as cni0 delivers it
	e.expect(t, "its delivery", e.o.PrgFastpathLrnRx, in.bytes(), tcxNext, 1, "learned")
	f := e.flow6(t, key6(pod6A, pod6B, 40000, 5201, 6))
	if f.Flags&(fOut|fIn) != fOut|fIn || f.OutTtlDec != 1 || f.InTtlDec != 1 || f.Vtep != binary.LittleEndian.Uint32(vtepB.AsSlice()) {
		t.Fatalf("flow after learning: flags %#x, hop limit changes %d/%d, vtep %x", f.Flags, f.OutTtlDec, f.InTtlDec, f.Vtep)
	}
}

// TestIPv6LearnAndHit: an IPv6 flow is learned both ways from the normal path, then pod A's
// segment leaves encapsulated in the learned IPv4 template (hop limit one lower, the rest
// byte for byte as sent) and pod B's reply is decapsulated and handed to pod A with the MACs
// cni0 used, its hop limit one lower, the rest byte for byte.
func TestIPv6LearnAndHit(t *testing.T) {
	e := newProgEnv(t)
	e.learn6(t)

	sent := pod6Frame()
	sent.tclass = 0x03 // CE: the outer header gets ECT(0)
	pkt := sent.bytes()
	out := e.expect(t, "egress hit", e.o.PrgFastpathTx, pkt, tcActRedirect, 0, "hit")
	if len(out) != len(pkt)+50 {
		t.Fatalf("%d bytes out, want %d", len(out), len(pkt)+50)
	}
	want := encap6(sent)
	// Outer Ethernet, IPv4 version..TOS (ECN aside), flags, TTL, protocol and addresses as the
	// template; lengths, ID, checksum and the UDP source port are per packet (checked below).
	if !bytes.Equal(out[:15], want[:15]) || out[15]&^3 != want[15]&^3 || !bytes.Equal(out[20:24], want[20:24]) ||
		!bytes.Equal(out[26:34], want[26:34]) || !bytes.Equal(out[36:38], want[36:38]) {
		t.Fatalf("outer headers\n got %x\nwant %x", out[:64], want[:64])
	}
	if binary.BigEndian.Uint16(out[16:]) != uint16(len(out)-14) || csum(out[14:34], 0) != 0 || out[15]&3 != 2 {
		t.Fatalf("outer IPv4 length, checksum or ECN wrong: %x", out[14:34])
	}
	if binary.BigEndian.Uint16(out[38:]) != uint16(len(out)-34) || binary.BigEndian.Uint16(out[40:]) != 0 {
		t.Fatalf("outer UDP length or checksum wrong: %x", out[34:42])
	}
	if !bytes.Equal(out[42:64], want[42:64]) {
		t.Fatalf("VXLAN header or inner Ethernet\n got %x\nwant %x", out[42:64], want[42:64])
	}
	inner := out[64:]
	if inner[7] != 63 || !bytes.Equal(inner[:7], pkt[14:21]) || !bytes.Equal(inner[8:], pkt[22:]) {
		t.Fatalf("inner IPv6 packet: hop limit %d (want 63) or other bytes changed", inner[7])
	}

	reply := reply6Frame()
	rpkt := vx6(reply.bytes())
	got := e.expect(t, "ingress hit", e.o.PrgFastpathRx, rpkt, tcActRedirect, 1, "hit")
	reply.dst, reply.src, reply.hlim = macPod, macBridge, 63
	if w := reply.bytes(); !bytes.Equal(got, w) {
		t.Fatalf("delivered frame\n got %x\nwant %x", got, w)
	}
	// The IPv4 table saw none of it.
	if n := countEntries(t, e.o.PrgFastpathFlow); n != 0 {
		t.Fatalf("%d IPv4 flows after an IPv6 exchange", n)
	}
}

func countEntries(t *testing.T, m *ebpf.Map) int {
	t.Helper()
	n := 0
	var k, v []byte
	it := m.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestIPv6Fallbacks: IPv6 frames that must stay on the normal path with the flow learned, each
// counted under its reason and untouched.
func TestIPv6Fallbacks(t *testing.T) {
	e := newProgEnv(t)
	e.learn6(t)
	hbh := pod6Frame()
	hbh.hopByHop = true
	frag := pod6Frame()
	frag.frag = true
	icmp := pod6Frame()
	icmp.proto = 58
	syn := pod6Frame()
	syn.tcpFlags = 0x02
	fin := pod6Frame()
	fin.tcpFlags = 0x11
	hop1 := pod6Frame()
	hop1.hlim = 1
	other := pod6Frame()
	other.dport = 9999
	mcast := pod6Frame()
	mcast.dst = net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}
	big := pod6Frame()
	big.payload = make([]byte, 1450-40-20+1) // one byte over the overlay MTU
	udp := pod6Frame()
	udp.proto = 17 // not learned: a flow of its own
	for _, c := range []struct {
		name, reason string
		f            frame6
	}{
		{"hop-by-hop header", "ip-options", hbh}, {"fragment", "fragment", frag}, {"icmpv6", "proto", icmp},
		{"tcp syn", "proto", syn}, {"tcp fin", "proto", fin}, {"hop limit expires", "ttl", hop1},
		{"first packet", "miss", other}, {"multicast", "l2", mcast}, {"over mtu", "mtu", big}, {"udp", "miss", udp},
	} {
		t.Run(c.name, func(t *testing.T) {
			e.expect(t, c.name, e.o.PrgFastpathTx, c.f.bytes(), tcxNext, 0, c.reason)
		})
	}
	// Ingress: a reply whose hop limit would expire, one to a pod that is not here, one from
	// another VTEP than the flow's.
	r1 := reply6Frame()
	r1.hlim = 1
	e.expect(t, "ingress hop limit", e.o.PrgFastpathRx, vx6(r1.bytes()), tcxNext, 1, "ttl")
	moved := vx6(reply6Frame().bytes())
	copy(moved[26:30], netip.MustParseAddr("198.18.0.3").AsSlice())
	binary.BigEndian.PutUint16(moved[24:], 0)
	binary.BigEndian.PutUint16(moved[24:], csum(moved[14:34], 0))
	e.expect(t, "remote moved", e.o.PrgFastpathRx, moved, tcxNext, 1, "stale")
	if err := e.o.PrgFastpathEp.Delete(fpPrgPodKey{Netns: e.cfg.Netns, Family: 6, Addr: key6(pod6A, pod6B, 0, 0, 0).Local}); err != nil {
		t.Fatal(err)
	}
	// The "remote moved" reply re-learns: make the flow's VTEP B's again first.
	f := e.flow6(t, key6(pod6A, pod6B, 40000, 5201, 6))
	f.Vtep = binary.LittleEndian.Uint32(vtepB.AsSlice())
	f.Flags |= fIn
	f.InNs = monoNs()
	if err := e.o.PrgFastpathFlow6.Put(key6(pod6A, pod6B, 40000, 5201, 6), f); err != nil {
		t.Fatal(err)
	}
	e.expect(t, "pod gone", e.o.PrgFastpathRx, vx6(reply6Frame().bytes()), tcxNext, 1, "no-pod")
}

// TestIPv6SynLearnsFinCloses: a SYN is handed over (and learned at the far end, so the
// connection is fast from its third packet); a FIN stays on the normal path and marks the entry
// closing (it goes 2 s later).
func TestIPv6SynLearnsFinCloses(t *testing.T) {
	e := newProgEnv(t)
	e.putPod6(t, pod6A, macPod, 100) // the sender, listed on its veth (src_refused6)
	syn := pod6Frame()
	syn.tcpFlags = 0x02
	e.expect(t, "syn", e.o.PrgFastpathTx, syn.bytes(), tcxNext, 0, "proto")
	e.expect(t, "its VXLAN frame", e.o.PrgFastpathLrnTx, encap6(syn), tcxNext, 0, "learned")
	k := key6(pod6A, pod6B, 40000, 5201, 6)
	if f := e.flow6(t, k); f.Flags&fOut == 0 {
		t.Fatalf("SYN not learned: flags %#x", f.Flags)
	}
	fin := pod6Frame()
	fin.tcpFlags = 0x11
	// Learned from its SYN (fHsOnly), the FIN would ride the fast path as IPv4's does, but
	// the flow is not learned both ways: the normal path's ("miss"), as any such packet.
	if f := e.flow6(t, k); f.Flags&fHsOnly == 0 {
		t.Fatalf("SYN-learned flow not handshake-only: flags %#x", f.Flags)
	}
	e.expect(t, "fin", e.o.PrgFastpathTx, fin.bytes(), tcxNext, 0, "miss")
	if f := e.flow6(t, k); f.Flags&fClosing == 0 || f.Flags&fFinOut == 0 {
		t.Fatalf("FIN did not mark the entry closing: flags %#x", f.Flags)
	}
	e.expect(t, "fin's VXLAN frame", e.o.PrgFastpathLrnTx, encap6(fin), tcxNext, 0, "")
	// The sweep (its own timer, armed by the first IPv6 flow) deletes the closed entry 2 s
	// after its FIN and counts it down in pod A's counter (its IPv6 key).
	pk := pcnt6Key(k)
	var n uint32
	if err := e.o.PrgFastpathPcnt.Lookup(pk, &n); err != nil || n != 1 {
		t.Fatalf("pod A's IPv6 flow counter: %d (%v), want 1", n, err)
	}
	deadline := time.Now().Add(4 * time.Second)
	for {
		var f fpFpFlow
		err := e.o.PrgFastpathFlow6.Lookup(k, &f)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("closed connection's entry still there 4 s after its FIN: %+v", f)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := e.o.PrgFastpathPcnt.Lookup(pk, &n); err != nil || n != 0 {
		t.Fatalf("pod A's IPv6 flow counter after the expiry: %d (%v), want 0", n, err)
	}
}
