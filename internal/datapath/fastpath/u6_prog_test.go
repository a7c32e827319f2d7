package fastpath

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
)

// The receiving half over an IPv6 underlay (bpf/fastpath_u6.h) with crafted frames: pod B's
// reply arrives as real flannel's flannel-v6.1 sends it (outer IPv6 + UDP with its checksum +
// VXLAN), is decapsulated byte-exact for a learned flow, and everything else is left as it came.

var (
	vtep6A  = netip.MustParseAddr("fd00:7267::a")
	vtep6B  = netip.MustParseAddr("fd00:7267::b")
	macVx6A = net.HardwareAddr{0x06, 0, 0, 0, 0, 0x61}
	macVx6B = net.HardwareAddr{0x06, 0, 0, 0, 0, 0x62}
)

// u6opts shapes an outer frame: an extension header, a fragment, a port, a zero checksum.
type u6opts struct {
	hopByHop, frag, zeroCsum bool
	dport                    uint16
}

// vxu6 wraps inner in the outer IPv6/UDP/VXLAN headers src's flannel-v6.1 sends to dst.
func vxu6(inner []byte, src, dst netip.Addr, o u6opts) []byte {
	if o.dport == 0 {
		o.dport = 8472
	}
	udp := make([]byte, 8)
	binary.BigEndian.PutUint16(udp[0:], 40001)
	binary.BigEndian.PutUint16(udp[2:], o.dport)
	udp = append(append(udp, 8, 0, 0, 0, 0, 0, 1, 0), inner...)
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	s, d := src.As16(), dst.As16()
	var ph uint32
	for i := 0; i < 16; i += 2 {
		ph += uint32(binary.BigEndian.Uint16(s[i:])) + uint32(binary.BigEndian.Uint16(d[i:]))
	}
	if !o.zeroCsum {
		c := csum(udp, ph+uint32(len(udp))+17)
		if c == 0 {
			c = 0xffff
		}
		binary.BigEndian.PutUint16(udp[6:], c)
	}
	var ext []byte
	next := uint8(17)
	if o.frag {
		ext = []byte{next, 0, 0, 0, 0, 0, 0x12, 0x34} // offset 0, M=0: an atomic fragment
		next = 44
	}
	if o.hopByHop {
		ext = append([]byte{next, 0, 1, 4, 0, 0, 0, 0}, ext...)
		next = 0
	}
	ip := make([]byte, 40)
	binary.BigEndian.PutUint32(ip[0:], 6<<28)
	binary.BigEndian.PutUint16(ip[4:], uint16(len(ext)+len(udp)))
	ip[6], ip[7] = next, 64
	copy(ip[8:], s[:])
	copy(ip[24:], d[:])
	out := append(append([]byte{}, net.HardwareAddr{0, 0, 0, 0, 0, 0}...), macNicB...)
	out = binary.BigEndian.AppendUint16(out, 0x86dd)
	return append(append(append(out, ip...), ext...), udp...)
}

func (e *progEnv) putU6(t *testing.T) {
	t.Helper()
	var u fpFpU6cfg
	a := vtep6A.As16()
	for i := range 4 {
		u.Vtep[i] = binary.LittleEndian.Uint32(a[4*i:])
	}
	copy(u.VxMac[:], macVx6A)
	if err := e.o.PrgFastpathU6cfg.Put(uint32(0), u); err != nil {
		t.Fatal(err)
	}
}

// TestIPv6UnderlayReceive: pod A's flow to pod B over flannel-v6.1. The reply is learned from
// the normal path's delivery, then decapsulated on the fast path byte-exact. A wrong outer
// source, outer extension headers and fragments, another port and a zero checksum fall back.
func TestIPv6UnderlayReceive(t *testing.T) {
	e := newProgEnv(t)
	e.putPod6(t, pod6A, macPod, 7)
	reply := func() frame6 {
		f := reply6Frame()
		f.dst, f.src = macVx6A, macVx6B
		return f
	}
	in := reply().bytes()

	// Before the agent sets the local IPv6 VTEP nothing of it is touched.
	e.expect(t, "no IPv6 VTEP", e.o.PrgFastpathRx, vxu6(in, vtep6B, vtep6A, u6opts{}), tcxNext, 1, "other")
	e.putU6(t)

	out := pod6Frame()
	e.expect(t, "first packet out", e.o.PrgFastpathTx, out.bytes(), tcxNext, 0, "miss")
	sent := out
	sent.dst, sent.src, sent.hlim = macVx6B, macVx6A, 63
	e.expect(t, "its VXLAN frame over IPv6", e.o.PrgFastpathLrnTx, vxu6(sent.bytes(), vtep6A, vtep6B, u6opts{}), tcxNext, 0, "")
	e.expect(t, "first reply", e.o.PrgFastpathRx, vxu6(in, vtep6B, vtep6A, u6opts{}), tcxNext, 1, "miss")
	d := reply()
	d.dst, d.src, d.hlim = macPod, macBridge, 63 // as cni0 delivers it
	e.expect(t, "its delivery", e.o.PrgFastpathLrnRx, d.bytes(), tcxNext, 1, "learned")

	// A forged outer source: refused, and it does not become the flow's VTEP.
	e.expect(t, "wrong outer source", e.o.PrgFastpathRx, vxu6(in, vtep6A, vtep6A, u6opts{}), tcxNext, 1, "stale")
	e.expect(t, "outer hop-by-hop", e.o.PrgFastpathRx, vxu6(in, vtep6B, vtep6A, u6opts{hopByHop: true}), tcxNext, 1, "ip-options")
	e.expect(t, "outer fragment header", e.o.PrgFastpathRx, vxu6(in, vtep6B, vtep6A, u6opts{frag: true}), tcxNext, 1, "fragment")
	e.expect(t, "another UDP port", e.o.PrgFastpathRx, vxu6(in, vtep6B, vtep6A, u6opts{dport: 4789}), tcxNext, 1, "other")
	e.expect(t, "zero outer checksum", e.o.PrgFastpathRx, vxu6(in, vtep6B, vtep6A, u6opts{zeroCsum: true}), tcxNext, 1, "other")
	e.expect(t, "to another address", e.o.PrgFastpathRx, vxu6(in, vtep6B, vtep6B, u6opts{}), tcxNext, 1, "other")
	wrongMAC := reply()
	wrongMAC.dst = macVxA // flannel.1's MAC, not flannel-v6.1's
	e.expect(t, "inner MAC not the device's", e.o.PrgFastpathRx, vxu6(wrongMAC.bytes(), vtep6B, vtep6A, u6opts{}), tcxNext, 1, "l2")

	got := e.expect(t, "receive hit", e.o.PrgFastpathRx, vxu6(in, vtep6B, vtep6A, u6opts{}), tcActRedirect, 1, "hit")
	if w := d.bytes(); !bytes.Equal(got, w) {
		t.Fatalf("delivered frame\n got %x\nwant %x", got, w)
	}
	// The egress direction was learned too, but without flannel-v6.1's ifindex (the agent's,
	// prg_fastpath_u6dev) it stays the normal path's.
	e.expect(t, "egress without the device", e.o.PrgFastpathTx, out.bytes(), tcxNext, 0, "unsupported")
	if n := countEntries(t, e.o.PrgFastpathFlow); n != 0 {
		t.Fatalf("%d IPv4 flows after an IPv6 exchange", n)
	}

	// Served on receive only while learned both ways, as over the IPv4 underlay: a flow whose
	// egress was not learned (the pod never sent through the normal path) stays there.
	k := key6(pod6A, pod6B, 40000, 5201, 6)
	f := e.flow6(t, k)
	f.Flags &^= fOut
	if err := e.o.PrgFastpathFlow6.Put(k, f); err != nil {
		t.Fatal(err)
	}
	e.expect(t, "a flow learned inbound only", e.o.PrgFastpathRx, vxu6(in, vtep6B, vtep6A, u6opts{}), tcxNext, 1, "miss")
}
