// Package frames builds packets for BPF_PROG_TEST_RUN and the parser model: each function wraps a
// payload in one header, so a test writes a frame outside in, e.g.
//
//	frames.Eth(0x0800, frames.IPv4{Src: a, Dst: b, Proto: 17}.Wrap(frames.UDP(1000, 53, nil)))
//
// Lengths are filled in; the IPv4 header checksum too (the programs that rewrite a header check
// it); L4 checksums stay zero (nothing on the test path checks them).
package frames

import (
	"encoding/binary"
	"net"
	"net/netip"
)

// Test MACs: the source and destination an Eth header gets unless EthMAC is used.
var (
	SrcMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 1}
	DstMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 2}
)

// Addr parses an address literal (a test constant).
func Addr(s string) netip.Addr { return netip.MustParseAddr(s) }

// DockerMAC is the MAC docker gives a container with IPv4 address a: 02:42 and the address.
func DockerMAC(a netip.Addr) net.HardwareAddr {
	b := a.As4()
	return net.HardwareAddr{0x02, 0x42, b[0], b[1], b[2], b[3]}
}

// Eth puts an Ethernet header with the test MACs, VLAN tags (802.1Q) and ethertype before payload.
func Eth(proto uint16, payload []byte, vlans ...uint16) []byte {
	return EthMAC(DstMAC, SrcMAC, proto, payload, vlans...)
}

// EthMAC is Eth with given MACs.
func EthMAC(dst, src net.HardwareAddr, proto uint16, payload []byte, vlans ...uint16) []byte {
	b := append(append([]byte{}, dst...), src...)
	for _, v := range vlans {
		b = binary.BigEndian.AppendUint16(b, 0x8100)
		b = binary.BigEndian.AppendUint16(b, v)
	}
	b = binary.BigEndian.AppendUint16(b, proto)
	return append(b, payload...)
}

// Tag inserts an 802.1Q tag with vid after the MACs of a built frame (of at least 12 bytes).
func Tag(f []byte, vid uint16) []byte {
	b := append([]byte{}, f[:12]...)
	b = binary.BigEndian.AppendUint16(b, 0x8100)
	b = binary.BigEndian.AppendUint16(b, vid)
	return append(b, f[12:]...)
}

// IPv4 is an IPv4 header without options. TTL 0 means 64.
type IPv4 struct {
	Src, Dst   netip.Addr
	Proto, TOS byte
	TTL        byte
	FragOff    uint16 // flags and fragment offset field (0x2000 = MF)
	ID         uint16
}

// Wrap puts the header before payload.
func (h IPv4) Wrap(payload []byte) []byte {
	if h.TTL == 0 {
		h.TTL = 64
	}
	b := make([]byte, 20, 20+len(payload))
	b[0], b[1], b[8], b[9] = 0x45, h.TOS, h.TTL, h.Proto
	binary.BigEndian.PutUint16(b[2:], uint16(20+len(payload)))
	binary.BigEndian.PutUint16(b[4:], h.ID)
	binary.BigEndian.PutUint16(b[6:], h.FragOff)
	s, d := h.Src.As4(), h.Dst.As4()
	copy(b[12:], s[:])
	copy(b[16:], d[:])
	binary.BigEndian.PutUint16(b[10:], Checksum(b))
	return append(b, payload...)
}

// IPv6 is an IPv6 header. Next is the first header after it (an extension header's number when
// Ext holds extension headers, which go between it and the payload). HopLimit 0 means 64.
type IPv6 struct {
	Src, Dst     netip.Addr
	Next, TClass byte
	HopLimit     byte
	Ext          []byte
}

// Wrap puts the header (and Ext) before payload.
func (h IPv6) Wrap(payload []byte) []byte {
	if h.HopLimit == 0 {
		h.HopLimit = 64
	}
	b := make([]byte, 40, 40+len(h.Ext)+len(payload))
	b[0], b[1], b[6], b[7] = 0x60|h.TClass>>4, h.TClass<<4, h.Next, h.HopLimit
	binary.BigEndian.PutUint16(b[4:], uint16(len(h.Ext)+len(payload)))
	s, d := h.Src.As16(), h.Dst.As16()
	copy(b[8:], s[:])
	copy(b[24:], d[:])
	return append(append(b, h.Ext...), payload...)
}

// Ext is an 8-byte IPv6 extension header (hop-by-hop, routing, destination options with PadN,
// or a fragment header) whose next header is next.
func Ext(next byte) []byte { return []byte{next, 0, 1, 4, 0, 0, 0, 0} }

// UDP is a UDP header (length filled) before payload.
func UDP(sport, dport uint16, payload []byte) []byte {
	b := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(b, sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	binary.BigEndian.PutUint16(b[4:], uint16(8+len(payload)))
	return append(b, payload...)
}

// TCP is a 20-byte TCP header before payload.
func TCP(sport, dport uint16, payload []byte) []byte {
	b := make([]byte, 20, 20+len(payload))
	binary.BigEndian.PutUint16(b, sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	b[12] = 5 << 4
	return append(b, payload...)
}

// L4 is a TCP header for proto 6, else a UDP-shaped one, before n payload bytes.
func L4(proto byte, sport, dport uint16, n int) []byte {
	if proto == 6 {
		return TCP(sport, dport, make([]byte, n))
	}
	return UDP(sport, dport, make([]byte, n))
}

// VXLAN is a VXLAN header (I flag set, vni) before the inner frame.
func VXLAN(vni uint32, inner []byte) []byte {
	b := make([]byte, 8, 8+len(inner))
	b[0] = 0x08
	binary.BigEndian.PutUint32(b[4:], vni<<8)
	return append(b, inner...)
}

// Underlay addresses of the encapsulated frames (the lab's RFC 2544 range).
var (
	RemoteVTEP = Addr("198.18.0.2")
	LocalVTEP  = Addr("198.18.0.1")
)

// Encap is an inner frame as the underlay receives it: Ethernet/IPv4/UDP(sport, dport)/VXLAN(vni).
func Encap(sport, dport uint16, vni uint32, inner []byte) []byte {
	return Eth(0x0800, IPv4{Src: RemoteVTEP, Dst: LocalVTEP, Proto: 17}.Wrap(UDP(sport, dport, VXLAN(vni, inner))))
}

// Checksum is the Internet checksum of b (an IPv4 header with its checksum field zero).
func Checksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}
