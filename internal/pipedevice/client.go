package pipedevice

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Client is the Go counterpart of libpd (same protocol, same shared-memory layout), for Go
// programs such as `peregrine pd perf` and the tests. One Client per process is the norm; it is
// safe for concurrent use (a mutex guards the library-side tables). Once the daemon is gone every
// call made 1 ms or more after its end fails with unix.ECONNRESET, as libpd's do (pd.h);
// CloseSock and Free still release what they are given.
type Client struct {
	mu       sync.Mutex
	conn     *net.UnixConn
	Direct   bool
	CID      uint16
	lay      CtlLayout
	ctl      []byte
	pool     []byte // mirrored: 2*poolSize
	poolSize uint64
	engPage  []byte
	doorbell int
	notify   int
	connFD   int          // a dup of the control socket, polled to learn that the daemon is gone
	dead     atomic.Bool  // the daemon went away (or broke the protocol): every call fails
	lastLook atomic.Int64 // deadNow's last look at the control socket (ns since clientEpoch)
	sqs, cqs []*Queue
	socks    map[int]*csock
	Ring     uint64
	PoolHuge bool
	// SpinLooks is how many times Wait checks (yielding between) before it sleeps; 0 sleeps at
	// once. Latency-bound programs set it (pd perf --latency uses 50).
	SpinLooks int

	// send block table (SBT) of the pool: fixed slots (an entry's EntrySeq names its block) and
	// the live blocks in offset order. First fit, so a buffer kept for a long time (reused after
	// pd_buf_refresh) does not pin the space behind it, as a ring allocator would.
	sbt       []sbtEntry
	order     []uint16 // live slots by offset
	freeSlots []uint16
}

type sbtEntry struct {
	off, size uint64
	inflight  int
	freed     bool
	live      bool
}

type csock struct {
	sid      int
	hdr      []byte
	rx       []byte // mirrored
	R        uint64
	q        int
	head     uint64
	unposted uint64
	queued   uint64
	peerRing []byte // direct mode: the peer's receive ring (mirrored)
	dalloc   uint64
	dpub     uint64
	Huge     bool
}

const sbtSize = 16384

// Errno errors are returned as unix.Errno so callers can compare with unix.EAGAIN etc.

// callTimeout bounds every control call: a daemon that does not answer is taken for dead.
const callTimeout = 5 * time.Second

// Dial connects to the daemon (pd_init). ring and pool 0 take the daemon's defaults.
func Dial(socket string, ring, pool int) (*Client, error) {
	if socket == "" {
		socket = DefaultSocket
	}
	conn, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: socket, Net: "unixpacket"})
	if err != nil {
		return nil, dialError(socket, err)
	}
	c := &Client{conn: conn, socks: map[int]*csock{}, sbt: make([]sbtEntry, sbtSize), doorbell: -1, notify: -1, connFD: -1}
	for i := sbtSize - 1; i >= 0; i-- {
		c.freeSlots = append(c.freeSlots, uint16(i))
	}
	if err := c.hello(ring, pool); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// hello asks for memory, checks every field of the reply before using it (a daemon, or whatever
// listens on the socket, is not trusted with the client's memory safety either), maps the memory
// and seals it.
func (c *Client) hello(ring, pool int) error {
	rep, err := c.call(Request{Op: OpHello, A0: uint32(ring), A1: uint32(pool)})
	if err != nil {
		return err
	}
	if len(rep.FDs) != 5 {
		closeFDs(rep.FDs)
		return fmt.Errorf("hello: %d fds: %w", len(rep.FDs), unix.EPROTO)
	}
	defer closeFDs([]int{rep.FDs[0], rep.FDs[1], rep.FDs[4]})
	c.doorbell, c.notify = rep.FDs[2], rep.FDs[3]
	c.CID = uint16(rep.SID)
	c.Direct = rep.V[0] == 1
	c.lay = CtlLayout{NQ: int(rep.V[1]), QDepth: int(rep.V[2]), MaxSock: int(rep.V[3])}
	c.PoolHuge = rep.V[4] == 1
	c.Ring, c.poolSize = rep.W[0], rep.W[1]
	if !replyLayoutOK(c.lay, c.Ring, c.poolSize) || rep.V[0] > 1 {
		return fmt.Errorf("hello: the daemon's reply is out of range (nq %d depth %d sockets %d ring %d pool %d): %w",
			c.lay.NQ, c.lay.QDepth, c.lay.MaxSock, c.Ring, c.poolSize, unix.EPROTO)
	}
	if c.ctl, err = unix.Mmap(rep.FDs[0], 0, c.lay.Size(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return err
	}
	if c.pool, err = MapMirror(rep.FDs[1], 0, int(c.poolSize)); err != nil {
		return err
	}
	if c.engPage, err = unix.Mmap(rep.FDs[4], 0, 4096, unix.PROT_READ, unix.MAP_SHARED); err != nil {
		return err
	}
	for q := 0; q < c.lay.NQ; q++ {
		c.sqs = append(c.sqs, NewQueue(c.ctl[c.lay.SQOff(q):c.lay.CQOff(q)], c.lay.QDepth))
		c.cqs = append(c.cqs, NewQueue(c.ctl[c.lay.CQOff(q):c.lay.CQOff(q)+QueueHdr+c.lay.QDepth*EntrySize], c.lay.QDepth))
	}
	raw, err := c.conn.SyscallConn()
	if err == nil {
		raw.Control(func(fd uintptr) { c.connFD, err = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) })
	}
	if err != nil {
		return err
	}
	_, err = c.call(Request{Op: OpSeal})
	return err
}

// replyLayoutOK: what a hello reply may say (the same bounds libpd checks).
func replyLayoutOK(l CtlLayout, ring, pool uint64) bool {
	pow2 := func(v, lo, hi uint64) bool { return v >= lo && v <= hi && v&(v-1) == 0 }
	return l.NQ >= 1 && l.NQ <= 1024 && pow2(uint64(l.QDepth), 64, 65536) && l.MaxSock >= 1 && l.MaxSock <= 65536 &&
		pow2(ring, 4096, 1<<30) && pow2(pool, 4096, 1<<30)
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// Close is pd_release: the daemon reclaims every socket of this client.
func (c *Client) Close() {
	c.dead.Store(true)
	c.conn.Close()
	if c.connFD >= 0 {
		unix.Close(c.connFD)
	}
	for _, m := range [][]byte{c.ctl, c.pool, c.engPage} {
		if m != nil {
			unix.Munmap(m)
		}
	}
	for _, s := range c.socks {
		unix.Munmap(s.rx)
		if s.peerRing != nil {
			unix.Munmap(s.peerRing)
		}
	}
	for _, fd := range []int{c.doorbell, c.notify} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// call runs one control request with a deadline. A failed or timed-out call leaves the protocol
// out of step, so the client is dead from then on (ECONNRESET for everything).
func (c *Client) call(r Request) (Reply, error) {
	if c.deadNow() {
		return Reply{}, unix.ECONNRESET
	}
	c.conn.SetDeadline(time.Now().Add(callTimeout))
	if _, _, err := c.conn.WriteMsgUnix(r.marshal(), nil, nil); err != nil {
		c.dead.Store(true)
		return Reply{}, fmt.Errorf("pd daemon: %w", unix.ECONNRESET)
	}
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(8*4))
	n, oobn, _, _, err := c.conn.ReadMsgUnix(buf, oob)
	if err != nil || n == 0 {
		c.dead.Store(true)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return Reply{}, fmt.Errorf("pd daemon did not answer in %v: %w", callTimeout, unix.ETIMEDOUT)
		}
		return Reply{}, fmt.Errorf("pd daemon gone: %w", unix.ECONNRESET)
	}
	rep, err := parseReply(buf[:n])
	if err != nil {
		return rep, err
	}
	if oobn > 0 {
		msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
		for _, m := range msgs {
			if f, err := unix.ParseUnixRights(&m); err == nil {
				rep.FDs = append(rep.FDs, f...)
			}
		}
	}
	if rep.Err != 0 {
		closeFDs(rep.FDs)
		return rep, unix.Errno(rep.Err)
	}
	return rep, nil
}

// dialError says what a failed connection to the daemon means and what to do.
func dialError(socket string, err error) error {
	hint := ""
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ECONNREFUSED):
		hint = " (is the daemon running? start it with `sudo peregrine pd daemon --socket " + socket + "`)"
	case errors.Is(err, unix.EACCES):
		hint = " (no permission on the socket: run as root or as the daemon's user)"
	}
	return fmt.Errorf("pd daemon at %s: %w%s", socket, err, hint)
}

// DaemonStatus asks a daemon for its status without becoming a client.
func DaemonStatus(socket string) ([]byte, error) {
	conn, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: socket, Net: "unixpacket"})
	if err != nil {
		return nil, dialError(socket, err)
	}
	defer conn.Close()
	c := &Client{conn: conn, connFD: -1}
	rep, err := c.call(Request{Op: OpStatus})
	if errors.Is(err, unix.EACCES) {
		// not root: a client (past hello) may ask; it sees its own namespace
		conn.Close()
		cl, err := Dial(socket, 0, 0)
		if err != nil {
			return nil, err
		}
		defer cl.Close()
		rep, err = cl.call(Request{Op: OpStatus})
		return rep.Body, err
	}
	return rep.Body, err
}

// addSock maps a new socket's receive ring (read-only: the daemon sealed it, or the peer writes
// it) and, in direct mode, the peer's ring, which it then asks the daemon to seal. The sid comes
// from the daemon and is checked like every other reply field.
func (c *Client) addSock(sid int, rxFD int, peerFD int) (*csock, error) {
	if sid < 0 || sid >= c.lay.MaxSock || c.socks[sid] != nil {
		closeFDs([]int{rxFD})
		if peerFD >= 0 {
			unix.Close(peerFD)
		}
		return nil, fmt.Errorf("socket id %d from the daemon: %w", sid, unix.EPROTO)
	}
	s := &csock{sid: sid, R: c.Ring, hdr: c.ctl[c.lay.SockOff(sid) : c.lay.SockOff(sid)+SockHdrSize]}
	var err error
	s.rx, err = MapMirrorRO(rxFD, 0, int(c.Ring))
	unix.Close(rxFD)
	if err != nil {
		if peerFD >= 0 {
			unix.Close(peerFD)
		}
		return nil, err
	}
	if peerFD >= 0 {
		if err := c.mapPeer(s, peerFD); err != nil {
			unix.Munmap(s.rx)
			return nil, err
		}
	}
	s.q = int(currentCPU()) % c.lay.NQ
	c.socks[sid] = s
	return s, nil
}

// mapPeer maps the peer's ring writable (direct mode) and has the daemon seal it.
func (c *Client) mapPeer(s *csock, fd int) error {
	var err error
	s.peerRing, err = MapMirror(fd, 0, int(c.Ring))
	unix.Close(fd)
	if err != nil {
		return err
	}
	if _, err = c.call(Request{Op: OpSeal, A0: 1, SID: uint32(s.sid)}); err != nil {
		unix.Munmap(s.peerRing)
		s.peerRing = nil
	}
	return err
}

// Socket is pd_socket.
func (c *Client) Socket() (int, error) {
	rep, err := c.call(Request{Op: OpSocket})
	if err != nil {
		return -1, err
	}
	if len(rep.FDs) != 1 {
		closeFDs(rep.FDs)
		return -1, unix.EPROTO
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s, err := c.addSock(int(rep.SID), rep.FDs[0], -1)
	if err != nil {
		return -1, err
	}
	s.Huge = rep.V[0] == 1
	return s.sid, nil
}

// Bind is pd_bind; port 0 picks one, returned.
func (c *Client) Bind(sid int, ap netip.AddrPort) (uint16, error) {
	rep, err := c.call(Request{Op: OpBind, SID: uint32(sid), Addr: ap.Addr().As4(), Port: ap.Port()})
	return rep.Port, err
}

// Listen is pd_listen.
func (c *Client) Listen(sid, backlog int) error {
	_, err := c.call(Request{Op: OpListen, SID: uint32(sid), A0: uint32(backlog)})
	return err
}

// Accept is pd_accept: unix.EAGAIN when no connection waits.
func (c *Client) Accept(sid int) (int, netip.AddrPort, error) {
	rep, err := c.call(Request{Op: OpAccept, SID: uint32(sid)})
	if err != nil {
		return -1, netip.AddrPort{}, err
	}
	if len(rep.FDs) < 1 || len(rep.FDs) > 2 {
		closeFDs(rep.FDs)
		return -1, netip.AddrPort{}, unix.EPROTO
	}
	peerFD := -1
	if len(rep.FDs) > 1 {
		peerFD = rep.FDs[1]
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := c.addSock(int(rep.SID), rep.FDs[0], peerFD); err != nil {
		return -1, netip.AddrPort{}, err
	}
	return int(rep.SID), addrPort(rep.Addr, rep.Port), nil
}

// Connect is pd_connect.
func (c *Client) Connect(sid int, ap netip.AddrPort) error {
	rep, err := c.call(Request{Op: OpConnect, SID: uint32(sid), Addr: ap.Addr().As4(), Port: ap.Port()})
	if err != nil {
		return err
	}
	if len(rep.FDs) > 0 {
		c.mu.Lock()
		defer c.mu.Unlock()
		s := c.socks[sid]
		if s == nil || len(rep.FDs) != 1 || s.peerRing != nil {
			closeFDs(rep.FDs)
			return unix.EPROTO
		}
		return c.mapPeer(s, rep.FDs[0])
	}
	return nil
}

// CloseSock is pd_close.
func (c *Client) CloseSock(sid int) error {
	c.mu.Lock()
	s := c.socks[sid]
	live := c.live()
	if s == nil {
		c.mu.Unlock()
		if live != nil {
			return live
		}
		return unix.EBADF
	}
	if live == nil {
		c.flushRelease(s)
		c.drainCQ()
	}
	delete(c.socks, sid)
	q := s.q
	c.mu.Unlock()
	err := live // the daemon is gone: the socket is released here all the same
	if err == nil {
		_, err = c.call(Request{Op: OpClose, SID: uint32(sid), A0: uint32(q)})
	}
	unix.Munmap(s.rx)
	if s.peerRing != nil {
		unix.Munmap(s.peerRing)
	}
	return err
}

func (c *Client) sockErr(s *csock) error {
	switch load32(s.hdr, ShState) {
	case SockConnected:
	case SockPeerClosed, SockClosed:
		return unix.EPIPE
	default:
		return unix.ENOTCONN
	}
	if e := load32(s.hdr, ShError); e != 0 {
		return unix.Errno(e)
	}
	return nil
}

// Send is pd_send: it queues up to len(b) bytes (stream semantics: fewer when the peer's ring or
// the submission queue has less room) and returns how many; unix.EAGAIN when none fit.
func (c *Client) Send(sid int, b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.live(); err != nil {
		return -1, err
	}
	s := c.socks[sid]
	if s == nil {
		return -1, unix.EBADF
	}
	if err := c.sockErr(s); err != nil {
		return -1, err
	}
	n := uint64(len(b))
	if n == 0 {
		return 0, nil
	}
	// the limit is in shared memory: never believe more room than one ring
	if room := min(load64(s.hdr, ShTxLimit)-s.queued, s.R); n > room {
		n = room
	}
	sq := c.sqs[s.q]
	if c.cqs[s.q].Len() >= c.lay.QDepth/2 {
		// Completions pile up when the program never calls Reusable/Malloc: take them now, or
		// a full completion queue stops the engine from serving this queue at all.
		c.drainCQ()
	}
	if max := uint64(sq.Free()) * MaxChunk; n > max {
		c.drainCQ()
		n = max
	}
	if n == 0 {
		c.drainCQ()
		return -1, c.again()
	}
	var es [64]Entry
	ents := es[:0]
	if s.peerRing != nil && inside(s.peerRing, b) {
		off := uint64(uintptr(unsafe.Pointer(&b[0])) - uintptr(unsafe.Pointer(&s.peerRing[0])))
		if off&(s.R-1) != s.dpub&(s.R-1) || s.dpub+n > s.dalloc {
			return -1, unix.EINVAL // direct: send reserved buffers in the order Malloc gave them
		}
		for sent := uint64(0); sent < n; {
			k := min(n-sent, MaxChunk)
			ents = append(ents, Entry{Type: ReqSendDirect, DataLen: uint16(k), Dst: s.dpub + sent, CID: c.CID, ConnID: uint16(sid)})
			sent += k
		}
		if !sq.Push(ents...) {
			return -1, unix.EAGAIN
		}
		s.dpub += n
	} else {
		off, ok := c.poolOff(b)
		if !ok {
			return -1, unix.EFAULT // not a pd_malloc buffer
		}
		idx, e := c.block(off)
		if e == nil || off+uint64(len(b)) > e.off+e.size {
			return -1, unix.EFAULT // not inside one pd_malloc buffer
		}
		for sent := uint64(0); sent < n; {
			k := min(n-sent, MaxChunk)
			ents = append(ents, Entry{Type: ReqSend, DataLen: uint16(k), Src: off + sent, CID: c.CID, ConnID: uint16(sid), EntrySeq: idx})
			sent += k
			if len(ents) == cap(es) {
				n = sent
				break
			}
		}
		if !sq.Push(ents...) {
			return -1, unix.EAGAIN
		}
		e.inflight += len(ents)
	}
	s.queued += n
	store64(s.hdr, ShTxQueued, s.queued)
	c.ring()
	return int(n), nil
}

// Reusable is pd_buf_refresh for one buffer: no send of it is still in flight. Once the daemon
// is gone no send will ever complete: unix.ECONNRESET, so a sender waiting for its buffer stops.
func (c *Client) Reusable(b []byte) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.live(); err != nil {
		return false, err
	}
	c.drainCQ()
	off, ok := c.poolOff(b)
	if !ok {
		return false, nil
	}
	_, e := c.block(off)
	return e != nil && e.inflight == 0, nil
}

// Recv is pd_recv: a view of up to max received bytes (valid until RecvDone); (nil, nil) at the
// end of the stream; unix.EAGAIN when nothing is there yet.
func (c *Client) Recv(sid int, max int) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.live(); err != nil {
		return nil, err
	}
	s := c.socks[sid]
	if s == nil {
		return nil, unix.EBADF
	}
	// the tail is in shared memory: never believe more than one ring
	avail := min(load64(s.hdr, ShRxTail)-s.head, s.R)
	if avail == 0 {
		switch load32(s.hdr, ShState) {
		case SockPeerClosed:
			return nil, nil
		case SockConnected:
			return nil, c.again()
		default:
			return nil, unix.ENOTCONN
		}
	}
	n := min(avail, uint64(max))
	off := s.head & (s.R - 1)
	return s.rx[off : off+n], nil
}

// RecvDone is pd_recv_done.
func (c *Client) RecvDone(sid int, n int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.live(); err != nil {
		return err
	}
	s := c.socks[sid]
	if s == nil {
		return unix.EBADF
	}
	tail := load64(s.hdr, ShRxTail)
	if n < 0 || uint64(n) > tail-s.head {
		return unix.EINVAL
	}
	s.head += uint64(n)
	s.unposted += uint64(n)
	store64(s.hdr, ShRxHead, s.head)
	// Tell the engine in batches, but always when the ring is drained, so a sender waiting for
	// room always hears of it.
	if s.unposted >= s.R/4 || s.head == tail {
		c.flushRelease(s)
	}
	return nil
}

func (c *Client) flushRelease(s *csock) {
	if s.unposted == 0 {
		return
	}
	e := Entry{Type: ReqRelease, Dst: s.unposted, CID: c.CID, ConnID: uint16(s.sid)}
	for !c.sqs[s.q].Push(e) {
		if c.gone() {
			return // nobody will take it
		}
		c.drainCQ()
		c.ring()
		time.Sleep(20 * time.Microsecond)
	}
	s.unposted = 0
	c.ring()
}
