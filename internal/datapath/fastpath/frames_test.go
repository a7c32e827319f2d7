package fastpath

import (
	"encoding/binary"
	"net"
	"net/netip"
)

// frame builds test frames: Ethernet + IPv4 (+ options) + TCP/UDP/ICMP echo with valid checksums.
type frame struct {
	dst, src     net.HardwareAddr
	ethType      uint16
	saddr, daddr netip.Addr
	proto        uint8
	ttl, tos     uint8
	fragOff      uint16 // flags+offset field
	options      []byte // IPv4 options (multiple of 4)
	sport, dport uint16
	tcpFlags     uint8
	payload      []byte
}

func csum(b []byte, initial uint32) uint16 {
	s := initial
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

func (f frame) bytes() []byte {
	et := f.ethType
	if et == 0 {
		et = 0x0800
	}
	out := append(append([]byte{}, f.dst...), f.src...)
	out = binary.BigEndian.AppendUint16(out, et)
	if et != 0x0800 {
		return append(out, f.payload...)
	}
	l4 := l4Segment(f.proto, f.sport, f.dport, f.tcpFlags)
	if f.proto == 1 {
		l4 = []byte{8, 0, 0, 0, 0, 0, 0, 1}
		binary.BigEndian.PutUint16(l4[4:], f.sport)
	}
	l4 = append(l4, f.payload...)
	if f.proto == 17 {
		binary.BigEndian.PutUint16(l4[4:], uint16(len(l4)))
	}
	ttl := f.ttl
	if ttl == 0 {
		ttl = 64
	}
	ihl := 20 + len(f.options)
	ip := make([]byte, 20, ihl)
	ip[0] = 0x40 | byte(ihl/4)
	ip[1] = f.tos
	binary.BigEndian.PutUint16(ip[2:], uint16(ihl+len(l4)))
	binary.BigEndian.PutUint16(ip[4:], 0x1234)
	binary.BigEndian.PutUint16(ip[6:], f.fragOff)
	ip[8], ip[9] = ttl, f.proto
	s, d := f.saddr.As4(), f.daddr.As4()
	copy(ip[12:], s[:])
	copy(ip[16:], d[:])
	ip = append(ip, f.options...)
	binary.BigEndian.PutUint16(ip[10:], csum(ip, 0))
	// L4 checksum over the pseudo header.
	var ph uint32
	ph += uint32(binary.BigEndian.Uint16(s[0:])) + uint32(binary.BigEndian.Uint16(s[2:]))
	ph += uint32(binary.BigEndian.Uint16(d[0:])) + uint32(binary.BigEndian.Uint16(d[2:]))
	if f.proto == 1 {
		binary.BigEndian.PutUint16(l4[2:], csum(l4, 0))
	} else {
		l4Checksum(l4, f.proto, ph)
	}
	return append(append(out, ip...), l4...)
}

// l4Segment is the TCP (20 bytes, no options) or UDP header the IPv4 and IPv6 frames of the
// tests carry, checksum 0 (l4Checksum), a UDP length to be set once the payload is known; nil
// for another protocol.
func l4Segment(proto uint8, sport, dport uint16, tcpFlags uint8) []byte {
	var l4 []byte
	switch proto {
	case 6:
		l4 = make([]byte, 20)
		binary.BigEndian.PutUint32(l4[4:], 1000)
		binary.BigEndian.PutUint32(l4[8:], 2000)
		l4[12] = 5 << 4
		l4[13] = tcpFlags
		binary.BigEndian.PutUint16(l4[14:], 65000)
	case 17:
		l4 = make([]byte, 8)
	default:
		return nil
	}
	binary.BigEndian.PutUint16(l4[0:], sport)
	binary.BigEndian.PutUint16(l4[2:], dport)
	return l4
}

// l4Checksum sets the TCP or UDP checksum of segment l4 (header and payload) over pseudo
// header sum ph, to which it adds the protocol and the length (either family's pseudo header).
func l4Checksum(l4 []byte, proto uint8, ph uint32) {
	ph += uint32(proto) + uint32(len(l4))
	switch proto {
	case 6:
		binary.BigEndian.PutUint16(l4[16:], csum(l4, ph))
	case 17:
		binary.BigEndian.PutUint16(l4[6:], csum(l4, ph))
	}
}

var (
	macPod    = net.HardwareAddr{0x02, 0, 0, 0, 1, 2}
	macBridge = net.HardwareAddr{0x02, 0, 0, 0, 1, 1}
	podA      = netip.MustParseAddr("198.19.1.2")
	podB      = netip.MustParseAddr("198.19.2.2")
)

// podFrame is a TCP segment pod A sends to pod B through its veth (to the bridge's MAC).
func podFrame() frame {
	return frame{dst: macBridge, src: macPod, saddr: podA, daddr: podB, proto: 6, sport: 40000, dport: 5201,
		tcpFlags: 0x10, payload: make([]byte, 100)}
}
