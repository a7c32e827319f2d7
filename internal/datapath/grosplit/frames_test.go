package grosplit

import (
	"slices"

	"github.com/peregrine-net/peregrine/internal/testutil/frames"
)

// Frame builders for the test runs (internal/testutil/frames), in the pieces the malformed-frame
// cases cut apart: headers alone, with lengths that cover payloadLen bytes after them.

func ethHdr(proto uint16, vlans ...uint16) []byte { return frames.Eth(proto, nil, vlans...) }

func ipv4Hdr(src, dst string, proto byte, payloadLen int, fragOff uint16) []byte {
	return frames.IPv4{Src: frames.Addr(src), Dst: frames.Addr(dst), Proto: proto, FragOff: fragOff}.Wrap(make([]byte, payloadLen))[:20]
}

func ipv6Hdr(src, dst string, next byte, payloadLen int) []byte {
	return frames.IPv6{Src: frames.Addr(src), Dst: frames.Addr(dst), Next: next}.Wrap(make([]byte, payloadLen))[:40]
}

// l4 is a TCP (20 bytes) or UDP (8 bytes) header followed by payload.
func l4(proto byte, sport, dport uint16, payload int) []byte {
	return frames.L4(proto, sport, dport, payload)
}

func cat(parts ...[]byte) []byte { return slices.Concat(parts...) }

// ip4Packet is an IPv4 packet (no Ethernet) carrying a TCP or UDP header and payload.
func ip4Packet(src, dst string, proto byte, sport, dport uint16, payload int) []byte {
	return frames.IPv4{Src: frames.Addr(src), Dst: frames.Addr(dst), Proto: proto}.Wrap(l4(proto, sport, dport, payload))
}

// plain4 is an Ethernet frame with an IPv4 TCP/UDP packet.
func plain4(src, dst string, proto byte, sport, dport uint16) []byte {
	return frames.Eth(0x0800, ip4Packet(src, dst, proto, sport, dport, 32))
}

// vxlan4 wraps an inner Ethernet frame in outer Ethernet/IPv4/UDP(dport)/VXLAN(vni 42).
func vxlan4(outerSport, dport uint16, inner []byte) []byte {
	return frames.Encap(outerSport, dport, 42, inner)
}

// innerTCP4 is an inner Ethernet frame with a TCP flow between two container addresses.
func innerTCP4(sport, dport uint16) []byte {
	return frames.Eth(0x0800, ip4Packet("198.19.0.2", "198.19.0.3", 6, sport, dport, 64))
}
