package ctnl

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// attrs walks the attributes of b into a map by type (nested flags masked off).
func attrs(b []byte) map[uint16][]byte {
	out := map[uint16][]byte{}
	for len(b) >= unix.SizeofNlAttr {
		l := int(binary.NativeEndian.Uint16(b))
		if l < unix.SizeofNlAttr || l > len(b) {
			break
		}
		out[binary.NativeEndian.Uint16(b[2:])&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER)] = b[unix.SizeofNlAttr:l]
		b = b[min(len(b), (l+3)&^3):]
	}
	return out
}

// TestAppendLiberalIPv6: an IPv6 tuple gives an AF_INET6 message with the 16-byte addresses
// and big-endian ports, and both directions' liberal flag with its mask.
func TestAppendLiberalIPv6(t *testing.T) {
	tu := Tuple{Src: netip.MustParseAddr("fd00::1"), Dst: netip.MustParseAddr("fd00::2"), Sport: 40000, Dport: 11211, Proto: 6}
	b := AppendLiberal(nil, tu, 7)
	if l := binary.NativeEndian.Uint32(b); int(l) != len(b) {
		t.Fatalf("length %d, message %d bytes", l, len(b))
	}
	if typ := binary.NativeEndian.Uint16(b[4:]); typ != unix.NFNL_SUBSYS_CTNETLINK<<8|MsgNew {
		t.Fatalf("type %#x", typ)
	}
	if fam := b[unix.SizeofNlMsghdr]; fam != unix.AF_INET6 {
		t.Fatalf("family %d", fam)
	}
	top := attrs(b[unix.SizeofNlMsghdr+SizeofNfgenmsg:])
	tuple := attrs(top[nl.CTA_TUPLE_ORIG])
	ip, proto := attrs(tuple[nl.CTA_TUPLE_IP]), attrs(tuple[nl.CTA_TUPLE_PROTO])
	if a, _ := netip.AddrFromSlice(ip[nl.CTA_IP_V6_SRC]); a != tu.Src {
		t.Errorf("src %v", a)
	}
	if a, _ := netip.AddrFromSlice(ip[nl.CTA_IP_V6_DST]); a != tu.Dst {
		t.Errorf("dst %v", a)
	}
	if p := binary.BigEndian.Uint16(proto[nl.CTA_PROTO_DST_PORT]); p != 11211 {
		t.Errorf("dport %d", p)
	}
	tcp := attrs(attrs(top[nl.CTA_PROTOINFO])[nl.CTA_PROTOINFO_TCP])
	for _, k := range []uint16{nl.CTA_PROTOINFO_TCP_FLAGS_ORIGINAL, nl.CTA_PROTOINFO_TCP_FLAGS_REPLY} {
		if f := tcp[k]; len(f) != 2 || f[0] != TCPFlagBeLiberal || f[1] != TCPFlagBeLiberal {
			t.Errorf("flags %d: %v", k, f)
		}
	}
	if d := AppendDelete(nil, Tuple{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), Proto: 17}, 1); d[unix.SizeofNlMsghdr] != unix.AF_INET {
		t.Errorf("IPv4 delete family %d", d[unix.SizeofNlMsghdr])
	}
}

// TestAppendGetDeleteIDIPv6: the GET and the delete-by-id of an IPv6 entry are AF_INET6
// messages of their type with the 16-byte addresses; the delete carries the id's bytes as a
// GET's answer held them (native read, native write); an IPv4 tuple gives AF_INET.
func TestAppendGetDeleteIDIPv6(t *testing.T) {
	src, dst := netip.MustParseAddr("fd70:7267:0:1::2"), netip.MustParseAddr("fd70:7267:0:2::2")
	tu := Tuple{Src: src, Dst: dst, Sport: 40000, Dport: 5201, Proto: 6}
	id := []byte{0xde, 0xad, 0xbe, 0xef}
	for _, c := range []struct {
		b   []byte
		typ uint16
	}{{AppendGet(nil, tu, 3), MsgGet}, {AppendDeleteID(nil, tu, binary.NativeEndian.Uint32(id), 4), MsgDelete}} {
		if typ := binary.NativeEndian.Uint16(c.b[4:]); typ != unix.NFNL_SUBSYS_CTNETLINK<<8|c.typ {
			t.Fatalf("type %#x, want message %d", typ, c.typ)
		}
		if fam := c.b[unix.NLMSG_HDRLEN]; fam != unix.AF_INET6 {
			t.Fatalf("family %d, want AF_INET6", fam)
		}
		top := attrs(c.b[unix.NLMSG_HDRLEN+SizeofNfgenmsg:])
		ip := attrs(attrs(top[nl.CTA_TUPLE_ORIG])[nl.CTA_TUPLE_IP])
		if s, _ := netip.AddrFromSlice(ip[nl.CTA_IP_V6_SRC]); s != src {
			t.Fatalf("source %v, want %v", s, src)
		}
		if d, _ := netip.AddrFromSlice(ip[nl.CTA_IP_V6_DST]); d != dst {
			t.Fatalf("destination %v, want %v", d, dst)
		}
		gotID, has := top[nl.CTA_ID]
		if want := c.typ == MsgDelete; has != want || (want && string(gotID) != string(id)) {
			t.Fatalf("message %d: CTA_ID % x (present %v)", c.typ, gotID, has)
		}
	}
	v4 := Tuple{Src: netip.MustParseAddr("10.244.1.2"), Dst: netip.MustParseAddr("10.244.2.2"), Sport: 1, Dport: 2, Proto: 6}
	if fam := AppendGet(nil, v4, 1)[unix.NLMSG_HDRLEN]; fam != unix.AF_INET {
		t.Fatalf("IPv4 GET family %d", fam)
	}
}
