// Package flow mirrors in Go the flow key and hash every eBPF program uses (bpf/parse.h: struct
// prg_flow, prg_flow_hash; bpf/rps.h: prg_fmix32; bpf/vxlan.h's port set). Tests compare the
// programs' choices with these. A leaf package: models and loaders import it freely.
package flow

import (
	"encoding/binary"
	"math/bits"
	"net/netip"
)

// AddrWords is an address as the programs hold it: the 32-bit words they load from the packet
// (network byte order in memory, read as little-endian words), IPv4 in the first word.
func AddrWords(a netip.Addr) [4]uint32 {
	var w [4]uint32
	if a.Is4() {
		b := a.As4()
		w[0] = binary.LittleEndian.Uint32(b[:])
		return w
	}
	b := a.As16()
	for i := range w {
		w[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return w
}

// PortsWord is the word the two ports (host order) make in prg_flow's memory: both in network
// order, source first, read as one little-endian word.
func PortsWord(sport, dport uint16) uint32 {
	return uint32(bits.ReverseBytes16(sport)) | uint32(bits.ReverseBytes16(dport))<<16
}

// HashWords is prg_flow_hash over the key's words.
func HashWords(src, dst [4]uint32, ports, proto uint32) uint32 {
	h := uint32(0x9e3779b9)
	for _, w := range src {
		h = Fmix32(h ^ w)
	}
	for _, w := range dst {
		h = Fmix32(h ^ w)
	}
	h = Fmix32(h ^ ports)
	return Fmix32(h ^ proto)
}

// Hash is prg_flow_hash of a 5-tuple (ports in host order; 0 for fragments and protocols
// without ports).
func Hash(src, dst netip.Addr, sport, dport uint16, proto uint8) uint32 {
	return HashWords(AddrWords(src), AddrWords(dst), PortsWord(sport, dport), uint32(proto))
}

// PortList is the non-zero entries of a program's VXLAN port set (bpf/vxlan.h: 0 = unused).
func PortList(set []uint16) []uint16 {
	var out []uint16
	for _, p := range set {
		if p != 0 {
			out = append(out, p)
		}
	}
	return out
}

// Fmix32 is murmur3's 32-bit finaliser, prg_fmix32 in bpf/rps.h: the programs' hash step.
func Fmix32(h uint32) uint32 {
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}
