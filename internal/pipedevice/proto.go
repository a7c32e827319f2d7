package pipedevice

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// Control protocol between libpd and the daemon: SOCK_SEQPACKET messages, a fixed 64-byte
// request and a 64-byte reply (plus a JSON body for status), memfds and eventfds riding on the
// reply as SCM_RIGHTS. Little-endian; addresses and ports in network order as in sockaddr_in.
const (
	OpHello   = 1 // a0 = ring size wanted (0: default), a1 = pool size wanted -> fds ctl, pool, doorbell, notify, engine page
	OpSocket  = 2 // -> sid, fd rx ring
	OpBind    = 3
	OpListen  = 4 // a0 = backlog
	OpAccept  = 5 // -> new sid, peer addr, fds rx ring [, peer ring in direct mode]
	OpConnect = 6 // -> fds [peer ring in direct mode]
	OpClose   = 7
	OpStatus  = 8 // -> JSON body
	OpGetName = 9 // -> peer address of sid
	// OpSeal: a0 = 0: the caller mapped its control memory and pool (pd_init's last step; nothing
	// else is served before); a0 = 1: it mapped sid's peer ring (direct mode). See NewMemfd.
	OpSeal = 10

	MsgSize = 64
)

// Request is a control request.
type Request struct {
	Op, SID, A0, A1 uint32
	A2              uint64
	Addr            [4]byte
	Port            uint16 // network order value as stored in sin_port
}

// Reply is a control reply. Err is an errno (0: success).
type Reply struct {
	Err  uint32
	SID  uint32
	V    [6]uint32
	W    [2]uint64
	Addr [4]byte
	Port uint16
	Body []byte
	FDs  []int
}

func (r *Request) marshal() []byte {
	b := make([]byte, MsgSize)
	le := binary.LittleEndian
	le.PutUint32(b[0:], r.Op)
	le.PutUint32(b[4:], r.SID)
	le.PutUint32(b[8:], r.A0)
	le.PutUint32(b[12:], r.A1)
	le.PutUint64(b[16:], r.A2)
	copy(b[24:28], r.Addr[:])
	binary.BigEndian.PutUint16(b[28:], r.Port)
	return b
}

func parseRequest(b []byte) (Request, error) {
	if len(b) != MsgSize {
		return Request{}, fmt.Errorf("request of %d bytes, want %d", len(b), MsgSize)
	}
	le := binary.LittleEndian
	r := Request{Op: le.Uint32(b[0:]), SID: le.Uint32(b[4:]), A0: le.Uint32(b[8:]), A1: le.Uint32(b[12:]), A2: le.Uint64(b[16:])}
	copy(r.Addr[:], b[24:28])
	r.Port = binary.BigEndian.Uint16(b[28:])
	return r, nil
}

func (r *Reply) marshal() []byte {
	b := make([]byte, MsgSize, MsgSize+len(r.Body))
	le := binary.LittleEndian
	le.PutUint32(b[0:], r.Err)
	le.PutUint32(b[4:], r.SID)
	for i, v := range r.V {
		le.PutUint32(b[8+4*i:], v)
	}
	le.PutUint64(b[32:], r.W[0])
	le.PutUint64(b[40:], r.W[1])
	copy(b[48:52], r.Addr[:])
	binary.BigEndian.PutUint16(b[52:], r.Port)
	return append(b, r.Body...)
}

func parseReply(b []byte) (Reply, error) {
	if len(b) < MsgSize {
		return Reply{}, fmt.Errorf("reply of %d bytes", len(b))
	}
	le := binary.LittleEndian
	r := Reply{Err: le.Uint32(b[0:]), SID: le.Uint32(b[4:])}
	for i := range r.V {
		r.V[i] = le.Uint32(b[8+4*i:])
	}
	r.W[0], r.W[1] = le.Uint64(b[32:]), le.Uint64(b[40:])
	copy(r.Addr[:], b[48:52])
	r.Port = binary.BigEndian.Uint16(b[52:])
	r.Body = append([]byte(nil), b[MsgSize:]...)
	return r, nil
}

// AddrPort of a request or reply.
func addrPort(a [4]byte, port uint16) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4(a), port)
}

// recvMsg reads one message and any fds passed with it.
func recvMsg(fd int, buf []byte) (int, []int, error) {
	oob := make([]byte, unix.CmsgSpace(8*4))
	n, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return 0, nil, err
	}
	var fds []int
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err == nil {
			for _, m := range msgs {
				if f, err := unix.ParseUnixRights(&m); err == nil {
					fds = append(fds, f...)
				}
			}
		}
	}
	return n, fds, nil
}

func sendMsg(fd int, b []byte, fds []int) error {
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	return unix.Sendmsg(fd, b, oob, nil, 0)
}
