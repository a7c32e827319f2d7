package pipedevice

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The send side of the Go client: pd_malloc's send ring (pool) with its block table, and the
// completions that give blocks back.

// Malloc is pd_malloc from the process's send ring (engine mode) or, in direct mode with sid >= 0,
// from the connected peer's receive ring. nil with unix.ENOMEM/EAGAIN when there is no room now.
func (c *Client) Malloc(sid int, size int) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.live(); err != nil {
		return nil, err
	}
	if size <= 0 {
		return nil, unix.EINVAL
	}
	if c.Direct && sid >= 0 {
		s := c.socks[sid]
		if s == nil || s.peerRing == nil {
			return nil, unix.ENOTCONN
		}
		if err := c.sockErr(s); err != nil {
			return nil, err // the peer closed: its ring takes nothing more
		}
		limit := load64(s.hdr, ShTxLimit)
		if s.dalloc+uint64(size) > limit || uint64(size) > s.R {
			return nil, unix.EAGAIN
		}
		off := s.dalloc & (s.R - 1)
		s.dalloc += uint64(size)
		return s.peerRing[off : off+uint64(size)], nil
	}
	c.drainCQ()
	sz := (uint64(size) + 63) &^ 63
	if len(c.freeSlots) == 0 || sz > c.poolSize {
		return nil, unix.ENOMEM
	}
	// first fit among the gaps between live blocks
	at, prevEnd := -1, uint64(0)
	for i, slot := range c.order {
		if c.sbt[slot].off-prevEnd >= sz {
			at = i
			break
		}
		prevEnd = c.sbt[slot].off + c.sbt[slot].size
	}
	if at < 0 {
		if c.poolSize-prevEnd < sz {
			return nil, unix.ENOMEM
		}
		at = len(c.order)
	}
	slot := c.freeSlots[len(c.freeSlots)-1]
	c.freeSlots = c.freeSlots[:len(c.freeSlots)-1]
	c.sbt[slot] = sbtEntry{off: prevEnd, size: sz, live: true}
	c.order = append(c.order, 0)
	copy(c.order[at+1:], c.order[at:])
	c.order[at] = slot
	return c.pool[prevEnd : prevEnd+uint64(size)], nil
}

func (c *Client) poolOff(b []byte) (uint64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	base := uintptr(unsafe.Pointer(&c.pool[0]))
	p := uintptr(unsafe.Pointer(&b[0]))
	if p < base || p+uintptr(len(b)) > base+uintptr(len(c.pool)) {
		return 0, false
	}
	return uint64(p-base) & (c.poolSize - 1), true
}

// block finds the live, not freed SBT entry holding pool offset off.
func (c *Client) block(off uint64) (uint16, *sbtEntry) {
	lo, hi := 0, len(c.order)
	for lo < hi {
		m := (lo + hi) / 2
		if c.sbt[c.order[m]].off+c.sbt[c.order[m]].size <= off {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(c.order) {
		slot := c.order[lo]
		if e := &c.sbt[slot]; e.off <= off && off < e.off+e.size && !e.freed {
			return slot, e
		}
	}
	return 0, nil
}

// release drops a block that is freed and no longer read by a send.
func (c *Client) release(slot uint16) {
	e := &c.sbt[slot]
	if !e.live || !e.freed || e.inflight > 0 {
		return
	}
	for i, x := range c.order {
		if x == slot {
			c.order = append(c.order[:i], c.order[i+1:]...)
			break
		}
	}
	*e = sbtEntry{}
	c.freeSlots = append(c.freeSlots, slot)
}

// Free is pd_free. Once the daemon is gone it still frees, and says unix.ECONNRESET.
func (c *Client) Free(b []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	live := c.live()
	off, ok := c.poolOff(b)
	if !ok {
		// direct-mode reservation: unsent reservations are dropped
		for _, s := range c.socks {
			if s.peerRing != nil && inside(s.peerRing, b) {
				s.dalloc = s.dpub
				return live
			}
		}
		if live != nil {
			return live
		}
		return unix.EINVAL
	}
	slot, e := c.block(off)
	if e == nil {
		if live != nil {
			return live
		}
		return unix.EINVAL
	}
	e.freed = true
	c.release(slot)
	return live
}

func inside(m, b []byte) bool {
	if len(b) == 0 || len(m) == 0 {
		return false
	}
	base := uintptr(unsafe.Pointer(&m[0]))
	p := uintptr(unsafe.Pointer(&b[0]))
	return p >= base && p+uintptr(len(b)) <= base+uintptr(len(m))
}

func (c *Client) drainCQ() {
	var e Entry
	for _, cq := range c.cqs {
		for cq.Pop(&e) {
			slot := e.EntrySeq % sbtSize
			if b := &c.sbt[slot]; b.live && b.inflight > 0 {
				b.inflight--
				c.release(slot)
			}
		}
	}
}

func (c *Client) ring() {
	if load32(c.engPage, 0) > 0 {
		var one [8]byte
		one[0] = 1
		unix.Write(c.doorbell, one[:])
	}
}
