package pipedevice

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// proc is one client process (one pd_init): its control memory (queues and socket headers), its
// send ring (the pd_malloc pool, whose block table lives in the library) and its sockets.
type proc struct {
	d        *Daemon
	conn     *net.UnixConn
	cid      uint16
	id       identity // taken when the control connection was accepted
	ring     int
	lay      CtlLayout
	ctl      *Memfd
	pool     *Memfd
	doorbell int // eventfd the library rings; the engines watch it (its own: no client can mute another's)
	notify   int // eventfd the engine writes when the library sleeps
	sqs      []*Queue
	cqs      []*Queue
	// cqBacklog[q]: completions waiting for room in cqs[q] (written only by the engine that
	// owns queue q)
	cqBacklog [][]Entry
	socks     []atomic.Pointer[sock]
	dead      atomic.Bool
	sealed    atomic.Bool // OpSeal done: the engines serve this client from now on
	faulted   atomic.Bool // an engine faulted on its memory: skipped until dropped

	// d.mu
	unmapped bool
	charged  int64 // shared bytes charged to its namespace (control memory and pool)
	nsocks   int   // sockets in its table
	pending  int   // unaccepted connections on its listeners
}

func newProc(d *Daemon, c *net.UnixConn, id identity, cid uint16, ring int, lay CtlLayout, pool int, huge bool) (*proc, error) {
	ctl, err := NewMemfd(fmt.Sprintf("prg-pd-ctl-%d", cid), lay.Size(), false)
	if err != nil {
		return nil, err
	}
	pl, err := NewMemfd(fmt.Sprintf("prg-pd-pool-%d", cid), pool, huge)
	if err != nil {
		ctl.Close()
		return nil, err
	}
	p := &proc{d: d, conn: c, cid: cid, id: id, ring: ring, lay: lay, ctl: ctl, pool: pl, doorbell: -1, notify: -1,
		socks: make([]atomic.Pointer[sock], lay.MaxSock)}
	if p.notify, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err == nil {
		p.doorbell, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	}
	if err == nil {
		err = d.watchDoorbell(p.doorbell)
	}
	if err != nil {
		p.close()
		return nil, err
	}
	nq := lay.NQ
	store32(ctl.Mem, PhNQ, uint32(nq))
	store32(ctl.Mem, PhQDepth, uint32(lay.QDepth))
	store32(ctl.Mem, PhMaxSock, uint32(lay.MaxSock))
	for q := 0; q < nq; q++ {
		sq := NewQueue(ctl.Mem[lay.SQOff(q):lay.CQOff(q)], lay.QDepth)
		cq := NewQueue(ctl.Mem[lay.CQOff(q):lay.CQOff(q)+QueueHdr+lay.QDepth*EntrySize], lay.QDepth)
		sq.Init()
		cq.Init()
		p.sqs = append(p.sqs, sq)
		p.cqs = append(p.cqs, cq)
		p.cqBacklog = append(p.cqBacklog, nil)
	}
	store32(ctl.Mem, PhMagic, CtlMagic)
	return p, nil
}

// hugeCharged is how many hugepages p's pool holds.
func (p *proc) hugeCharged() int {
	if p.pool != nil && p.pool.Huge {
		return p.pool.Size / hugePage
	}
	return 0
}

func (p *proc) sock(sid int) *sock {
	if sid < 0 || sid >= len(p.socks) {
		return nil
	}
	return p.socks[sid].Load()
}

func (p *proc) freeSID() int {
	for i := range p.socks {
		if p.socks[i].Load() == nil {
			return i
		}
	}
	return -1
}

// wake tells a sleeping library that something changed for it.
func (p *proc) wake() {
	if load32(p.ctl.Mem, PhSleeping) != 0 {
		ringEventfd(p.notify)
	}
}

func (p *proc) close() {
	for _, e := range p.d.engines {
		unix.EpollCtl(e.epfd, unix.EPOLL_CTL_DEL, p.doorbell, nil)
	}
	p.ctl.Close()
	p.pool.Close()
	for _, fd := range []int{p.notify, p.doorbell} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// sock is one PipeDevice socket: its receive ring (memfd) and the engine's authoritative ring
// state (the RBT: tail = delivered, head = released by the owner).
type sock struct {
	p       *proc
	sid     uint32
	hdr     []byte // the 64-byte header in p's control memory
	rx      *Memfd
	R       uint64
	tail    atomic.Uint64 // engine handling the peer's sends writes (one per direction)
	head    atomic.Uint64 // engine processing the owner's releases writes
	st      atomic.Uint32 // the authoritative state; the header's copy is for the library only
	peer    atomic.Pointer[sock]
	closing atomic.Bool

	// control state (d.mu)
	bound       bool
	key         bindKey
	addr        netip.AddrPort
	peerAddr    netip.AddrPort
	backlog     []*sock
	backlogMax  int
	pendingFrom map[string]int // listener: waiting connections per connecting namespace
	pending     bool
	from        string // a pending connection's connecting namespace
	payer       string // the namespace its ring is charged to
	huge        int    // hugepages charged for its ring
	freeOnce    sync.Once
}

// state is the daemon's own copy: the header lives in memory the client can write, so the
// daemon never decides anything from it.
func (s *sock) state() uint32 { return s.st.Load() }
func (s *sock) setState(v uint32) {
	s.st.Store(v)
	store32(s.hdr, ShState, v)
}

// nsAddrs lists the IPv4 addresses of the network namespace open at nsfd.
func nsAddrs(nsfd int) ([]netip.Addr, error) {
	nl, err := netlink.NewHandleAt(netns.NsHandle(nsfd))
	if err != nil {
		return nil, err
	}
	defer nl.Close()
	list, err := nl.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range list {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok && !ip.IsLoopback() {
			out = append(out, ip)
		}
	}
	return out, nil
}

func onlineCPUs() []int {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return []int{0}
	}
	var out []int
	for i := 0; i < 1024; i++ {
		if set.IsSet(i) {
			out = append(out, i)
		}
	}
	if len(out) == 0 {
		out = []int{0}
	}
	return out
}
