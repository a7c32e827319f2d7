// Package ctnl writes the few ctnetlink requests peregrine's modes send to conntrack by hand
// (vishvananda/netlink writes neither per-entry TCP flags nor batched deletes): the update that
// makes one TCP connection's window tracking liberal, and the delete of one entry, over a plain
// NETLINK_NETFILTER socket opened in a given namespace. The fast path (fastpath/ctliberal.go)
// and prism (prism/ctliberal.go) both use it.
package ctnl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Tuple is one direction of a conntrack entry: IPv4 or IPv6 addresses (both of one family),
// ports in host order. Conntrack finds an entry by either direction's tuple.
type Tuple struct {
	Src, Dst     netip.Addr
	Sport, Dport uint16
	Proto        uint8
}

// IP_CT_TCP_FLAG_BE_LIBERAL (linux/netfilter/nf_conntrack_tcp.h): this direction's window is not
// checked, as nf_conntrack_tcp_be_liberal does for every entry of a namespace.
const TCPFlagBeLiberal = 0x08

// Message types (IPCTNL_MSG_CT_*) and the size of struct nfgenmsg.
const (
	MsgNew         = 0
	MsgGet         = 1
	MsgDelete      = 2
	SizeofNfgenmsg = 4
)

// Attr appends one attribute (payload padded) to b.
func Attr(b []byte, typ uint16, val []byte) []byte {
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

// AppendLiberal appends to b a ctnetlink update (IPCTNL_MSG_CT_NEW without NLM_F_CREATE: an
// existing entry only) that sets IP_CT_TCP_FLAG_BE_LIBERAL on both directions of the TCP entry
// one of whose tuples is t.
func AppendLiberal(b []byte, t Tuple, seq uint32) []byte {
	var tcp, info []byte
	flags := []byte{TCPFlagBeLiberal, TCPFlagBeLiberal} // struct nf_ct_tcp_flags {flags, mask}
	tcp = Attr(tcp, nl.CTA_PROTOINFO_TCP_FLAGS_ORIGINAL, flags)
	tcp = Attr(tcp, nl.CTA_PROTOINFO_TCP_FLAGS_REPLY, flags)
	info = Attr(info, nl.CTA_PROTOINFO_TCP|unix.NLA_F_NESTED, tcp)
	attrs := Attr(TupleAttr(t), nl.CTA_PROTOINFO|unix.NLA_F_NESTED, info)
	return AppendMsg(b, MsgNew, family(t), seq, attrs)
}

// AppendDelete appends to b a ctnetlink delete of the entry one of whose tuples is t.
func AppendDelete(b []byte, t Tuple, seq uint32) []byte {
	return AppendMsg(b, MsgDelete, family(t), seq, TupleAttr(t))
}

// AppendGet appends to b a ctnetlink GET of the entry one of whose tuples is t: the answer is
// the entry (IPCTNL_MSG_CT_NEW, with its CTA_ID) or an error (ENOENT: none).
func AppendGet(b []byte, t Tuple, seq uint32) []byte {
	return AppendMsg(b, MsgGet, family(t), seq, TupleAttr(t))
}

// AppendDeleteID appends to b a ctnetlink delete of the entry of tuple t only if its id is still
// id (CTA_ID; the attribute's 4 bytes as a GET's answer carried them, read as a native integer):
// the kernel refuses another entry under the same tuple with ENOENT.
func AppendDeleteID(b []byte, t Tuple, id uint32, seq uint32) []byte {
	return AppendMsg(b, MsgDelete, family(t), seq, Attr(TupleAttr(t), nl.CTA_ID, binary.NativeEndian.AppendUint32(nil, id)))
}

func family(t Tuple) uint8 {
	if t.Src.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// TupleAttr is t as a CTA_TUPLE_ORIG attribute.
func TupleAttr(t Tuple) []byte {
	var ip, proto, tuple []byte
	if t.Src.Is4() {
		s, d := t.Src.As4(), t.Dst.As4()
		ip = Attr(ip, nl.CTA_IP_V4_SRC, s[:])
		ip = Attr(ip, nl.CTA_IP_V4_DST, d[:])
	} else {
		s, d := t.Src.As16(), t.Dst.As16()
		ip = Attr(ip, nl.CTA_IP_V6_SRC, s[:])
		ip = Attr(ip, nl.CTA_IP_V6_DST, d[:])
	}
	proto = Attr(proto, nl.CTA_PROTO_NUM, []byte{t.Proto})
	proto = Attr(proto, nl.CTA_PROTO_SRC_PORT, binary.BigEndian.AppendUint16(nil, t.Sport))
	proto = Attr(proto, nl.CTA_PROTO_DST_PORT, binary.BigEndian.AppendUint16(nil, t.Dport))
	tuple = Attr(tuple, nl.CTA_TUPLE_IP|unix.NLA_F_NESTED, ip)
	tuple = Attr(tuple, nl.CTA_TUPLE_PROTO|unix.NLA_F_NESTED, proto)
	return Attr(nil, nl.CTA_TUPLE_ORIG|unix.NLA_F_NESTED, tuple)
}

// AppendMsg appends one ctnetlink request of type typ for address family fam with attributes
// attrs; errors come back, no ACK is asked.
func AppendMsg(b []byte, typ uint16, fam uint8, seq uint32, attrs []byte) []byte {
	l := unix.SizeofNlMsghdr + SizeofNfgenmsg + len(attrs)
	b = binary.NativeEndian.AppendUint32(b, uint32(l))
	b = binary.NativeEndian.AppendUint16(b, unix.NFNL_SUBSYS_CTNETLINK<<8|typ)
	b = binary.NativeEndian.AppendUint16(b, unix.NLM_F_REQUEST)
	b = binary.NativeEndian.AppendUint32(b, seq)
	b = binary.NativeEndian.AppendUint32(b, 0)
	b = append(b, fam, unix.NFNETLINK_V0, 0, 0) // nfgenmsg: family, version, res_id
	return append(b, attrs...)
}

// Sock is a plain ctnetlink socket in one namespace for requests whose answers are drained, not
// read one by one.
type Sock struct {
	fd  int
	buf []byte // the answers' receive buffer, made once (see rbuf)
}

// rbuf is the buffer Send and Exchange read answers into. One per socket, not one per call:
// the fast path's agent asks conntrack about every connection closed on the fast path (a GET
// and a delete each, ctclosed.go), and a fresh 256 KiB per exchange was a fifth of the agent's
// CPU under short connections (allocation and the garbage collections it set off, measured
// with perf during a CRR run). A Sock serves one caller at a time, as its one fd must.
func (s *Sock) rbuf() []byte {
	if s.buf == nil {
		s.buf = make([]byte, 256<<10)
	}
	return s.buf
}

// Open opens a ctnetlink socket in namespace ns (netnsutil's names).
func Open(ns string) (*Sock, error) {
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
	return &Sock{fd: fd}, nil
}

// Close closes the socket.
func (s *Sock) Close() { unix.Close(s.fd) }

// Send writes a buffer of requests and drains what came back (the kernel answers a request
// within the sendto): the number of requests it refused with ENOENT (no such entry) and the
// first other error.
func (s *Sock) Send(b []byte) (missing int, err error) {
	if len(b) == 0 {
		return 0, nil
	}
	if err := unix.Sendto(s.fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, err
	}
	buf := s.rbuf()
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

// Exchange writes a buffer of requests and hands each message that came back (the kernel
// answers a request within the sendto: entries for a GET, errors) to fn, until none is left.
// A message's Data lies in the socket's receive buffer: fn must copy what it keeps.
func (s *Sock) Exchange(b []byte, fn func(syscall.NetlinkMessage)) error {
	if len(b) == 0 {
		return nil
	}
	if err := unix.Sendto(s.fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := s.rbuf()
	for {
		n, _, err := unix.Recvfrom(s.fd, buf, unix.MSG_DONTWAIT)
		if errors.Is(err, unix.EAGAIN) {
			return nil
		}
		if err != nil {
			return err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			fn(m)
		}
	}
}
