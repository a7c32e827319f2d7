package pipedevice

import (
	"errors"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Waiting and liveness in the Go client: readiness, sleeping on the notify eventfd, and learning
// that the daemon is gone.

// again is EAGAIN, or ECONNRESET once the daemon is gone (a closed control socket): nothing will
// ever arrive then, and a program waiting for it must learn so.
func (c *Client) again() error {
	if c.deadNow() {
		return unix.ECONNRESET
	}
	return unix.EAGAIN
}

// clientEpoch anchors the monotonic clock deadNow reads.
var clientEpoch = time.Now()

// deadNow says whether the daemon is gone. A look at the control socket costs a poll(2); reading
// the clock costs tens of nanoseconds, so every call reads it and looks at most once a millisecond:
// whatever the program does, a call made 1 ms or more after the daemon's end sees it (libpd's
// pdi_dead, the same rule).
func (c *Client) deadNow() bool {
	if c.dead.Load() {
		return true
	}
	now := int64(time.Since(clientEpoch))
	if last := c.lastLook.Load(); now-last < int64(time.Millisecond) || !c.lastLook.CompareAndSwap(last, now) {
		return false
	}
	return c.gone()
}

// live is what every call checks first: ECONNRESET once the daemon is gone (never EAGAIN, false
// or 0 forever).
func (c *Client) live() error {
	if c.deadNow() {
		return unix.ECONNRESET
	}
	return nil
}

// gone looks (without waiting) whether the daemon closed the control connection.
func (c *Client) gone() bool {
	if c.dead.Load() {
		return true
	}
	if c.connFD < 0 {
		return false
	}
	fds := []unix.PollFd{{Fd: int32(c.connFD), Events: unix.POLLRDHUP}}
	if n, _ := unix.Poll(fds, 0); n > 0 && fds[0].Revents&(unix.POLLHUP|unix.POLLRDHUP|unix.POLLERR) != 0 {
		c.dead.Store(true)
	}
	return c.dead.Load()
}

// Dead says whether the daemon is gone.
func (c *Client) Dead() bool { return c.gone() }

// Readable says what pd_epoll_wait would report for PD_EPOLLIN; true once the daemon is gone
// (as PD_EPOLLERR wakes every waiter: the next Recv says ECONNRESET).
func (c *Client) Readable(sid int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.deadNow() {
		return true
	}
	s := c.socks[sid]
	if s == nil {
		return false
	}
	st := load32(s.hdr, ShState)
	return load64(s.hdr, ShRxTail) != s.head || st == SockPeerClosed || load32(s.hdr, ShPending) > 0
}

// Room is how many bytes Send could queue now: 0 once the daemon is gone (Wait then returns at
// once and Send says ECONNRESET).
func (c *Client) Room(sid int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.socks[sid]
	if s == nil || c.deadNow() {
		return 0
	}
	return int(load64(s.hdr, ShTxLimit) - s.queued)
}

// Wait blocks until ready() holds or timeout passes (the engine wakes sleepers through the
// notify eventfd). ready is evaluated after announcing the sleep, so no wake-up is lost.
func (c *Client) Wait(ready func() bool, timeout time.Duration) bool {
	// Spin a little first, yielding the CPU between looks: a reply often comes within
	// microseconds, and a sleep costs two context switches plus the engine's wake-up.
	for i := 0; i < c.SpinLooks; i++ {
		if ready() || c.dead.Load() {
			return true
		}
		unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
	}
	deadline := time.Now().Add(timeout)
	for {
		if ready() {
			return true
		}
		atomic.AddUint32(u32At(c.ctl, PhSleeping), 1)
		if ready() {
			atomic.AddUint32(u32At(c.ctl, PhSleeping), ^uint32(0))
			return true
		}
		left := time.Until(deadline)
		if left <= 0 {
			atomic.AddUint32(u32At(c.ctl, PhSleeping), ^uint32(0))
			return false
		}
		ms := int(left / time.Millisecond)
		if ms == 0 {
			ms = 1
		}
		// the control socket too: the daemon's end (a crash) wakes us at once
		fds := []unix.PollFd{{Fd: int32(c.notify), Events: unix.POLLIN}, {Fd: int32(c.connFD), Events: unix.POLLRDHUP}}
		unix.Poll(fds, ms)
		var b [8]byte
		unix.Read(c.notify, b[:])
		atomic.AddUint32(u32At(c.ctl, PhSleeping), ^uint32(0))
		if fds[1].Revents&(unix.POLLHUP|unix.POLLRDHUP|unix.POLLERR) != 0 {
			c.dead.Store(true)
			return true // the caller's next call says ECONNRESET
		}
	}
}

func (c *Client) nsocks() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.socks)
}

// IsAgain says whether err is EAGAIN.
func IsAgain(err error) bool { return errors.Is(err, unix.EAGAIN) }

func currentCPU() int {
	var cpu, node uint32
	_, _, e := unix.RawSyscall(unix.SYS_GETCPU, uintptr(unsafe.Pointer(&cpu)), uintptr(unsafe.Pointer(&node)), 0)
	if e != 0 {
		return 0
	}
	return int(cpu)
}
