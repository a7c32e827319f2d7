package fastpath

import (
	"math/rand/v2"
	"net"
	"net/netip"

	"github.com/peregrine-net/peregrine/internal/testutil/frames"
)

// fzGen makes frames for the fast path: pod traffic of the cached flows and others (tx), the
// same inside VXLAN of our overlay or nearly (rx, learners), random frames, and any of them
// damaged once.
type fzGen struct{ rng *rand.Rand }

func (g fzGen) pick(s []netip.Addr) netip.Addr { return s[g.rng.IntN(len(s))] }

// inner is an IPv4 TCP/UDP/ICMP echo frame from src to dst; ports of a cached flow mostly.
func (g fzGen) inner(dmac net.HardwareAddr, src, dst netip.Addr, outbound bool) []byte {
	rng := g.rng
	flows := []struct {
		proto        uint8
		lport, rport uint16
	}{{6, 40000, 5201}, {17, 53000, 53}, {1, 77, 77}, {6, 40001, 5201}, {47, 0, 0}}
	c := flows[rng.IntN(len(flows))]
	sport, dport := c.lport, c.rport
	if !outbound {
		sport, dport = dport, sport
	}
	n := rng.IntN(120)
	if rng.IntN(8) == 0 {
		n = 1380 + rng.IntN(160) // around the MTU
	}
	var l4 []byte
	switch c.proto {
	case 6:
		l4 = frames.TCP(sport, dport, make([]byte, n))
		l4[13] = 0x10
		if rng.IntN(6) == 0 {
			l4[13] = byte(rng.Uint32())
		}
	case 17:
		l4 = frames.UDP(sport, dport, make([]byte, n))
	case 1:
		l4 = append([]byte{8, 0, 0, 0, 0, 77, 0, 1}, make([]byte, n)...)
		if !outbound {
			l4[0] = 0
		}
		if rng.IntN(6) == 0 {
			l4[0], l4[1] = byte(rng.IntN(16)), byte(rng.IntN(2))
		}
	default:
		l4 = make([]byte, 8+n)
	}
	ttls := []uint8{1, 2, 3, 64, 255}
	h := frames.IPv4{Src: src, Dst: dst, Proto: c.proto, TTL: ttls[rng.IntN(len(ttls))], TOS: byte(rng.Uint32()), ID: uint16(rng.Uint32())}
	if rng.IntN(20) == 0 {
		h.FragOff = 0x2000
	}
	return frames.EthMAC(dmac, macPod, 0x0800, h.Wrap(l4))
}

// tx is a frame a local pod sends.
func (g fzGen) tx() []byte {
	rng := g.rng
	if rng.IntN(8) == 0 {
		return frames.Random(rng, []uint16{fzPort})
	}
	dmac := macBridge
	if rng.IntN(20) == 0 {
		dmac = net.HardwareAddr{0x01, 0, 0x5e, 0, 0, 1}
	}
	src, dst := g.pick(fzLocal), g.pick(fzRemote)
	if rng.IntN(10) == 0 {
		src, dst = dst, src
	}
	f := g.inner(dmac, src, dst, true)
	if rng.IntN(20) == 0 {
		f = frames.IPv4Options(f, 14, []byte{1, 1, 1, 0})
	}
	if rng.IntN(3) == 0 {
		f = frames.Mutate(rng, f, 14+20+20)
	}
	return f
}

// rx is a frame from a remote pod to a local one, addressed to a local pod's MAC, as a
// decapsulating VXLAN device hands it on; or a random frame.
func (g fzGen) rx() []byte {
	rng := g.rng
	if rng.IntN(8) == 0 {
		return frames.Random(rng, []uint16{fzPort})
	}
	dmac := podMAC(rng.IntN(len(fzLocal)))
	f := g.inner(dmac, g.pick(fzRemote), g.pick(fzLocal), false)
	if rng.IntN(3) == 0 {
		f = frames.Mutate(rng, f, 14+20+20)
	}
	return f
}

// encap is a frame on the underlay from src VTEP to dst VTEP carrying a pod frame from a remote
// pod to a local one (in) or the other way (out).
func (g fzGen) encap(srcVTEP, dstVTEP netip.Addr, in bool) []byte {
	rng := g.rng
	if rng.IntN(10) == 0 {
		return frames.Random(rng, []uint16{fzPort})
	}
	src, dst := g.pick(fzRemote), g.pick(fzLocal)
	if !in {
		src, dst = dst, src
	}
	dmac := macVxA
	if rng.IntN(15) == 0 {
		dmac = macPod
	}
	if !in {
		dmac = macVxB
	}
	vni, port := uint32(fzVNI), uint16(fzPort)
	if rng.IntN(15) == 0 {
		vni = uint32(rng.IntN(3))
	}
	if rng.IntN(15) == 0 {
		port = 4789
	}
	if rng.IntN(15) == 0 {
		srcVTEP = fzVtepX
	}
	omac := fzLoMAC
	if rng.IntN(15) == 0 {
		omac = macNicA
	}
	h := frames.IPv4{Src: srcVTEP, Dst: dstVTEP, Proto: 17, ID: uint16(rng.Uint32())}
	if rng.IntN(30) == 0 {
		h.FragOff = 0x2000
	}
	vx := frames.VXLAN(vni, g.inner(dmac, src, dst, !in))
	if rng.IntN(20) == 0 {
		vx[rng.IntN(8)] |= byte(1 << rng.IntN(8)) // other VXLAN flags, reserved bits
	}
	f := frames.EthMAC(omac, macNicB, 0x0800, h.Wrap(frames.UDP(uint16(32768+rng.IntN(20000)), port, vx)))
	if rng.IntN(20) == 0 { // outer or inner IPv4 options
		f = frames.IPv4Options(f, []int{14, 64}[rng.IntN(2)], []byte{1, 1, 1, 0})
	}
	if rng.IntN(3) == 0 {
		f = frames.Mutate(rng, f, 50+14+20+20)
	}
	return f
}
