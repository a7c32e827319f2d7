package ezpath

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
)

// Test frames, built byte by byte as they appear on the wire.

var (
	macA = net.HardwareAddr{0x02, 0x42, 198, 19, 1, 2}
	macB = net.HardwareAddr{0x02, 0x42, 198, 19, 2, 2}
	ipA  = netip.MustParseAddr("198.19.1.2")
	ipB  = netip.MustParseAddr("198.19.2.2")
)

func csum16(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

func ethHdr(dst, src net.HardwareAddr, proto uint16) []byte {
	b := append(append([]byte{}, dst...), src...)
	return binary.BigEndian.AppendUint16(b, proto)
}

// ipv4 is an IPv4 header with a valid checksum followed by payload.
func ipv4(src, dst netip.Addr, proto byte, payload []byte) []byte {
	h := make([]byte, 20)
	h[0], h[8], h[9] = 0x45, 64, proto
	binary.BigEndian.PutUint16(h[2:], uint16(20+len(payload)))
	s, d := src.As4(), dst.As4()
	copy(h[12:], s[:])
	copy(h[16:], d[:])
	binary.BigEndian.PutUint16(h[10:], csum16(h))
	return append(h, payload...)
}

// tcpSeg is a TCP header (ports, data offset) and some payload.
func tcpSeg(sport, dport uint16, n int) []byte {
	b := make([]byte, 20+n)
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	b[12] = 5 << 4
	for i := 20; i < len(b); i++ {
		b[i] = byte(i)
	}
	return b
}

// innerFrame is container A's TCP frame to container B.
func innerFrame() []byte {
	return append(ethHdr(macB, macA, 0x0800), ipv4(ipA, ipB, 6, tcpSeg(40000, 5201, 64))...)
}

// tagged puts an 802.1Q tag with vid into an untagged frame.
func tagged(f []byte, vid uint16) []byte {
	b := append([]byte{}, f[:12]...)
	b = binary.BigEndian.AppendUint16(b, 0x8100)
	b = binary.BigEndian.AppendUint16(b, vid)
	return append(b, f[12:]...)
}

// vxlanFrame wraps inner in outer Ethernet/IPv4/UDP/VXLAN from src to dst VTEP.
func vxlanFrame(inner []byte, src, dst netip.Addr, vni uint32, port uint16) []byte {
	vx := make([]byte, 8)
	vx[0] = 0x08
	binary.BigEndian.PutUint32(vx[4:], vni<<8)
	udp := make([]byte, 8)
	binary.BigEndian.PutUint16(udp[0:], 50000)
	binary.BigEndian.PutUint16(udp[2:], port)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(vx)+len(inner)))
	udp = append(append(udp, vx...), inner...)
	return append(ethHdr(net.HardwareAddr{0x0e, 0x42, 198, 18, 0, 254}, net.HardwareAddr{0x0a, 0x42, 198, 18, 0, 1}, 0x0800), ipv4(src, dst, 17, udp)...)
}

// ipFor gives each container name of the planner tests its own address.
func ipFor(name string) netip.Addr {
	var i, j int
	_, _ = fmt.Sscanf(name, "h%d-c%d", &i, &j)
	return netip.AddrFrom4([4]byte{198, 19, byte(i), byte(j + 1)})
}
