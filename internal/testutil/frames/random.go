package frames

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"os"
	"strconv"
)

// Random returns a frame for fuzzing the programs' parsers: well-formed ones of every shape the
// programs handle (VXLAN over IPv4 or IPv6 to a port of ports or another one, with or without the
// I flag; inner IPv4 or IPv6 with up to five extension headers, fragments, TCP, UDP, SCTP, ICMP,
// GRE; ARP; VLAN tags), often damaged afterwards: cut at a random offset, bytes overwritten, the
// IPv4 header length or total length lied about. A frame is never cut inside its Ethernet
// header or the IP header its ethertype announces (BPF_PROG_TEST_RUN refuses those for tc).
func Random(rng *rand.Rand, ports []uint16) []byte {
	f := randomInner(rng)
	if rng.IntN(10) < 7 {
		f = randomEncap(rng, ports, f)
	}
	if rng.IntN(10) < 4 {
		f = damage(rng, f)
	}
	if n := minLen(f); len(f) < n { // overwritten into an IP ethertype
		f = append(f, make([]byte, n-len(f))...)
	}
	return f
}

func randomAddr(rng *rand.Rand, v6 bool) netip.Addr {
	if v6 {
		var b [16]byte
		binary.LittleEndian.PutUint64(b[:], rng.Uint64())
		binary.LittleEndian.PutUint64(b[8:], rng.Uint64())
		return netip.AddrFrom16(b)
	}
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], rng.Uint32())
	return netip.AddrFrom4(b)
}

func randomL4(rng *rand.Rand) (proto byte, seg []byte) {
	protos := []byte{6, 17, 132, 1, 47}
	proto = protos[rng.IntN(len(protos))]
	sport, dport, n := uint16(rng.Uint32()), uint16(rng.Uint32()), rng.IntN(64)
	switch proto {
	case 6:
		return proto, TCP(sport, dport, make([]byte, n))
	case 17, 132:
		return proto, UDP(sport, dport, make([]byte, n))
	}
	return proto, make([]byte, 8+n)
}

// randomExt is a chain of IPv6 extension headers ending in next; it returns the first header's
// number and the chain.
func randomExt(rng *rand.Rand, next byte) (first byte, chain []byte) {
	kinds := []byte{0, 43, 60, 44}
	first = next
	for i := rng.IntN(6); i > 0; i-- {
		k := kinds[rng.IntN(len(kinds))]
		size := 8
		if k != 44 {
			size = 8 * (1 + rng.IntN(3))
		}
		h := make([]byte, size)
		h[0] = first
		if k != 44 {
			h[1] = byte(size/8 - 1)
		} else if rng.IntN(2) == 0 {
			binary.BigEndian.PutUint16(h[2:], uint16(rng.IntN(1<<13))<<3|uint16(rng.IntN(2)))
		}
		first, chain = k, append(h, chain...)
	}
	return first, chain
}

func randomInner(rng *rand.Rand) []byte {
	switch rng.IntN(20) {
	case 0:
		return Eth(0x0806, make([]byte, 28))
	case 1:
		return Eth(0x0800, IPv4{Src: randomAddr(rng, false), Dst: randomAddr(rng, false), Proto: 17}.Wrap(UDP(1, 2, nil)), 100)
	}
	proto, seg := randomL4(rng)
	if rng.IntN(2) == 0 {
		h := IPv4{Src: randomAddr(rng, false), Dst: randomAddr(rng, false), Proto: proto, TOS: byte(rng.Uint32()), TTL: byte(rng.Uint32())}
		if rng.IntN(10) == 0 {
			h.FragOff = uint16(rng.Uint32()) & 0x3fff
		}
		return Eth(0x0800, h.Wrap(seg))
	}
	first, ext := randomExt(rng, proto)
	h := IPv6{Src: randomAddr(rng, true), Dst: randomAddr(rng, true), Next: first, TClass: byte(rng.Uint32()), HopLimit: byte(rng.Uint32()), Ext: ext}
	return Eth(0x86dd, h.Wrap(seg))
}

func randomEncap(rng *rand.Rand, ports []uint16, inner []byte) []byte {
	port := uint16(rng.Uint32())
	if len(ports) > 0 && rng.IntN(10) < 8 {
		port = ports[rng.IntN(len(ports))]
	}
	vx := VXLAN(rng.Uint32()&0xffffff, inner)
	if rng.IntN(10) == 0 {
		vx[0] = byte(rng.Uint32()) // the I flag may be missing
	}
	udp := UDP(uint16(rng.Uint32()), port, vx)
	if rng.IntN(5) == 0 {
		first, ext := randomExt(rng, 17)
		return Eth(0x86dd, IPv6{Src: randomAddr(rng, true), Dst: randomAddr(rng, true), Next: first, Ext: ext}.Wrap(udp))
	}
	h := IPv4{Src: randomAddr(rng, false), Dst: randomAddr(rng, false), Proto: 17}
	if rng.IntN(20) == 0 {
		h.FragOff = 0x2000
	}
	return Eth(0x0800, h.Wrap(udp))
}

func damage(rng *rand.Rand, f []byte) []byte {
	switch rng.IntN(4) {
	case 0: // cut short
		lo := min(len(f), minLen(f))
		return f[:lo+rng.IntN(len(f)-lo+1)]
	case 1: // overwrite a few bytes
		for i := 1 + rng.IntN(4); i > 0; i-- {
			f[rng.IntN(len(f))] = byte(rng.Uint32())
		}
	case 2: // IPv4 header length
		if len(f) > 14 && f[12] == 0x08 && f[13] == 0x00 {
			f[14] = 0x40 | byte(rng.IntN(16))
		}
	case 3: // IPv4 total length
		if len(f) > 17 && f[12] == 0x08 && f[13] == 0x00 {
			binary.BigEndian.PutUint16(f[16:], uint16(rng.IntN(64)))
		}
	}
	return f
}

// minLen is the shortest cut of f that BPF_PROG_TEST_RUN accepts for tc programs: an Ethernet
// header, and the whole IPv4 or IPv6 header its ethertype announces (the kernel pulls it).
func minLen(f []byte) int {
	switch binary.BigEndian.Uint16(f[12:]) {
	case 0x0800:
		return 14 + 20
	case 0x86dd:
		return 14 + 40
	}
	return 14
}

// FuzzCount is how many frames a fuzz test runs: PEREGRINE_FUZZ_N, else def (the short slice
// the test suite runs; `make fuzz` sets a million).
func FuzzCount(def int) int {
	if n, err := strconv.Atoi(os.Getenv("PEREGRINE_FUZZ_N")); err == nil && n > 0 {
		return n
	}
	return def
}

// Each runs n frames from gen through check, every cutEvery-th one instead truncated at every
// length (Cuts), and stops once failed says the test has failed; it returns how many frames
// check saw.
func Each(failed func() bool, n, cutEvery int, gen func() []byte, check func([]byte)) int {
	runs := 0
	one := func(b []byte) {
		if !failed() {
			runs++
			check(b)
		}
	}
	for i := 0; i < n && !failed(); i++ {
		f := gen()
		if i%cutEvery == 0 {
			Cuts(f, one)
			continue
		}
		one(f)
	}
	return runs
}
