package prism

import (
	"encoding/binary"
	"net"
	"net/netip"
)

// Frame builders for the test runs: inner frames as the VXLAN device hands them to tc.

type frame struct {
	dst, src net.HardwareAddr
	vlan     bool
	v6       bool
	saddr    string
	daddr    string
	proto    byte
	sport    uint16
	dport    uint16
	tos      byte
	ttl      byte
	fragOff  uint16 // IPv4 flags+offset field; IPv6: nonzero adds a fragment header
	hbh      bool   // IPv6: a hop-by-hop options header before L4
	payload  int
}

func ipChecksum(h []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(h); i += 2 {
		s += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

func (f frame) l4() []byte {
	n := 8
	if f.proto == 6 {
		n = 20
	}
	b := make([]byte, n+f.payload)
	binary.BigEndian.PutUint16(b[0:], f.sport)
	binary.BigEndian.PutUint16(b[2:], f.dport)
	if f.proto == 6 {
		b[12] = 5 << 4
	} else {
		binary.BigEndian.PutUint16(b[4:], uint16(n+f.payload))
	}
	for i := n; i < len(b); i++ {
		b[i] = byte(i)
	}
	return b
}

func (f frame) bytes() []byte {
	if f.ttl == 0 {
		f.ttl = 64
	}
	b := append([]byte{}, f.dst...)
	b = append(b, f.src...)
	if f.vlan {
		b = binary.BigEndian.AppendUint16(b, 0x8100)
		b = binary.BigEndian.AppendUint16(b, 100)
	}
	l4 := f.l4()
	if !f.v6 {
		b = binary.BigEndian.AppendUint16(b, 0x0800)
		h := make([]byte, 20)
		h[0], h[1] = 0x45, f.tos
		binary.BigEndian.PutUint16(h[2:], uint16(20+len(l4)))
		binary.BigEndian.PutUint16(h[4:], 0x1234)
		binary.BigEndian.PutUint16(h[6:], f.fragOff)
		h[8], h[9] = f.ttl, f.proto
		s, d := netip.MustParseAddr(f.saddr).As4(), netip.MustParseAddr(f.daddr).As4()
		copy(h[12:], s[:])
		copy(h[16:], d[:])
		binary.BigEndian.PutUint16(h[10:], ipChecksum(h))
		return append(append(b, h...), l4...)
	}
	b = binary.BigEndian.AppendUint16(b, 0x86dd)
	var ext []byte
	next := f.proto
	if f.fragOff != 0 {
		ext = append([]byte{next, 0}, 0, 1, 0, 0, 0, 7) // offset 0, M=1, id 7
		next = 44
	}
	if f.hbh {
		ext = append([]byte{next, 0, 1, 4, 0, 0, 0, 0}, ext...) // PadN
		next = 0
	}
	h := make([]byte, 40)
	h[0] = 0x60 | f.tos>>4
	h[1] = f.tos << 4
	binary.BigEndian.PutUint16(h[4:], uint16(len(ext)+len(l4)))
	h[6], h[7] = next, f.ttl
	s, d := netip.MustParseAddr(f.saddr).As16(), netip.MustParseAddr(f.daddr).As16()
	copy(h[8:], s[:])
	copy(h[24:], d[:])
	return append(append(append(b, h...), ext...), l4...)
}

// routed is the frame as IP forwarding out of the bridge delivers it: new MACs, TTL/hop
// limit one less, IPv4 header checksum recomputed from scratch (not incrementally, so the
// program's incremental update is checked against an independent computation).
func (f frame) routed(ctrMAC, brMAC net.HardwareAddr) []byte {
	if f.ttl == 0 {
		f.ttl = 64
	}
	f.ttl--
	f.dst, f.src = ctrMAC, brMAC
	return f.bytes()
}
