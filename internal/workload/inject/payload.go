package inject

import "encoding/binary"

// UDP payload layout (the inner datagram's in VXLAN mode, the only one's in plain mode), shared
// with the receiving sink (internal/workload/udpsink):
//
//	[0:8)   sequence number, big endian, per flow, starting at 0
//	[8:12)  flow id (0..Flows-1), big endian
//	[12:16) magic "PRG1", so a sink can tell our datagrams from stray traffic
//	[16:)   zero padding up to the configured payload size
//
// The sequence is per flow (not global) so that a receiver that spreads flows over several
// cores still sees every flow's numbers in order unless the path really reordered it.
//
// PayloadMax is the same in plain mode (which would fit 1472 bytes) so that every payload size
// exists in both modes and the native baseline always compares like with like.
const (
	PayloadMin   = 16   // header above; the smallest payload we send
	PayloadMax   = 1400 // keeps the outer frame below a 1500-byte underlay MTU with room to spare
	PayloadMagic = 0x50524731
)

// PutPayloadHeader writes sequence, flow id and magic at the start of p (len(p) >= PayloadMin).
func PutPayloadHeader(p []byte, seq uint64, flow uint32) {
	binary.BigEndian.PutUint64(p[0:8], seq)
	binary.BigEndian.PutUint32(p[8:12], flow)
	binary.BigEndian.PutUint32(p[12:16], PayloadMagic)
}

// ParsePayload returns the sequence number and flow id of a datagram we sent; ok is false when
// the datagram is too short or does not carry our magic.
func ParsePayload(p []byte) (seq uint64, flow uint32, ok bool) {
	if len(p) < PayloadMin || binary.BigEndian.Uint32(p[12:16]) != PayloadMagic {
		return 0, 0, false
	}
	return binary.BigEndian.Uint64(p[0:8]), binary.BigEndian.Uint32(p[8:12]), true
}
