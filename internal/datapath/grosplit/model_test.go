package grosplit

import (
	"encoding/binary"
)

// The Go model of prg_grosplit's CPU choice. It mirrors bpf/grosplit.bpf.c line by line on
// purpose: the tests compare the kernel's choice with this one, so a change on either side
// that breaks flow affinity or the VXLAN rule shows up as a mismatch.

type flowKey struct {
	src, dst [4]uint32
	ports    uint32
	proto    uint32
}

func mix(h uint32) uint32 {
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}

func (f flowKey) hash() uint32 {
	h := uint32(0x9e3779b9)
	for _, w := range f.src {
		h = mix(h ^ w)
	}
	for _, w := range f.dst {
		h = mix(h ^ w)
	}
	h = mix(h ^ f.ports)
	return mix(h ^ f.proto)
}

func slotOf(h uint32, n int) int { return int((uint64(h) * uint64(n)) >> 32) }

// le reads a word as the BPF program does: a native (little-endian) load of network bytes.
func le(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }

// modelEth skips Ethernet and up to two VLAN tags; ok=false means too short.
func modelEth(b []byte, off int) (int, uint16, bool) {
	if len(b) < off+14 {
		return 0, 0, false
	}
	p := binary.BigEndian.Uint16(b[off+12:])
	off += 14
	for i := 0; i < 2 && (p == 0x8100 || p == 0x88a8); i++ {
		if len(b) < off+4 {
			return 0, 0, false
		}
		p = binary.BigEndian.Uint16(b[off+2:])
		off += 4
	}
	return off, p, true
}

const (
	parseOK = iota
	parseBad
	parseNotIP
)

func modelIP(b []byte, off int, eth uint16, f *flowKey) (next int, l4ok bool, r int) {
	switch eth {
	case 0x0800:
		if len(b) < off+20 || b[off]>>4 != 4 || b[off]&0xf < 5 {
			return 0, false, parseBad
		}
		hl := int(b[off]&0xf) * 4
		if len(b) < off+hl {
			return 0, false, parseBad
		}
		f.src[0], f.dst[0], f.proto = le(b[off+12:]), le(b[off+16:]), uint32(b[off+9])
		return off + hl, binary.BigEndian.Uint16(b[off+6:])&0x3fff == 0, parseOK
	case 0x86dd:
		if len(b) < off+40 || b[off]>>4 != 6 {
			return 0, false, parseBad
		}
		for i := 0; i < 4; i++ {
			f.src[i], f.dst[i] = le(b[off+8+4*i:]), le(b[off+24+4*i:])
		}
		f.proto = uint32(b[off+6])
		return off + 40, true, parseOK
	}
	return 0, false, parseNotIP
}

func hasPorts(p uint32) bool { return p == 6 || p == 17 || p == 132 }

// modelFlow returns the key prg_grosplit hashes, whether it is the inner (VXLAN) one, and
// ok=false where the program passes the frame.
func modelFlow(b []byte, vxlanPorts []uint16) (f flowKey, vx, ok bool) {
	off, eth, good := modelEth(b, 0)
	if !good {
		return f, false, false
	}
	off, l4ok, r := modelIP(b, off, eth, &f)
	if r != parseOK {
		return f, false, false
	}
	if !l4ok || !hasPorts(f.proto) {
		return f, false, true
	}
	if len(b) < off+4 {
		return f, false, false
	}
	f.ports = le(b[off:])
	dport := binary.BigEndian.Uint16(b[off+2:])
	isVX := false
	for _, p := range vxlanPorts {
		isVX = isVX || p == dport
	}
	if f.proto != 17 || !isVX {
		return f, false, true
	}
	off += 8 + 8
	var in flowKey
	off, eth, good = modelEth(b, off)
	if !good {
		return f, false, false
	}
	off, l4ok, r = modelIP(b, off, eth, &in)
	switch r {
	case parseNotIP:
		return f, false, true
	case parseBad:
		return f, false, false
	}
	if l4ok && hasPorts(in.proto) {
		if len(b) < off+4 {
			return f, false, false
		}
		in.ports = le(b[off:])
	}
	return in, true, true
}

// modelChoice is the slot (index into the CPU list) flow affinity picks, ok=false for a pass.
func modelChoice(b []byte, n int, vxlanPorts []uint16) (slot int, hash uint32, vx, ok bool) {
	f, vx, ok := modelFlow(b, vxlanPorts)
	if !ok || n == 0 {
		return 0, 0, false, false
	}
	h := f.hash()
	return slotOf(h, n), h, vx, true
}
