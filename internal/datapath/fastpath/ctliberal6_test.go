package fastpath

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// TestAppendCT6Liberal: an IPv6 request (nfgenmsg family AF_INET6), no NLM_F_CREATE, the
// tuple's IPv6 addresses as the packet carries them and its ports, liberal on both directions.
func TestAppendCT6Liberal(t *testing.T) {
	k := key6(pod6A, pod6B, 40000, 5201, 6)
	tu := ctTuple6{src: k.Local, dst: k.Remote, sport: k.Lport, dport: k.Rport}
	b := appendCT6Liberal(appendCT6Liberal(nil, tu, 1), tu, 2)
	l := binary.NativeEndian.Uint32(b)
	if 2*int(l) != len(b) {
		t.Fatalf("nlmsg_len %d, two messages %d bytes", l, len(b))
	}
	if typ := binary.NativeEndian.Uint16(b[4:]); typ != unix.NFNL_SUBSYS_CTNETLINK<<8|ipctnlMsgCTNew {
		t.Fatalf("type %#x", typ)
	}
	if fl := binary.NativeEndian.Uint16(b[6:]); fl&unix.NLM_F_CREATE != 0 {
		t.Fatal("NLM_F_CREATE: the update could make an entry")
	}
	if b[unix.NLMSG_HDRLEN] != unix.AF_INET6 || b[l+unix.NLMSG_HDRLEN] != unix.AF_INET6 {
		t.Fatalf("nfgenmsg family %d, %d: want AF_INET6", b[unix.NLMSG_HDRLEN], b[l+unix.NLMSG_HDRLEN])
	}
	var src, dst []byte
	var ports [][]byte
	var flags [][]byte
	nlAttrs(b[unix.NLMSG_HDRLEN+sizeofNfgenmsg:l], func(typ uint16, v []byte) {
		switch typ {
		case nl.CTA_TUPLE_ORIG:
			nlAttrs(v, func(typ uint16, v []byte) {
				nlAttrs(v, func(a uint16, v []byte) {
					switch {
					case typ == nl.CTA_TUPLE_IP && a == nl.CTA_IP_V6_SRC:
						src = v
					case typ == nl.CTA_TUPLE_IP && a == nl.CTA_IP_V6_DST:
						dst = v
					case typ == nl.CTA_TUPLE_PROTO && (a == nl.CTA_PROTO_SRC_PORT || a == nl.CTA_PROTO_DST_PORT):
						ports = append(ports, v)
					}
				})
			})
		case nl.CTA_PROTOINFO:
			nlAttrs(v, func(_ uint16, v []byte) {
				nlAttrs(v, func(_ uint16, v []byte) { flags = append(flags, v) })
			})
		}
	})
	if a, _ := netip.AddrFromSlice(src); a != pod6A {
		t.Errorf("source %v, want %v", a, pod6A)
	}
	if a, _ := netip.AddrFromSlice(dst); a != pod6B {
		t.Errorf("destination %v, want %v", a, pod6B)
	}
	if len(ports) != 2 || !bytes.Equal(ports[0], []byte{40000 >> 8, 40000 & 0xff}) || !bytes.Equal(ports[1], []byte{5201 >> 8, 5201 & 0xff}) {
		t.Errorf("ports %x, want 40000 and 5201 in network order", ports)
	}
	if len(flags) != 2 || flags[0][0] != ctTCPFlagBeLiberal || flags[0][1] != ctTCPFlagBeLiberal || flags[1][0] != ctTCPFlagBeLiberal {
		t.Errorf("flags %v, want liberal with its mask on both directions", flags)
	}
}
