package prism

import (
	"net"

	"github.com/peregrine-net/peregrine/internal/testutil/frames"
)

// Frame builders for the test runs: inner frames as the VXLAN device hands them to tc.

type frame struct {
	dst, src net.HardwareAddr
	vlan     bool
	v6       bool
	saddr    string
	daddr    string
	proto    byte
	sport    uint16
	dport    uint16
	tos      byte
	ttl      byte
	fragOff  uint16 // IPv4 flags+offset field; IPv6: nonzero adds a fragment header
	hbh      bool   // IPv6: a hop-by-hop options header before L4
	payload  int
}

func (f frame) l4() []byte {
	b := frames.L4(f.proto, f.sport, f.dport, f.payload)
	for i := len(b) - f.payload; i < len(b); i++ {
		b[i] = byte(i)
	}
	return b
}

func (f frame) bytes() []byte {
	src, dst := frames.Addr(f.saddr), frames.Addr(f.daddr)
	var vlans []uint16
	if f.vlan {
		vlans = []uint16{100}
	}
	if !f.v6 {
		ip := frames.IPv4{Src: src, Dst: dst, Proto: f.proto, TOS: f.tos, TTL: f.ttl, FragOff: f.fragOff, ID: 0x1234}
		return frames.EthMAC(f.dst, f.src, 0x0800, ip.Wrap(f.l4()), vlans...)
	}
	ip := frames.IPv6{Src: src, Dst: dst, Next: f.proto, TClass: f.tos, HopLimit: f.ttl}
	if f.fragOff != 0 { // offset 0, M=1, id 7
		ip.Ext, ip.Next = []byte{ip.Next, 0, 0, 1, 0, 0, 0, 7}, 44
	}
	if f.hbh {
		ip.Ext, ip.Next = append(frames.Ext(ip.Next), ip.Ext...), 0
	}
	return frames.EthMAC(f.dst, f.src, 0x86dd, ip.Wrap(f.l4()), vlans...)
}

// routed is the frame as IP forwarding out of the bridge delivers it: new MACs, TTL/hop
// limit one less, IPv4 header checksum recomputed from scratch (not incrementally, so the
// program's incremental update is checked against an independent computation).
func (f frame) routed(ctrMAC, brMAC net.HardwareAddr) []byte {
	if f.ttl == 0 {
		f.ttl = 64
	}
	f.ttl--
	f.dst, f.src = ctrMAC, brMAC
	return f.bytes()
}
