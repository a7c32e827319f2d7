package flow

import (
	"encoding/binary"
	"math/bits"
)

// The Go model of bpf/parse.h and bpf/vxlan.h: what every program's parser finds in a frame.
// It follows the C checks in the same order, so the tests (and a fuzzer) can compare a
// program's decision with the model's on any byte string.

// Result is a parser's verdict (PRG_OK, PRG_NO, PRG_SHORT, PRG_NOTIP).
type Result int

const (
	OK    Result = 0
	No    Result = -1 // not ours, malformed
	Short Result = -2 // a header ends past the data
	NotIP Result = -3 // a well-formed frame that is not IPv4/IPv6
)

// Limits of the C parser.
const (
	MaxOff         = 1024 // PRG_MAX_OFF: no header is read beyond this offset
	IPv6MaxExt     = 4    // PRG_IPV6_MAX_EXT
	VXLANMaxPorts  = 8    // PRG_VXLAN_MAX_PORTS
	vxlanHeaderLen = 8
	udpHeaderLen   = 8
)

// DefaultVXLANPorts are the IANA port (Linux vxlan's usual setting, Docker overlay) and the
// Linux default (flannel): the port set where none was discovered or given.
var DefaultVXLANPorts = []uint16{4789, 8472}

// Key is struct prg_flow: addresses as the programs' words (AddrWords), ports in host order
// (0 for fragments and protocols without ports).
type Key struct {
	Src, Dst     [4]uint32
	Sport, Dport uint16
	Proto        uint8
}

// Hash is prg_flow_hash of the key.
func (k Key) Hash() uint32 {
	return HashWords(k.Src, k.Dst, PortsWord(k.Sport, k.Dport), uint32(k.Proto))
}

// WirePorts are the ports as struct prg_flow holds them (network order) for map lookups.
func (k Key) WirePorts() (sport, dport uint16) {
	return bits.ReverseBytes16(k.Sport), bits.ReverseBytes16(k.Dport)
}

// Hdrs is struct prg_hdrs.
type Hdrs struct {
	Key            Key
	L3, L4         int
	EthProto       uint16
	Family, DSCP   uint8
	TTL            uint8
	Frag, HasPorts bool
}

// at is prg_at: n bytes at off, or nil.
func at(b []byte, off, n int) []byte {
	if off > MaxOff || off+n > len(b) {
		return nil
	}
	return b[off : off+n]
}

func isIPv6Ext(nh uint8) bool { return nh == 0 || nh == 43 || nh == 60 || nh == 44 }

// HasPorts says whether proto's header starts with source and destination ports (TCP, UDP, SCTP).
func HasPorts(proto uint8) bool { return proto == 6 || proto == 17 || proto == 132 }

// ParseFrame is prg_parse_frame: the Ethernet frame at off (up to maxVLANs VLAN tags) down to
// the ports.
func ParseFrame(b []byte, off, maxVLANs int) (Hdrs, Result) {
	var h Hdrs
	eth := at(b, off, 14)
	if eth == nil {
		return h, Short
	}
	proto := binary.BigEndian.Uint16(eth[12:])
	off += 14
	for i := 0; i < maxVLANs && (proto == 0x8100 || proto == 0x88a8); i++ {
		vh := at(b, off, 4)
		if vh == nil {
			return h, Short
		}
		proto = binary.BigEndian.Uint16(vh[2:])
		off += 4
	}
	h.EthProto, h.L3 = proto, off
	var r Result
	switch proto {
	case 0x0800:
		r = parseIPv4(b, &h)
	case 0x86dd:
		r = parseIPv6(b, &h)
	default:
		return h, NotIP
	}
	if r != OK || h.Frag || !HasPorts(h.Key.Proto) {
		return h, r
	}
	ports := at(b, h.L4, 4)
	if ports == nil {
		return h, Short
	}
	h.Key.Sport, h.Key.Dport = binary.BigEndian.Uint16(ports), binary.BigEndian.Uint16(ports[2:])
	h.HasPorts = true
	return h, OK
}

func parseIPv4(b []byte, h *Hdrs) Result {
	ip := at(b, h.L3, 20)
	if ip == nil {
		return Short
	}
	if ip[0]>>4 != 4 || ip[0]&0xf < 5 {
		return No
	}
	hl := int(ip[0]&0xf) * 4
	if int(binary.BigEndian.Uint16(ip[2:])) < hl {
		return No
	}
	if at(b, h.L3, hl) == nil {
		return Short
	}
	h.Family = 4
	h.Key.Src[0], h.Key.Dst[0] = binary.LittleEndian.Uint32(ip[12:]), binary.LittleEndian.Uint32(ip[16:])
	h.Key.Proto, h.DSCP, h.TTL = ip[9], ip[1]>>2, ip[8]
	h.Frag = binary.BigEndian.Uint16(ip[6:])&0x3fff != 0
	h.L4 = h.L3 + hl
	return OK
}

func parseIPv6(b []byte, h *Hdrs) Result {
	ip := at(b, h.L3, 40)
	if ip == nil {
		return Short
	}
	if ip[0]>>4 != 6 {
		return No
	}
	h.Family = 6
	for i := range 4 {
		h.Key.Src[i] = binary.LittleEndian.Uint32(ip[8+4*i:])
		h.Key.Dst[i] = binary.LittleEndian.Uint32(ip[24+4*i:])
	}
	h.DSCP = (ip[0]<<4 | ip[1]>>4) >> 2
	h.TTL = ip[7]
	nh, off := ip[6], h.L3+40
	for range IPv6MaxExt {
		if !isIPv6Ext(nh) {
			break
		}
		ext := at(b, off, 2)
		if ext == nil {
			return Short
		}
		if nh == 44 {
			h.Frag, nh, off = true, ext[0], off+8
			break
		}
		nh, off = ext[0], off+(int(ext[1])+1)*8
	}
	if !h.Frag && isIPv6Ext(nh) {
		return No
	}
	h.Key.Proto, h.L4 = nh, off
	return OK
}

// VXLANOf is prg_vxlan_of: whether parsed outer headers are VXLAN (UDP to a port of the set,
// I flag), with the inner frame's offset and the VNI.
func VXLANOf(b []byte, h Hdrs, ports []uint16) (inner int, vni uint32, r Result) {
	if !h.HasPorts || h.Key.Proto != 17 || !portIn(ports, h.Key.Dport) {
		return 0, 0, No
	}
	off := h.L4 + udpHeaderLen
	hdr := at(b, off, vxlanHeaderLen)
	if hdr == nil {
		return 0, 0, Short
	}
	if hdr[0]&0x08 == 0 {
		return 0, 0, No
	}
	return off + vxlanHeaderLen, binary.BigEndian.Uint32(hdr[4:]) >> 8, OK
}

// VXLANOuter is prg_vxlan_outer: the outer headers of the frame at offset 0, no VLAN tag.
func VXLANOuter(b []byte, ports []uint16) (inner int, vni uint32, r Result) {
	h, r := ParseFrame(b, 0, 0)
	if r == NotIP {
		return 0, 0, No
	}
	if r != OK {
		return 0, 0, r
	}
	return VXLANOf(b, h, ports)
}

func portIn(ports []uint16, p uint16) bool {
	for i, x := range ports {
		if i < VXLANMaxPorts && x != 0 && x == p {
			return true
		}
	}
	return false
}
