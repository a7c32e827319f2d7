package falcon

import (
	"encoding/binary"
	"net/netip"
)

// Crafted frames for BPF_PROG_TEST_RUN. Checksums are left zero: nothing on the path checks them.

func ether(proto uint16, payload []byte) []byte {
	b := make([]byte, 14, 14+len(payload))
	copy(b[0:6], []byte{0x02, 0, 0, 0, 0, 1})
	copy(b[6:12], []byte{0x02, 0, 0, 0, 0, 2})
	binary.BigEndian.PutUint16(b[12:], proto)
	return append(b, payload...)
}

func ipv4(src, dst netip.Addr, proto uint8, payload []byte) []byte {
	b := make([]byte, 20, 20+len(payload))
	b[0] = 0x45
	binary.BigEndian.PutUint16(b[2:], uint16(20+len(payload)))
	b[8] = 64
	b[9] = proto
	s, d := src.As4(), dst.As4()
	copy(b[12:], s[:])
	copy(b[16:], d[:])
	return append(b, payload...)
}

func ipv6(src, dst netip.Addr, next uint8, payload []byte) []byte {
	b := make([]byte, 40, 40+len(payload))
	b[0] = 0x60
	binary.BigEndian.PutUint16(b[4:], uint16(len(payload)))
	b[6] = next
	b[7] = 64
	s, d := src.As16(), dst.As16()
	copy(b[8:], s[:])
	copy(b[24:], d[:])
	return append(b, payload...)
}

func l4(sport, dport uint16, payload []byte) []byte {
	b := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	binary.BigEndian.PutUint16(b[4:], uint16(8+len(payload)))
	return append(b, payload...)
}

// innerFrame is a container's frame of flow f with a small payload.
func innerFrame(f Flow) []byte {
	payload := make([]byte, 32)
	seg := l4(f.Sport, f.Dport, payload)
	if f.Proto == 6 {
		seg = append(seg, make([]byte, 12)...) // a TCP header is longer; ports are where UDP's are
	}
	if f.Src.Is4() {
		return ether(0x0800, ipv4(f.Src, f.Dst, f.Proto, seg))
	}
	return ether(0x86dd, ipv6(f.Src, f.Dst, f.Proto, seg))
}

// vxlanFrame encapsulates an inner frame as the underlay receives it.
func vxlanFrame(inner []byte, vni uint32, port uint16) []byte {
	vx := make([]byte, 8)
	vx[0] = 0x08
	binary.BigEndian.PutUint32(vx[4:], vni<<8)
	udp := l4(49152, port, append(vx, inner...))
	return ether(0x0800, ipv4(netip.MustParseAddr("198.18.0.2"), netip.MustParseAddr("198.18.0.1"), 17, udp))
}

func testFlow(i int) Flow {
	return Flow{
		Src:   netip.AddrFrom4([4]byte{198, 19, 2, byte(1 + i%200)}),
		Dst:   netip.MustParseAddr("198.19.1.2"),
		Sport: uint16(10000 + i), Dport: 5201, Proto: 17,
	}
}
