package pipedevice

import (
	"runtime"
	"sync/atomic"
	"time"

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
}

const engineBatch = 32 // entries per queue per pass: round-robin fairness between queues

func (e *engine) run() {
	defer e.d.wg.Done()
	defer e.stopped.Store(true)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
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
		n := e.pollOnce()
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
		atomic.AddUint32(u32At(e.d.engPage.Mem, 0), 1)
		e.idle.Store(true)
		if e.pollOnce() == 0 {
			fds := []unix.PollFd{{Fd: int32(e.d.doorbell), Events: unix.POLLIN}}
			unix.Poll(fds, 100)
			var b [8]byte
			unix.Read(e.d.doorbell, b[:])
		}
		e.idle.Store(false)
		atomic.AddUint32(u32At(e.d.engPage.Mem, 0), ^uint32(0))
		e.pass.Add(1)
		last = time.Now()
	}
}

func (e *engine) pollOnce() int {
	procs := *e.d.procList.Load()
	total := 0
	var ent Entry
	for _, p := range procs {
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
