package ezpath

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/peregrine-net/peregrine/internal/testutil/frames"
)

// The test containers' addresses. Test frames come from internal/testutil/frames.
var (
	ipA  = frames.Addr("198.19.1.2")
	ipB  = frames.Addr("198.19.2.2")
	macA = frames.DockerMAC(ipA)
	macB = frames.DockerMAC(ipB)
)

// tcpFrame is container A's TCP frame (n payload bytes) to dst, addressed to container B's MAC.
func tcpFrame(dst netip.Addr, sport, dport uint16, n int) []byte {
	return frames.EthMAC(macB, macA, 0x0800, frames.IPv4{Src: ipA, Dst: dst, Proto: 6}.Wrap(frames.L4(6, sport, dport, n)))
}

// innerFrame is container A's TCP frame to container B.
func innerFrame() []byte { return tcpFrame(ipB, 40000, 5201, 64) }

// vxlanFrame wraps inner in outer Ethernet/IPv4/UDP/VXLAN from src to dst VTEP.
func vxlanFrame(inner []byte, src, dst netip.Addr, vni uint32, port uint16) []byte {
	return frames.EthMAC(net.HardwareAddr{0x0e, 0x42, 198, 18, 0, 254}, net.HardwareAddr{0x0a, 0x42, 198, 18, 0, 1}, 0x0800,
		frames.IPv4{Src: src, Dst: dst, Proto: 17}.Wrap(frames.UDP(50000, port, frames.VXLAN(vni, inner))))
}

// ipFor gives each container name of the planner tests its own address.
func ipFor(name string) netip.Addr {
	var i, j int
	_, _ = fmt.Sscanf(name, "h%d-c%d", &i, &j)
	return netip.AddrFrom4([4]byte{198, 19, byte(i), byte(j + 1)})
}
