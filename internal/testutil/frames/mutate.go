package frames

import (
	"encoding/binary"
	"math/rand/v2"
)

// Mutate damages a well-formed frame the way a fuzzer should reach a program's deep paths: one
// defect each time, in the first hdr bytes (the headers the program reads) or in the lengths:
// cut short at a random offset, one byte overwritten, one bit flipped, the IPv4 header length
// or total length lied about, a UDP length changed. The frame is modified in place and padded
// back to what BPF_PROG_TEST_RUN accepts for tc (Pad).
func Mutate(rng *rand.Rand, f []byte, hdr int) []byte {
	hdr = max(1, min(hdr, len(f)))
	switch rng.IntN(6) {
	case 0:
		f = Cut(rng, f)
	case 1:
		f[rng.IntN(hdr)] = byte(rng.Uint32())
	case 2:
		f[rng.IntN(hdr)] ^= 1 << rng.IntN(8)
	case 3: // a UDP length field (outer or inner) wherever one may be
		if i := 14 + 20 + 4; len(f) >= i+2 {
			binary.BigEndian.PutUint16(f[i:], uint16(rng.IntN(1<<16)))
		}
	default:
		f = damage(rng, f)
	}
	return Pad(f)
}

// Cut is f cut at a random offset no shorter than BPF_PROG_TEST_RUN accepts for tc.
func Cut(rng *rand.Rand, f []byte) []byte {
	lo := min(len(f), minLen(f))
	return f[:lo+rng.IntN(len(f)-lo+1)]
}

// Cuts calls fn with every prefix of f that BPF_PROG_TEST_RUN accepts for tc, shortest first
// (f itself last): the frame truncated at every offset.
func Cuts(f []byte, fn func([]byte)) {
	for n := min(len(f), minLen(f)); n <= len(f); n++ {
		fn(f[:n:n])
	}
}

// Pad extends f with zeros to the shortest frame BPF_PROG_TEST_RUN accepts for tc (an Ethernet
// header and the whole IP header its ethertype announces).
func Pad(f []byte) []byte {
	if len(f) < 14 {
		f = append(f, make([]byte, 14-len(f))...)
	}
	if n := minLen(f); len(f) < n {
		f = append(f, make([]byte, n-len(f))...)
	}
	return f
}

// IPv4Options inserts options (a multiple of 4 bytes) into the IPv4 header at offset l3 of f:
// header length, total length and header checksum follow; a UDP length after it is left alone
// (it counts from the UDP header). f must hold a 20-byte header there.
func IPv4Options(f []byte, l3 int, opts []byte) []byte {
	out := append(append(append([]byte{}, f[:l3+20]...), opts...), f[l3+20:]...)
	ip := out[l3:]
	ip[0] = 0x40 | byte((20+len(opts))/4)
	binary.BigEndian.PutUint16(ip[2:], binary.BigEndian.Uint16(ip[2:])+uint16(len(opts)))
	binary.BigEndian.PutUint16(ip[10:], 0)
	binary.BigEndian.PutUint16(ip[10:], Checksum(ip[:20+len(opts)]))
	return out
}
