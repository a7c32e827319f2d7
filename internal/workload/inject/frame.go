package inject

import (
	"encoding/binary"

	"github.com/peregrine-net/peregrine/internal/datapath/flow"
)

// Frame layouts (no VLAN tags, no IP options). VXLAN mode: outer Ethernet | outer IPv4 | outer
// UDP | VXLAN | inner Ethernet | inner IPv4 | inner UDP | payload. Plain mode: Ethernet | IPv4 |
// UDP | payload, i.e. the inner frame alone, sent on the underlay. The offsets are exported so
// that tests and tools can poke fields without re-deriving them; in plain mode the IPv4 and UDP
// headers sit at OffOuterIP and OffOuterUDP and the payload at HeadroomPlain.
const (
	EthLen   = 14
	IPv4Len  = 20
	UDPLen   = 8
	VXLANLen = 8

	OffOuterEth   = 0
	OffOuterIP    = OffOuterEth + EthLen
	OffOuterUDP   = OffOuterIP + IPv4Len
	OffVXLAN      = OffOuterUDP + UDPLen
	OffInnerEth   = OffVXLAN + VXLANLen
	OffInnerIP    = OffInnerEth + EthLen
	OffInnerUDP   = OffInnerIP + IPv4Len
	OffPayload    = OffInnerUDP + UDPLen
	HeadroomVXLAN = OffPayload // 92 bytes of headers in front of the inner payload

	// datagramLen is Ethernet + IPv4 + UDP: the headers in front of the payload in the frame that
	// carries our datagram (the whole frame in plain mode, the inner frame in VXLAN mode).
	datagramLen   = EthLen + IPv4Len + UDPLen
	HeadroomPlain = datagramLen // 42 bytes of headers in front of the payload in plain mode
)

const (
	etherTypeIPv4 = 0x0800
	protoUDP      = 17
	ttl           = 64
	vxlanFlagVNI  = 0x08 // the I flag: VNI valid (RFC 7348)
)

// Headroom is the number of header bytes in front of the payload in c's frames, the offset at
// which the sequence header is written: HeadroomPlain in plain mode, HeadroomVXLAN otherwise.
func (c Config) Headroom() int {
	if c.Plain {
		return HeadroomPlain
	}
	return HeadroomVXLAN
}

// FrameLen is the length of c's frames on the wire (without FCS).
func (c Config) FrameLen() int { return c.Headroom() + c.PayloadSize }

// InnerSrcPortOf returns the UDP source port of flow i's datagram (the inner one in VXLAN mode,
// the only one in plain mode): flows differ only there, which is what a set of client sockets
// towards one server port looks like.
func InnerSrcPortOf(c Config, flow int) uint16 { return c.InnerSrcPort + uint16(flow) }

// OuterSrcPortOf returns the outer UDP source port for flow i. Like the kernel's vxlan
// (udp_flow_src_port), it takes the inner flow's hash, folds the low half into the high half,
// and scales it into [min, max) — so outer 4-tuples follow inner flows and the receiving host's
// RSS/RPS spreads them. The kernel's hash is keyed randomly per boot, so the exact ports differ;
// the distribution and the flow-stability are what matter. With SrcPortMin == SrcPortMax every
// flow gets that one port.
func OuterSrcPortOf(c Config, flow int) uint16 {
	if c.SrcPortMin == c.SrcPortMax {
		return c.SrcPortMin
	}
	s, d := c.InnerSrcIP.As4(), c.InnerDstIP.As4()
	h := flowHash(binary.BigEndian.Uint32(s[:]), binary.BigEndian.Uint32(d[:]),
		uint32(InnerSrcPortOf(c, flow))<<16|uint32(c.InnerDstPort), protoUDP)
	h ^= h << 16
	return uint16(uint64(h)*uint64(c.SrcPortMax-c.SrcPortMin)>>32) + c.SrcPortMin
}

// flowHash mixes a 5-tuple into 32 well-spread bits (murmur3's finaliser over a simple fold);
// any good mix works, we only need stability per flow and spread across flows.
func flowHash(words ...uint32) uint32 {
	h := uint32(0x9747b28c)
	for _, w := range words {
		w *= 0xcc9e2d51
		w = w<<15 | w>>17
		w *= 0x1b873593
		h ^= w
		h = h<<13 | h>>19
		h = h*5 + 0xe6546b64
	}
	return flow.Fmix32(h)
}

// BuildFrame returns the complete frame of one flow with sequence 0 in its payload. c must have
// passed WithDefaults. Only the payload header changes per packet afterwards, and nothing the
// payload touches is covered by a checksum (UDP checksum 0 is legal over IPv4 and is what we put
// in every UDP header; the outer one is 0 as the kernel's vxlan sends it), so frames never need
// re-checksumming.
//
// Both modes build the same datagram frame (Ethernet | IPv4 | UDP | payload): in plain mode it is
// the whole frame and carries the underlay addresses; in VXLAN mode it is the inner frame, carries
// the inner addresses and sits behind the outer headers.
func BuildFrame(c Config, flow int) []byte {
	f := make([]byte, c.FrameLen())
	d := f // the datagram's Ethernet frame
	dstMAC, srcMAC, srcIP, dstIP := c.DstMAC, c.SrcMAC, c.SrcIP, c.DstIP
	if !c.Plain {
		d = f[OffInnerEth:]
		dstMAC, srcMAC, srcIP, dstIP = c.InnerDstMAC, c.InnerSrcMAC, c.InnerSrcIP, c.InnerDstIP
		putOuter(f, c, flow, len(d))
	}
	putEth(d, dstMAC, srcMAC)
	putIPv4(d[EthLen:], IPv4Len+UDPLen+c.PayloadSize, srcIP.As4(), dstIP.As4())
	putUDP(d[EthLen+IPv4Len:], InnerSrcPortOf(c, flow), c.InnerDstPort, UDPLen+c.PayloadSize)
	PutPayloadHeader(d[datagramLen:], 0, uint32(flow))
	return f
}

// putOuter writes the VXLAN encapsulation (outer Ethernet, IPv4, UDP and the VXLAN header) in
// front of an inner frame of innerLen bytes.
func putOuter(f []byte, c Config, flow, innerLen int) {
	outerIPLen := IPv4Len + UDPLen + VXLANLen + innerLen
	putEth(f[OffOuterEth:], c.DstMAC, c.SrcMAC)
	putIPv4(f[OffOuterIP:], outerIPLen, c.SrcIP.As4(), c.DstIP.As4())
	putUDP(f[OffOuterUDP:], OuterSrcPortOf(c, flow), c.DstPort, outerIPLen-IPv4Len)
	f[OffVXLAN] = vxlanFlagVNI
	binary.BigEndian.PutUint32(f[OffVXLAN+4:], c.VNI<<8) // VNI in bytes 4..6, byte 7 reserved
}

func putEth(b []byte, dst, src MAC) {
	copy(b[0:6], dst[:])
	copy(b[6:12], src[:])
	binary.BigEndian.PutUint16(b[12:14], etherTypeIPv4)
}

// putIPv4 writes a 20-byte header with DF set and ID 0 (legal with DF, RFC 6864), so the
// header is constant per flow and its checksum is computed once.
func putIPv4(b []byte, totalLen int, src, dst [4]byte) {
	b[0] = 0x45 // version 4, IHL 5
	b[1] = 0    // DSCP/ECN
	binary.BigEndian.PutUint16(b[2:4], uint16(totalLen))
	binary.BigEndian.PutUint16(b[4:6], 0)      // ID
	binary.BigEndian.PutUint16(b[6:8], 0x4000) // DF, offset 0
	b[8] = ttl
	b[9] = protoUDP
	binary.BigEndian.PutUint16(b[10:12], 0)
	copy(b[12:16], src[:])
	copy(b[16:20], dst[:])
	binary.BigEndian.PutUint16(b[10:12], Checksum(b[:IPv4Len]))
}

// putUDP writes a UDP header with checksum 0 ("none", allowed over IPv4).
func putUDP(b []byte, sport, dport uint16, length int) {
	binary.BigEndian.PutUint16(b[0:2], sport)
	binary.BigEndian.PutUint16(b[2:4], dport)
	binary.BigEndian.PutUint16(b[4:6], uint16(length))
	binary.BigEndian.PutUint16(b[6:8], 0)
}

// Checksum is the Internet checksum (RFC 1071) of b. Over a header whose checksum field is
// filled in correctly it returns 0.
func Checksum(b []byte) uint16 {
	var sum uint32
	for len(b) >= 2 {
		sum += uint32(b[0])<<8 | uint32(b[1])
		b = b[2:]
	}
	if len(b) == 1 {
		sum += uint32(b[0]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
