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

// IPv4 and VLAN cases of prg_parse_frame, each a known outcome of the C checks (bpf/parse.h), in
// the order the C makes them: the plain table beside the root fuzzers.
func TestIPv4AndVLANVectors(t *testing.T) {
	ip4 := func(h frames.IPv4, payload []byte) []byte {
		h.Src, h.Dst = frames.Addr("10.0.0.1"), frames.Addr("10.0.0.2")
		return h.Wrap(payload)
	}
	set := func(b []byte, i int, v byte) []byte { b = slices.Clone(b); b[i] = v; return b }
	plain := ip4(frames.IPv4{Proto: 17, TOS: 0xb8, TTL: 9}, udp(1234, 53))
	cases := map[string]struct {
		frame            []byte
		vlans            int
		r                Result
		l3, l4           int
		proto, dscp, ttl uint8
		frag, ports      bool
		sport, dport     uint16
	}{
		"udp":                    {ethFrame(0x0800, plain), 0, OK, 14, 34, 17, 46, 9, false, true, 1234, 53},
		"tcp":                    {ethFrame(0x0800, ip4(frames.IPv4{Proto: 6}, frames.TCP(80, 443, nil))), 0, OK, 14, 34, 6, 0, 64, false, true, 80, 443},
		"icmp: no ports":         {ethFrame(0x0800, ip4(frames.IPv4{Proto: 1}, make([]byte, 8))), 0, OK, 14, 34, 1, 0, 64, false, false, 0, 0},
		"later fragment":         {ethFrame(0x0800, ip4(frames.IPv4{Proto: 17, FragOff: 0x0010}, udp(1, 2))), 0, OK, 14, 34, 17, 0, 64, true, false, 0, 0},
		"first fragment":         {ethFrame(0x0800, ip4(frames.IPv4{Proto: 17, FragOff: 0x2000}, udp(1, 2))), 0, OK, 14, 34, 17, 0, 64, true, false, 0, 0},
		"DF is no fragment":      {ethFrame(0x0800, ip4(frames.IPv4{Proto: 17, FragOff: 0x4000}, udp(1, 2))), 0, OK, 14, 34, 17, 0, 64, false, true, 1, 2},
		"one vlan":               {frames.Eth(0x0800, plain, 100), 1, OK, 18, 38, 17, 46, 9, false, true, 1234, 53},
		"vlan not allowed":       {frames.Eth(0x0800, plain, 100), 0, NotIP, 14, 0, 0, 0, 0, false, false, 0, 0},
		"two vlans, one allowed": {frames.Eth(0x0800, plain, 100, 200), 1, NotIP, 18, 0, 0, 0, 0, false, false, 0, 0},
		"ihl 4":                  {ethFrame(0x0800, set(plain, 0, 0x44)), 0, No, 14, 0, 0, 0, 0, false, false, 0, 0},
		"version 6 in ipv4":      {ethFrame(0x0800, set(plain, 0, 0x65)), 0, No, 14, 0, 0, 0, 0, false, false, 0, 0},
		"total length < ihl":     {ethFrame(0x0800, set(set(plain, 2, 0), 3, 19)), 0, No, 14, 0, 0, 0, 0, false, false, 0, 0},
		"options past the end":   {ethFrame(0x0800, set(set(set(plain, 0, 0x4f), 2, 0), 3, 80)), 0, Short, 14, 0, 0, 0, 0, false, false, 0, 0},
		"ports cut":              {ethFrame(0x0800, plain)[:14+20+3], 0, Short, 14, 34, 17, 46, 9, false, false, 0, 0},
		"arp":                    {ethFrame(0x0806, make([]byte, 28)), 0, NotIP, 14, 0, 0, 0, 0, false, false, 0, 0},
		"runt":                   {make([]byte, 13), 0, Short, 0, 0, 0, 0, 0, false, false, 0, 0},
	}
	for name, c := range cases {
		h, r := ParseFrame(c.frame, 0, c.vlans)
		if r != c.r {
			t.Errorf("%s: result %d, want %d", name, r, c.r)
			continue
		}
		if r == Short || r == No {
			continue // what the C leaves in prg_hdrs then is not read by any caller
		}
		if h.L3 != c.l3 {
			t.Errorf("%s: l3 at %d, want %d", name, h.L3, c.l3)
		}
		if r != OK {
			continue
		}
		if h.L4 != c.l4 || h.Key.Proto != c.proto || h.DSCP != c.dscp || h.TTL != c.ttl || h.Frag != c.frag ||
			h.HasPorts != c.ports || h.Key.Sport != c.sport || h.Key.Dport != c.dport || h.Family != 4 {
			t.Errorf("%s: %+v, want l4 %d proto %d dscp %d ttl %d frag %v ports %v %d>%d", name, h, c.l4, c.proto, c.dscp, c.ttl, c.frag, c.ports, c.sport, c.dport)
		}
	}
}
