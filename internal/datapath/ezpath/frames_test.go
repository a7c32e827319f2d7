package ezpath

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"github.com/peregrine-net/peregrine/internal/testutil/frames"
)

// The test containers' addresses.

var (
	macA = net.HardwareAddr{0x02, 0x42, 198, 19, 1, 2}
	macB = net.HardwareAddr{0x02, 0x42, 198, 19, 2, 2}
	ipA  = netip.MustParseAddr("198.19.1.2")
	ipB  = netip.MustParseAddr("198.19.2.2")
)

// Test frames come from internal/testutil/frames; these put them in the shapes the tests use.

func ethHdr(dst, src net.HardwareAddr, proto uint16) []byte {
	return frames.EthMAC(dst, src, proto, nil)
}

// ipv4 is an IPv4 header (TTL 64) with a valid checksum followed by payload.
func ipv4(src, dst netip.Addr, proto byte, payload []byte) []byte {
	return frames.IPv4{Src: src, Dst: dst, Proto: proto}.Wrap(payload)
}

// tcpSeg is a TCP header (ports, data offset) and n bytes of payload counting up.
func tcpSeg(sport, dport uint16, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(20 + i)
	}
	return frames.TCP(sport, dport, p)
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
	return frames.EthMAC(net.HardwareAddr{0x0e, 0x42, 198, 18, 0, 254}, net.HardwareAddr{0x0a, 0x42, 198, 18, 0, 1}, 0x0800,
		ipv4(src, dst, 17, frames.UDP(50000, port, frames.VXLAN(vni, inner))))
}

// ipFor gives each container name of the planner tests its own address.
func ipFor(name string) netip.Addr {
	var i, j int
	_, _ = fmt.Sscanf(name, "h%d-c%d", &i, &j)
	return netip.AddrFrom4([4]byte{198, 19, byte(i), byte(j + 1)})
}
