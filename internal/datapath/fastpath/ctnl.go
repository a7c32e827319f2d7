package fastpath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// A few ctnetlink messages, read and written by hand: the conntrack entries' tuples from
// DESTROY events (ctwatch.go) and the per-entry TCP flag update that makes one connection's
// window tracking liberal (ctliberal.go). vishvananda/netlink neither parses events nor
// writes those flags.

// ctTuple is one direction of a conntrack entry, addresses and ports as the fast path's keys
// hold them (network order read as native integers).
type ctTuple struct {
	src, dst     uint32
	sport, dport uint16
	proto        uint8
}

// ctEntry is what a DESTROY event says: both directions of the entry (reply differs from
// orig's mirror where NAT translated it).
type ctEntry struct{ orig, reply ctTuple }

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

// parseCTTuple reads a CTA_TUPLE_ORIG/REPLY payload; false unless it is IPv4 with a protocol.
func parseCTTuple(b []byte) (ctTuple, bool) {
	var t ctTuple
	var haveIP, haveProto bool
	nlAttrs(b, func(typ uint16, v []byte) {
		switch typ {
		case nl.CTA_TUPLE_IP:
			nlAttrs(v, func(typ uint16, v []byte) {
				if len(v) != 4 {
					return
				}
				switch typ {
				case nl.CTA_IP_V4_SRC:
					t.src = binary.NativeEndian.Uint32(v)
					haveIP = true
				case nl.CTA_IP_V4_DST:
					t.dst = binary.NativeEndian.Uint32(v)
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
	return t, haveIP && haveProto
}

const ctaProtoICMPID = 4 // CTA_PROTO_ICMP_ID

// parseCTEvent reads a ctnetlink message (nfgenmsg, then attributes); false unless it is an
// IPv4 entry with both tuples.
func parseCTEvent(data []byte) (ctEntry, bool) {
	var e ctEntry
	if len(data) < sizeofNfgenmsg || data[0] != unix.AF_INET {
		return e, false
	}
	var okO, okR bool
	nlAttrs(data[sizeofNfgenmsg:], func(typ uint16, v []byte) {
		switch typ {
		case nl.CTA_TUPLE_ORIG:
			e.orig, okO = parseCTTuple(v)
		case nl.CTA_TUPLE_REPLY:
			e.reply, okR = parseCTTuple(v)
		}
	})
	return e, okO && okR
}

// nlAttr appends one attribute (payload padded) to b.
func nlAttr(b []byte, typ uint16, val []byte) []byte {
	l := unix.SizeofNlAttr + len(val)
	b = binary.NativeEndian.AppendUint16(b, uint16(l))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, val...)
	for l%unix.NLA_ALIGNTO != 0 {
		b = append(b, 0)
		l++
	}
	return b
}

func be16(v uint16) []byte { return binary.NativeEndian.AppendUint16(nil, v) }
func be32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

// IP_CT_TCP_FLAG_BE_LIBERAL (linux/netfilter/nf_conntrack_tcp.h): this direction's window is
// not checked, as nf_conntrack_tcp_be_liberal does for every entry of a namespace.
const ctTCPFlagBeLiberal = 0x08

// appendCTLiberal appends to b a ctnetlink update (IPCTNL_MSG_CT_NEW without NLM_F_CREATE: an
// existing entry only) that sets IP_CT_TCP_FLAG_BE_LIBERAL on both directions of the TCP
// entry one of whose tuples is t (conntrack finds an entry by either direction's tuple).
func appendCTLiberal(b []byte, t ctTuple, seq uint32) []byte {
	var tcp, info []byte
	flags := []byte{ctTCPFlagBeLiberal, ctTCPFlagBeLiberal} // struct nf_ct_tcp_flags {flags, mask}
	tcp = nlAttr(tcp, nl.CTA_PROTOINFO_TCP_FLAGS_ORIGINAL, flags)
	tcp = nlAttr(tcp, nl.CTA_PROTOINFO_TCP_FLAGS_REPLY, flags)
	info = nlAttr(info, nl.CTA_PROTOINFO_TCP|unix.NLA_F_NESTED, tcp)
	attrs := nlAttr(ctTupleAttr(t), nl.CTA_PROTOINFO|unix.NLA_F_NESTED, info)
	return appendCTMsg(b, ipctnlMsgCTNew, seq, attrs)
}

// appendCTDelete appends to b a ctnetlink delete of the entry one of whose tuples is t.
func appendCTDelete(b []byte, t ctTuple, seq uint32) []byte {
	return appendCTMsg(b, ipctnlMsgCTDel, seq, ctTupleAttr(t))
}

// ctTupleAttr is t as a CTA_TUPLE_ORIG attribute (conntrack finds an entry by either
// direction's tuple there).
func ctTupleAttr(t ctTuple) []byte {
	var ip, proto, tuple []byte
	ip = nlAttr(ip, nl.CTA_IP_V4_SRC, be32(t.src))
	ip = nlAttr(ip, nl.CTA_IP_V4_DST, be32(t.dst))
	proto = nlAttr(proto, nl.CTA_PROTO_NUM, []byte{t.proto})
	proto = nlAttr(proto, nl.CTA_PROTO_SRC_PORT, be16(t.sport))
	proto = nlAttr(proto, nl.CTA_PROTO_DST_PORT, be16(t.dport))
	tuple = nlAttr(tuple, nl.CTA_TUPLE_IP|unix.NLA_F_NESTED, ip)
	tuple = nlAttr(tuple, nl.CTA_TUPLE_PROTO|unix.NLA_F_NESTED, proto)
	return nlAttr(nil, nl.CTA_TUPLE_ORIG|unix.NLA_F_NESTED, tuple)
}

// appendCTMsg appends one ctnetlink request of type typ with attributes attrs; errors come
// back, no ACK is asked.
func appendCTMsg(b []byte, typ uint16, seq uint32, attrs []byte) []byte {
	l := unix.SizeofNlMsghdr + sizeofNfgenmsg + len(attrs)
	b = binary.NativeEndian.AppendUint32(b, uint32(l))
	b = binary.NativeEndian.AppendUint16(b, unix.NFNL_SUBSYS_CTNETLINK<<8|typ)
	b = binary.NativeEndian.AppendUint16(b, unix.NLM_F_REQUEST)
	b = binary.NativeEndian.AppendUint32(b, seq)
	b = binary.NativeEndian.AppendUint32(b, 0)
	b = append(b, unix.AF_INET, unix.NFNETLINK_V0, 0, 0) // nfgenmsg: family, version, res_id
	return append(b, attrs...)
}

// ctSock is a plain ctnetlink socket in one namespace for requests whose answers are drained,
// not read one by one.
type ctSock struct{ fd int }

func openCTSock(ns string) (*ctSock, error) {
	fd := -1
	err := netnsutil.Do(ns, func() error {
		var err error
		fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
		if err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
	})
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("ctnetlink socket in %s: %w", netnsutil.Label(ns), err)
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 1<<20)
	return &ctSock{fd: fd}, nil
}

func (s *ctSock) Close() { unix.Close(s.fd) }

// send writes a buffer of requests and drains what came back: the number of requests the
// kernel refused with ENOENT (no such entry) and the first other error.
func (s *ctSock) send(b []byte) (missing int, err error) {
	if len(b) == 0 {
		return 0, nil
	}
	if err := unix.Sendto(s.fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, err
	}
	buf := make([]byte, 64<<10)
	for {
		n, _, rerr := unix.Recvfrom(s.fd, buf, unix.MSG_DONTWAIT)
		if rerr != nil {
			if errors.Is(rerr, unix.EAGAIN) {
				return missing, err
			}
			return missing, errors.Join(err, rerr)
		}
		msgs, perr := syscall.ParseNetlinkMessage(buf[:n])
		if perr != nil {
			return missing, errors.Join(err, perr)
		}
		for _, m := range msgs {
			if m.Header.Type != unix.NLMSG_ERROR || len(m.Data) < 4 {
				continue
			}
			switch e := -int32(binary.NativeEndian.Uint32(m.Data)); unix.Errno(e) {
			case 0:
			case unix.ENOENT:
				missing++
			default:
				if err == nil {
					err = unix.Errno(e)
				}
			}
		}
	}
}

const (
	nlaTypeMask    = ^uint16(unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
	sizeofNfgenmsg = 4
	ipctnlMsgCTNew = 0 // IPCTNL_MSG_CT_NEW
	ipctnlMsgCTDel = 2 // IPCTNL_MSG_CT_DELETE
)
