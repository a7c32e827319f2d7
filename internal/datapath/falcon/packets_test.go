package falcon

import (
	"net/netip"

	"github.com/peregrine-net/peregrine/internal/testutil/frames"
)

// Crafted frames for BPF_PROG_TEST_RUN (internal/testutil/frames).

func ether(proto uint16, payload []byte) []byte { return frames.Eth(proto, payload) }

func ipv4(src, dst netip.Addr, proto uint8, payload []byte) []byte {
	return frames.IPv4{Src: src, Dst: dst, Proto: proto}.Wrap(payload)
}

func ipv6(src, dst netip.Addr, next uint8, payload []byte) []byte {
	return frames.IPv6{Src: src, Dst: dst, Next: next}.Wrap(payload)
}

func l4(sport, dport uint16, payload []byte) []byte { return frames.UDP(sport, dport, payload) }

// innerFrame is a container's frame of flow f with a small payload.
func innerFrame(f Flow) []byte {
	seg := frames.L4(f.Proto, f.Sport, f.Dport, 32)
	if f.Src.Is4() {
		return ether(0x0800, ipv4(f.Src, f.Dst, f.Proto, seg))
	}
	return ether(0x86dd, ipv6(f.Src, f.Dst, f.Proto, seg))
}

// vxlanFrame encapsulates an inner frame as the underlay receives it.
func vxlanFrame(inner []byte, vni uint32, port uint16) []byte {
	return frames.Encap(49152, port, vni, inner)
}

func testFlow(i int) Flow {
	return Flow{
		Src:   netip.AddrFrom4([4]byte{198, 19, 2, byte(1 + i%200)}),
		Dst:   netip.MustParseAddr("198.19.1.2"),
		Sport: uint16(10000 + i), Dport: 5201, Proto: 17,
	}
}
