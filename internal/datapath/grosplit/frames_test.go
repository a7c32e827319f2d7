package grosplit

import (
	"encoding/binary"
	"net/netip"
)

// Frame builders for the test runs. Checksums are left zero: XDP does not look at them.

func ethHdr(proto uint16, vlans ...uint16) []byte {
	b := []byte{2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1}
	for _, v := range vlans {
		b = binary.BigEndian.AppendUint16(b, 0x8100)
		b = binary.BigEndian.AppendUint16(b, v)
	}
	return binary.BigEndian.AppendUint16(b, proto)
}

func ipv4Hdr(src, dst string, proto byte, payloadLen int, fragOff uint16) []byte {
	b := make([]byte, 20)
	b[0] = 0x45
	binary.BigEndian.PutUint16(b[2:], uint16(20+payloadLen))
	binary.BigEndian.PutUint16(b[6:], fragOff)
	b[8] = 64
	b[9] = proto
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	copy(b[12:], s[:])
	copy(b[16:], d[:])
	return b
}

func ipv6Hdr(src, dst string, next byte, payloadLen int) []byte {
	b := make([]byte, 40)
	b[0] = 0x60
	binary.BigEndian.PutUint16(b[4:], uint16(payloadLen))
	b[6] = next
	b[7] = 64
	s, d := netip.MustParseAddr(src).As16(), netip.MustParseAddr(dst).As16()
	copy(b[8:], s[:])
	copy(b[24:], d[:])
	return b
}

// l4 is a TCP (20 bytes) or UDP (8 bytes) header followed by payload.
func l4(proto byte, sport, dport uint16, payload int) []byte {
	n := 8
	if proto == 6 {
		n = 20
	}
	b := make([]byte, n+payload)
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	if proto == 17 {
		binary.BigEndian.PutUint16(b[4:], uint16(n+payload))
	} else {
		b[12] = 5 << 4
	}
	return b
}

func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

// ip4Packet is an IPv4 packet (no Ethernet) carrying a TCP or UDP header and payload.
func ip4Packet(src, dst string, proto byte, sport, dport uint16, payload int) []byte {
	seg := l4(proto, sport, dport, payload)
	return cat(ipv4Hdr(src, dst, proto, len(seg), 0), seg)
}

// plain4 is an Ethernet frame with an IPv4 TCP/UDP packet.
func plain4(src, dst string, proto byte, sport, dport uint16) []byte {
	return cat(ethHdr(0x0800), ip4Packet(src, dst, proto, sport, dport, 32))
}

// vxlan4 wraps an inner Ethernet frame in outer Ethernet/IPv4/UDP(dport)/VXLAN(vni 42).
func vxlan4(outerSport, dport uint16, inner []byte) []byte {
	vx := []byte{0x08, 0, 0, 0, 0, 0, 42, 0}
	udp := l4(17, outerSport, dport, 0)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(vx)+len(inner)))
	payload := cat(udp, vx, inner)
	return cat(ethHdr(0x0800), ipv4Hdr("198.18.0.1", "198.18.0.2", 17, len(payload), 0), payload)
}

// innerTCP4 is an inner Ethernet frame with a TCP flow between two container addresses.
func innerTCP4(sport, dport uint16) []byte {
	return cat(ethHdr(0x0800), ip4Packet("198.19.0.2", "198.19.0.3", 6, sport, dport, 64))
}
