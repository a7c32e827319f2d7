// Package pipedevice is peregrine's PipeDevice: an intra-host channel between containers made of
// per-connection shared-memory rings that a copy engine (a pinned daemon thread standing in for the
// paper's FPGA) moves data between. The daemon plays the paper's PD Driver: it owns all memory,
// keeps the connection table and the authoritative ring state (RBT), and hands each process only
// the memory of its own sockets (memfds over SCM_RIGHTS).
//
// The shared-memory layout below is a contract with libpd (libpd/pd_internal.h and libpd/*.c): change both
// together (TestLayoutMatchesLibpd compares them).
package pipedevice

import "encoding/binary"

// Layout of the per-process control memfd ("ctl"): a header page, then nq submission/completion
// queue pairs, then one 64-byte header per socket id.
const (
	CtlMagic    = 0x50445031 // "PDP1"
	HdrPage     = 4096
	QueueHdr    = 128 // producer word (64 B line) + consumer word (64 B line)
	EntrySize   = 32
	SockHdrSize = 64

	DefaultQDepth  = 1024
	DefaultMaxSock = 8192
	DefaultRing    = 2 << 20  // receive ring per socket (one hugepage)
	DefaultPool    = 16 << 20 // send ring (pd_malloc pool) per process
	MaxChunk       = 32 << 10 // bytes per SQ entry (data_len is 16 bits)

	// process header fields
	PhMagic    = 0
	PhNQ       = 4
	PhQDepth   = 8
	PhMaxSock  = 12
	PhSleeping = 64 // u32: the library is (about to be) blocked on its notify eventfd

	// socket header fields (offsets inside one 64-byte socket header)
	ShRxTail   = 0  // u64 engine: bytes delivered into the receive ring (stream position)
	ShRxHead   = 8  // u64 library: bytes consumed (its own view; the engine keeps the authoritative one)
	ShTxLimit  = 16 // u64 engine: the stream position up to which the peer's ring has room
	ShTxQueued = 24 // u64 library: bytes queued for sending
	ShState    = 32 // u32 daemon/engine: SockFree.. SockReset
	ShPending  = 36 // u32 daemon: connections waiting in the backlog (listening sockets)
	ShTxDone   = 40 // u64 engine: bytes of sends completed
	ShError    = 48 // u32 engine: last asynchronous error (errno) on this socket
)

// Socket states (the paper's state machine: ACTIVE after pd_socket, LISTEN, CONNECTED; we add the
// two ways a connection ends).
const (
	SockFree       = 0
	SockActive     = 1
	SockListen     = 2
	SockConnected  = 3
	SockPeerClosed = 4 // the peer closed: receive what is left, then 0
	SockClosed     = 5
)

// Queue entry types (Fig. 6's req_type).
const (
	ReqSend       = 1 // copy data_len bytes from the process's send ring at src_addr to the peer
	ReqSendDirect = 2 // direct mode: publish data_len bytes written in place at stream position dst_addr
	ReqRelease    = 3 // the receiver consumed dst_addr bytes (pd_recv_done): RBT head moves
	ReqClose      = 4 // posted by the daemon behind the socket's earlier entries on pd_close
	ReqCompleted  = 0x81
	ReqFailed     = 0x82 // status holds the errno
)

// Entry is one 32-byte queue entry. Field set of the paper's Fig. 6, naturally aligned, with the
// reserved bytes used for the lock-free slot sequence and a status word:
//
//	0 u32 seq | 4 u8 type | 5 u8 table_id | 6 u16 data_len | 8 u64 src_addr | 16 u64 dst_addr |
//	24 u16 cid | 26 u16 conn_id | 28 u16 entry_seq | 30 u16 status
type Entry struct {
	Type     uint8
	TableID  uint8
	DataLen  uint16
	Src      uint64
	Dst      uint64
	CID      uint16
	ConnID   uint16
	EntrySeq uint16
	Status   uint16
}

func (e *Entry) put(b []byte) {
	b[4] = e.Type
	b[5] = e.TableID
	binary.LittleEndian.PutUint16(b[6:], e.DataLen)
	binary.LittleEndian.PutUint64(b[8:], e.Src)
	binary.LittleEndian.PutUint64(b[16:], e.Dst)
	binary.LittleEndian.PutUint16(b[24:], e.CID)
	binary.LittleEndian.PutUint16(b[26:], e.ConnID)
	binary.LittleEndian.PutUint16(b[28:], e.EntrySeq)
	binary.LittleEndian.PutUint16(b[30:], e.Status)
}

func (e *Entry) get(b []byte) {
	e.Type = b[4]
	e.TableID = b[5]
	e.DataLen = binary.LittleEndian.Uint16(b[6:])
	e.Src = binary.LittleEndian.Uint64(b[8:])
	e.Dst = binary.LittleEndian.Uint64(b[16:])
	e.CID = binary.LittleEndian.Uint16(b[24:])
	e.ConnID = binary.LittleEndian.Uint16(b[26:])
	e.EntrySeq = binary.LittleEndian.Uint16(b[28:])
	e.Status = binary.LittleEndian.Uint16(b[30:])
}

// CtlLayout says where things are in a process's control memfd.
type CtlLayout struct {
	NQ, QDepth, MaxSock int
}

func (l CtlLayout) queueBytes() int { return QueueHdr + l.QDepth*EntrySize }
func (l CtlLayout) SQOff(q int) int { return HdrPage + 2*q*l.queueBytes() }
func (l CtlLayout) CQOff(q int) int { return l.SQOff(q) + l.queueBytes() }
func (l CtlLayout) SockOff(sid int) int {
	return HdrPage + 2*l.NQ*l.queueBytes() + sid*SockHdrSize
}
func (l CtlLayout) Size() int { return pageRound(l.SockOff(l.MaxSock), 4096) }

func pageRound(n, page int) int { return (n + page - 1) / page * page }
