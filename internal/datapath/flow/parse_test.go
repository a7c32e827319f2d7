package flow

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/peregrine-net/peregrine/internal/testutil/frames"
)

func ethFrame(proto uint16, payload []byte) []byte { return frames.Eth(proto, payload) }

func ipv6(next byte, payload []byte) []byte {
	return frames.IPv6{Src: frames.Addr("fd00::1"), Dst: frames.Addr("fd00::2"), Next: next}.Wrap(payload)
}

var (
	ext = frames.Ext
	udp = func(sport, dport uint16) []byte { return frames.UDP(sport, dport, nil) }
	cat = slices.Concat[[]byte]
)

func TestIPv6ExtensionHeaders(t *testing.T) {
	cases := map[string]struct {
		frame []byte
		r     Result
		proto uint8
		frag  bool
		sport uint16
	}{
		"plain":          {ethFrame(0x86dd, ipv6(17, udp(1000, 53))), OK, 17, false, 1000},
		"hbh+dstopts":    {ethFrame(0x86dd, ipv6(0, cat(ext(60), ext(17), udp(1000, 53)))), OK, 17, false, 1000},
		"routing":        {ethFrame(0x86dd, ipv6(43, cat(ext(6), frames.TCP(7, 8, nil)))), OK, 6, false, 7},
		"fragment":       {ethFrame(0x86dd, ipv6(44, cat(ext(17), udp(1000, 53)))), OK, 17, true, 0},
		"five in chain":  {ethFrame(0x86dd, ipv6(0, cat(ext(60), ext(60), ext(60), ext(60), ext(17), udp(1, 2)))), No, 0, false, 0},
		"truncated ext":  {ethFrame(0x86dd, ipv6(0, []byte{17})), Short, 0, false, 0},
		"truncated port": {ethFrame(0x86dd, ipv6(17, []byte{1, 2})), Short, 0, false, 0},
	}
	for name, c := range cases {
		h, r := ParseFrame(c.frame, 0, 0)
		if r != c.r {
			t.Errorf("%s: result %d, want %d", name, r, c.r)
			continue
		}
		if r == OK && (h.Key.Proto != c.proto || h.Frag != c.frag || h.Key.Sport != c.sport || h.Family != 6) {
			t.Errorf("%s: %+v, want proto %d frag %v sport %d", name, h, c.proto, c.frag, c.sport)
		}
	}
}

func TestVXLANNeedsPortAndIFlag(t *testing.T) {
	inner := ethFrame(0x0806, make([]byte, 28))
	vx := func(dport uint16, flags byte) []byte {
		return ethFrame(0x86dd, ipv6(17, cat(udp(40000, dport), []byte{flags, 0, 0, 0, 0, 0, 42, 0}, inner)))
	}
	ports := []uint16{4789, 8472}
	if off, vni, r := VXLANOuter(vx(4789, 0x08), ports); r != OK || vni != 42 || off != 14+40+16 {
		t.Errorf("valid VXLAN: off %d vni %d result %d", off, vni, r)
	}
	if _, _, r := VXLANOuter(vx(4789, 0), ports); r != No {
		t.Errorf("no I flag: result %d, want No", r)
	}
	if _, _, r := VXLANOuter(vx(4790, 0x08), ports); r != No {
		t.Errorf("other port: result %d, want No", r)
	}
	if _, _, r := VXLANOuter(vx(4789, 0x08)[:14+40+8+4], ports); r != Short {
		t.Errorf("truncated VXLAN header: result %d, want Short", r)
	}
}

func TestHashIsTheProgramsWordHash(t *testing.T) {
	src, dst := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	k := Key{Src: AddrWords(src), Dst: AddrWords(dst), Sport: 1, Dport: 2, Proto: 17}
	// ports word: sport and dport in network order, read as one little-endian word
	if PortsWord(1, 2) != 0x02000100 || k.Hash() != Hash(src, dst, 1, 2, 17) {
		t.Fatalf("ports word %#x, hashes %#x %#x", PortsWord(1, 2), k.Hash(), Hash(src, dst, 1, 2, 17))
	}
}
