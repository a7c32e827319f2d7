package pipedevice

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// proc is one client process (one pd_init): its control memory (queues and socket headers), its
// send ring (the pd_malloc pool, whose block table lives in the library) and its sockets.
type proc struct {
	d      *Daemon
	conn   *net.UnixConn
	cid    uint16
	pid    int
	ns     string // "net:[inode]" of the caller: its identity
	ring   int
	lay    CtlLayout
	ctl    *Memfd
	pool   *Memfd
	notify int // eventfd the engine writes when the library sleeps
	sqs    []*Queue
	cqs    []*Queue
	// cqBacklog[q]: completions waiting for room in cqs[q] (written only by the engine that
	// owns queue q)
	cqBacklog [][]Entry
	socks     []atomic.Pointer[sock]
	dead      atomic.Bool
	unmapped  bool // d.mu
}

func newProc(d *Daemon, c *net.UnixConn, cid uint16, pid int, ns string, ring, pool, depth int) (*proc, error) {
	nq := len(onlineCPUs())
	lay := CtlLayout{NQ: nq, QDepth: depth, MaxSock: d.cfg.MaxSock}
	ctl, err := NewMemfd(fmt.Sprintf("prg-pd-ctl-%d", cid), lay.Size(), false)
	if err != nil {
		return nil, err
	}
	pl, err := NewMemfd(fmt.Sprintf("prg-pd-pool-%d", cid), pool, true)
	if err != nil {
		ctl.Close()
		return nil, err
	}
	nfd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		ctl.Close()
		pl.Close()
		return nil, err
	}
	p := &proc{d: d, conn: c, cid: cid, pid: pid, ns: ns, ring: ring, lay: lay, ctl: ctl, pool: pl, notify: nfd,
		socks: make([]atomic.Pointer[sock], lay.MaxSock)}
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
		var one [8]byte
		one[0] = 1
		unix.Write(p.notify, one[:])
	}
}

func (p *proc) close() {
	p.ctl.Close()
	p.pool.Close()
	unix.Close(p.notify)
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
	bound      bool
	key        bindKey
	addr       netip.AddrPort
	peerAddr   netip.AddrPort
	backlog    []*sock
	backlogMax int
	pending    bool
	freeOnce   sync.Once
}

// state is the daemon's own copy: the header lives in memory the client can write, so the
// daemon never decides anything from it.
func (s *sock) state() uint32 { return s.st.Load() }
func (s *sock) setState(v uint32) {
	s.st.Store(v)
	store32(s.hdr, ShState, v)
}

// peerNetns identifies the caller of a unix socket: its pid (SO_PEERCRED) and network namespace.
func peerNetns(c *net.UnixConn) (int, string, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, "", err
	}
	var cred *unix.Ucred
	var cerr error
	raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	if cerr != nil {
		return 0, "", cerr
	}
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", cred.Pid))
	if err != nil {
		return 0, "", err
	}
	return int(cred.Pid), ns, nil
}

// nsAddrs lists the IPv4 addresses of pid's network namespace.
func nsAddrs(pid int) ([]netip.Addr, error) {
	h, err := netns.GetFromPid(pid)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	nl, err := netlink.NewHandleAt(h)
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
