package pipedevice

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// engine is the software PD Stack: a thread (pinned when given a CPU) that polls the submission
// queues round-robin, copies payload between rings, posts completions and wakes sleepers. With
// several engines, engine i owns the queues with (cid+q) % n == i, so one connection's entries
// are always handled in order by one engine.
type engine struct {
	d       *Daemon
	idx, n  int
	cpu     int
	pass    atomic.Uint64 // completed polling passes (quiescence for reclaim)
	idle    atomic.Bool
	stopped atomic.Bool
	wake    []*proc
	epfd    int   // every client's doorbell and the daemon's, edge-triggered: any ring wakes every engine
	cur     *proc // the client whose queue is being served (blamed for a fault, see guard)
}

func newEngine(d *Daemon, idx, n, cpu int) (*engine, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	e := &engine{d: d, idx: idx, n: n, cpu: cpu, epfd: epfd}
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET, Fd: int32(d.doorbell)}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, d.doorbell, &ev); err != nil {
		unix.Close(epfd)
		return nil, err
	}
	return e, nil
}

// watchDoorbell adds a client's doorbell to every engine. Edge-triggered, so every write wakes
// every engine whoever drains the counter, and a client reading its own doorbell (or never
// letting it drain) mutes nobody but itself.
func (d *Daemon) watchDoorbell(fd int) error {
	for _, e := range d.engines {
		ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET, Fd: int32(fd)}
		if err := unix.EpollCtl(e.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
			for _, x := range d.engines {
				unix.EpollCtl(x.epfd, unix.EPOLL_CTL_DEL, fd, nil)
			}
			return err
		}
	}
	return nil
}

const engineBatch = 32 // entries per queue per pass: round-robin fairness between queues

func (e *engine) run() {
	defer e.d.wg.Done()
	defer e.stopped.Store(true)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// A fault on client memory (which the seals should make impossible, see NewMemfd) becomes a
	// panic that guard recovers, instead of killing the daemon.
	debug.SetPanicOnFault(true)
	evs := make([]unix.EpollEvent, 64)
	if e.cpu >= 0 {
		var set unix.CPUSet
		set.Set(e.cpu)
		unix.SchedSetaffinity(0, &set)
	}
	last := time.Now()
	for {
		select {
		case <-e.d.done:
			return
		default:
		}
		n := e.guard()
		e.pass.Add(1)
		if n > 0 {
			last = time.Now()
			continue
		}
		if time.Since(last) < e.d.cfg.Spin {
			continue
		}
		// Going to sleep: announce it, look once more (a producer that saw the old count did not
		// ring), then block on the doorbell.
		atomic.AddUint32(u32At(e.d.engPage.Mem, 0), 1) // the daemon's own mapping; clients' are read-only
		e.idle.Store(true)
		if e.guard() == 0 {
			k, _ := unix.EpollWait(e.epfd, evs, 100)
			var b [8]byte
			for i := 0; i < k; i++ {
				unix.Read(int(evs[i].Fd), b[:]) // drain (nonblocking); another engine may have
			}
		}
		e.idle.Store(false)
		atomic.AddUint32(u32At(e.d.engPage.Mem, 0), ^uint32(0))
		e.pass.Add(1)
		last = time.Now()
	}
}

// guard runs one pass; a fault on a client's memory drops that client (counted, logged) and the
// engine goes on with everyone else. The faulting address says whose memory it was: the peer's
// receive ring, or else the client being served.
func (e *engine) guard() (n int) {
	defer func() {
		x := recover()
		if x == nil {
			return
		}
		guilty := e.cur
		if f, ok := x.(interface{ Addr() uintptr }); ok && guilty != nil {
			guilty = e.d.owner(guilty, f.Addr())
		}
		e.cur = nil
		if guilty == nil {
			panic(x) // not a client's memory: a daemon bug, not to be hidden
		}
		guilty.faulted.Store(true)
		e.d.drop(guilty, guilty.id, fmt.Sprintf("engine fault on its memory: %v", x))
		guilty.conn.Close() // its serveConn reclaims it
		n = 1
	}()
	return e.pollOnce()
}

// owner is the client whose mapped memory holds addr: p itself or the owner of one of its
// peers' rings (no lock: only atomics and immutable fields are read).
func (d *Daemon) owner(p *proc, addr uintptr) *proc {
	for i := range p.socks {
		if s := p.socks[i].Load(); s != nil {
			if peer := s.peer.Load(); peer != nil && within(peer.rx.Mem, addr) {
				return peer.p
			}
		}
	}
	return p
}

func within(m []byte, addr uintptr) bool {
	if len(m) == 0 {
		return false
	}
	base := uintptr(unsafe.Pointer(&m[0]))
	return addr >= base && addr < base+uintptr(len(m))
}

func (e *engine) pollOnce() int {
	procs := *e.d.procList.Load()
	total := 0
	var ent Entry
	for _, p := range procs {
		if p.faulted.Load() {
			continue
		}
		e.cur = p
		for q := range p.sqs {
			if (int(p.cid)+q)%e.n != e.idx {
				continue
			}
			sq := p.sqs[q]
			// Completions the CQ had no room for wait in the daemon's backlog; releases,
			// closes and direct publications need no completion, so a program that does not
			// drain its CQ still gets them served (only its copies wait).
			p.flushBacklog(q)
			for i := 0; i < engineBatch; i++ {
				if len(p.cqBacklog[q]) >= maxBacklog || !sq.Pop(&ent) {
					break
				}
				e.do(p, q, &ent)
				total++
			}
		}
	}
	e.cur = nil
	for _, p := range e.wake {
		p.wake()
	}
	clear(e.wake)
	e.wake = e.wake[:0]
	if total > 0 {
		e.d.entries.Add(uint64(total))
	}
	return total
}

func (e *engine) markWake(p *proc) {
	for _, x := range e.wake {
		if x == p {
			return
		}
	}
	e.wake = append(e.wake, p)
}

// do runs one entry. Everything in it came from client-writable memory: every field is checked
// and the engine alone chooses destination addresses (the peer's ring tail), so a client can
// neither name foreign memory nor overrun a ring.
func (e *engine) do(p *proc, q int, ent *Entry) {
	s := p.sock(int(ent.ConnID))
	switch ent.Type {
	case ReqSend, ReqSendDirect:
		n := uint64(ent.DataLen)
		if s == nil || n == 0 || n > MaxChunk {
			e.fail(p, q, ent, s, unix.EINVAL)
			return
		}
		peer := s.peer.Load()
		if peer == nil {
			e.fail(p, q, ent, s, unix.EPIPE)
			return
		}
		head, tail := peer.head.Load(), peer.tail.Load()
		if tail+n-head > peer.R {
			e.fail(p, q, ent, s, unix.ENOBUFS) // the library ignored its credit
			return
		}
		if !peer.rx.Sealed() || peer.p.faulted.Load() {
			// direct mode: the ring's writer has not sealed it yet. Neither a copy into it nor a
			// publication of what it holds (a hole punched there would fault the receiver).
			e.fail(p, q, ent, s, unix.EAGAIN)
			return
		}
		if ent.Type == ReqSend {
			copyRing(peer.rx.Mem, tail, p.pool.Mem, ent.Src, n)
			e.d.bytesMoved.Add(n)
		} else {
			if !e.d.cfg.Direct || ent.Dst != tail {
				e.fail(p, q, ent, s, unix.EINVAL) // direct data must be published in stream order
				return
			}
			e.d.published.Add(n)
		}
		peer.tail.Store(tail + n)
		store64(peer.hdr, ShRxTail, tail+n)
		store64(s.hdr, ShTxDone, load64(s.hdr, ShTxDone)+n)
		e.markWake(peer.p)
		if ent.Type == ReqSend {
			ent.Type = ReqCompleted
			p.complete(q, *ent)
			e.markWake(p)
		}
	case ReqRelease:
		if s == nil {
			return
		}
		n := ent.Dst
		head := s.head.Load()
		if t := s.tail.Load(); n > t-head {
			n = t - head // never release what was not delivered
		}
		head += n
		s.head.Store(head)
		if peer := s.peer.Load(); peer != nil {
			store64(peer.hdr, ShTxLimit, head+s.R)
			e.markWake(peer.p)
		}
	case ReqClose:
		if s == nil || !s.closing.Load() {
			return // only the daemon posts closes (it sets closing first)
		}
		e.d.detach(s)
		e.d.toReclaim(s)
	default:
		e.fail(p, q, ent, s, unix.EINVAL)
	}
}

func (e *engine) fail(p *proc, q int, ent *Entry, s *sock, errno unix.Errno) {
	e.d.failed.Add(1)
	if s != nil {
		store32(s.hdr, ShError, uint32(errno))
	}
	if ent.Type == ReqSend {
		ent.Type = ReqFailed
		ent.Status = uint16(errno)
		p.complete(q, *ent)
	}
	e.markWake(p)
}

// maxBacklog bounds the completions the daemon holds for a program that does not drain its CQ;
// beyond it the engine stops taking that queue's entries until the program catches up.
const maxBacklog = 1 << 16

// complete posts a completion, or keeps it when the CQ is full (engine owning queue q only).
func (p *proc) complete(q int, ent Entry) {
	if len(p.cqBacklog[q]) > 0 || !p.cqs[q].Push(ent) {
		p.cqBacklog[q] = append(p.cqBacklog[q], ent)
	}
}

func (p *proc) flushBacklog(q int) {
	b := p.cqBacklog[q]
	n := 0
	for n < len(b) && p.cqs[q].Push(b[n]) {
		n++
	}
	if n > 0 {
		p.cqBacklog[q] = append(b[:0], b[n:]...)
	}
}

// copyRing copies n bytes from src ring position sp to dst ring position dp; both rings are
// powers of two and the copy wraps in either.
func copyRing(dst []byte, dp uint64, src []byte, sp uint64, n uint64) {
	dm, sm := uint64(len(dst)-1), uint64(len(src)-1)
	for n > 0 {
		d, s := dp&dm, sp&sm
		c := n
		if r := uint64(len(dst)) - d; c > r {
			c = r
		}
		if r := uint64(len(src)) - s; c > r {
			c = r
		}
		copy(dst[d:d+c], src[s:s+c])
		dp += c
		sp += c
		n -= c
	}
}
