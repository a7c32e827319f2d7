package fastpath

import (
	"encoding/binary"
	"net/netip"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/datapath/ctnl"
)

// A few ctnetlink messages, read and written by hand: the conntrack entries' tuples from
// DESTROY events (ctwatch.go, parsed here) and the per-entry TCP flag update that makes one
// connection's window tracking liberal and the delete (ctliberal.go; written by the ctnl
// package, which prism shares). vishvananda/netlink neither parses events nor writes those
// flags.

// ctTuple is one direction of a conntrack entry, addresses and ports as the fast path's keys
// hold them (network order read as native integers).
type ctTuple struct {
	src, dst     uint32
	sport, dport uint16
	proto        uint8
}

// ctAddrs6 are one direction's IPv6 addresses of a conntrack entry, as fpFpKey6 holds them.
type ctAddrs6 struct{ src, dst [4]uint32 }

// ctEntry is what a DESTROY event says: both directions of the entry (reply differs from
// orig's mirror where NAT translated it).
// For an IPv6 entry v6 is set, orig6/reply6 hold the addresses and orig/reply the ports and
// protocol (their IPv4 addresses zero).
type ctEntry struct {
	orig, reply   ctTuple
	v6            bool
	orig6, reply6 ctAddrs6
	status        uint32 // CTA_STATUS: IPS_* bits (0 when the message had none)
}

// ipsFixedTimeout is IPS_FIXED_TIMEOUT: the programs set it on a connection's entry they
// expired at its close (closed_expire, bpf/fastpath_closed.h).
const ipsFixedTimeout = 1 << 10

// closedFast says e is the entry of a short TCP connection the programs expired at its close:
// its DESTROY event (conntrack reaps an expired entry late, often at the next connection's SYN
// on the same ports) is no deletion to act on, and acting on it would make the new
// connection's flow due (ctwatch.go). No handshake-only TCP entry has the bit otherwise.
func (e ctEntry) closedFast() bool {
	return e.orig.proto == unix.IPPROTO_TCP && e.status&ipsFixedTimeout != 0
}

// nlAttrs walks the netlink attributes in b and calls fn with each one's type (nested and
// byte-order flags masked off) and payload; it stops quietly at a truncated attribute.
func nlAttrs(b []byte, fn func(typ uint16, val []byte)) {
	for len(b) >= unix.SizeofNlAttr {
		l := int(binary.NativeEndian.Uint16(b))
		if l < unix.SizeofNlAttr || l > len(b) {
			return
		}
		fn(binary.NativeEndian.Uint16(b[2:])&nlaTypeMask, b[unix.SizeofNlAttr:l])
		a := (l + unix.NLA_ALIGNTO - 1) &^ (unix.NLA_ALIGNTO - 1)
		if a >= len(b) {
			return
		}
		b = b[a:]
	}
}

// parseCTTuple reads an IPv4 CTA_TUPLE_ORIG/REPLY payload; false unless it is IPv4 with a
// protocol.
func parseCTTuple(b []byte) (ctTuple, bool) {
	t, _, ok := parseCTTupleOf(b, unix.AF_INET)
	return t, ok
}

// parseCTTupleOf reads a CTA_TUPLE_ORIG/REPLY payload of family (AF_INET or AF_INET6): the
// ports and protocol in the ctTuple, an IPv6 tuple's addresses in the ctAddrs6; false unless it
// has a source address of that family and a protocol.
func parseCTTupleOf(b []byte, family byte) (ctTuple, ctAddrs6, bool) {
	var t ctTuple
	var a6 ctAddrs6
	v6 := family == unix.AF_INET6
	var haveIP, haveProto bool
	nlAttrs(b, func(typ uint16, v []byte) {
		switch typ {
		case nl.CTA_TUPLE_IP:
			nlAttrs(v, func(typ uint16, v []byte) {
				switch {
				case !v6 && len(v) == 4 && typ == nl.CTA_IP_V4_SRC:
					t.src = binary.NativeEndian.Uint32(v)
					haveIP = true
				case !v6 && len(v) == 4 && typ == nl.CTA_IP_V4_DST:
					t.dst = binary.NativeEndian.Uint32(v)
				case v6 && len(v) == 16 && typ == nl.CTA_IP_V6_SRC:
					a6.src = words16(v)
					haveIP = true
				case v6 && len(v) == 16 && typ == nl.CTA_IP_V6_DST:
					a6.dst = words16(v)
				}
			})
		case nl.CTA_TUPLE_PROTO:
			nlAttrs(v, func(typ uint16, v []byte) {
				switch {
				case typ == nl.CTA_PROTO_NUM && len(v) == 1:
					t.proto = v[0]
					haveProto = true
				case (typ == nl.CTA_PROTO_SRC_PORT || typ == ctaProtoICMPID) && len(v) == 2:
					t.sport = binary.NativeEndian.Uint16(v)
					if typ == ctaProtoICMPID { // an echo's key holds the identifier both ways
						t.dport = t.sport
					}
				case typ == nl.CTA_PROTO_DST_PORT && len(v) == 2:
					t.dport = binary.NativeEndian.Uint16(v)
				}
			})
		}
	})
	return t, a6, haveIP && haveProto
}

const ctaProtoICMPID = 4 // CTA_PROTO_ICMP_ID

// words16 is a 16-byte IPv6 address (network order) as fpFpKey6's words hold it.
func words16(v []byte) [4]uint32 {
	var w [4]uint32
	for i := range w {
		w[i] = binary.NativeEndian.Uint32(v[4*i:])
	}
	return w
}

// parseCTEvent reads a ctnetlink message (nfgenmsg, then attributes); false unless it is an
// IPv4 or IPv6 entry with both tuples.
func parseCTEvent(data []byte) (ctEntry, bool) {
	var e ctEntry
	if len(data) < sizeofNfgenmsg || (data[0] != unix.AF_INET && data[0] != unix.AF_INET6) {
		return e, false
	}
	family := data[0]
	e.v6 = family == unix.AF_INET6
	var okO, okR bool
	nlAttrs(data[sizeofNfgenmsg:], func(typ uint16, v []byte) {
		switch typ {
		case nl.CTA_TUPLE_ORIG:
			e.orig, e.orig6, okO = parseCTTupleOf(v, family)
		case nl.CTA_TUPLE_REPLY:
			e.reply, e.reply6, okR = parseCTTupleOf(v, family)
		case nl.CTA_STATUS:
			if len(v) == 4 {
				e.status = binary.BigEndian.Uint32(v)
			}
		}
	})
	return e, okO && okR
}

// nlAttr appends one attribute (payload padded) to b (the shared ctnl package's encoder).
func nlAttr(b []byte, typ uint16, val []byte) []byte { return ctnl.Attr(b, typ, val) }

func be16(v uint16) []byte { return binary.NativeEndian.AppendUint16(nil, v) }
func be32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

const ctTCPFlagBeLiberal = ctnl.TCPFlagBeLiberal

// nl is t in the shared ctnl package's form: the addresses' and ports' network-order bytes,
// which the fast path's keys hold read as native integers.
func (t ctTuple) nl() ctnl.Tuple {
	s, d := be32(t.src), be32(t.dst)
	return ctnl.Tuple{Src: netip.AddrFrom4([4]byte(s)), Dst: netip.AddrFrom4([4]byte(d)),
		Sport: binary.BigEndian.Uint16(be16(t.sport)), Dport: binary.BigEndian.Uint16(be16(t.dport)), Proto: t.proto}
}

// appendCTLiberal appends to b the ctnetlink update that makes both directions of the TCP
// entry one of whose tuples is t liberal (ctnl.AppendLiberal).
func appendCTLiberal(b []byte, t ctTuple, seq uint32) []byte {
	return ctnl.AppendLiberal(b, t.nl(), seq)
}

// ctTupleAttr is t as a CTA_TUPLE_ORIG attribute (ctnl.TupleAttr).
func ctTupleAttr(t ctTuple) []byte { return ctnl.TupleAttr(t.nl()) }

// appendCTMsg appends one IPv4 ctnetlink request of type typ with attributes attrs (ctnl.AppendMsg).
func appendCTMsg(b []byte, typ uint16, seq uint32, attrs []byte) []byte {
	return ctnl.AppendMsg(b, typ, unix.AF_INET, seq, attrs)
}

// appendCTDelete appends to b a ctnetlink delete of the entry one of whose tuples is t.
func appendCTDelete(b []byte, t ctTuple, seq uint32) []byte { return ctnl.AppendDelete(b, t.nl(), seq) }

// ctSock is a ctnetlink socket in one namespace (ctnl.Sock).
type ctSock struct{ *ctnl.Sock }

func openCTSock(ns string) (*ctSock, error) {
	s, err := ctnl.Open(ns)
	if err != nil {
		return nil, err
	}
	return &ctSock{s}, nil
}

// send writes a buffer of requests and drains the answers (ctnl.Sock.Send).
func (s *ctSock) send(b []byte) (missing int, err error) { return s.Send(b) }

const (
	nlaTypeMask    = ^uint16(unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
	sizeofNfgenmsg = ctnl.SizeofNfgenmsg
	ipctnlMsgCTNew = ctnl.MsgNew    // IPCTNL_MSG_CT_NEW
	ipctnlMsgCTDel = ctnl.MsgDelete // IPCTNL_MSG_CT_DELETE
)
