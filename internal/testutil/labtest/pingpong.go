package labtest

import (
	"fmt"
	"io"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"
)

// PingPong is a 64 B request/response exchange over TCP, one at a time every millisecond; it
// keeps the longest time between two completed round trips (a lost packet costs a
// retransmission timeout, 200 ms at least, so any loss shows).
type PingPong struct {
	rounds atomic.Int64
	maxGap atomic.Int64 // ns
	stop   chan struct{}
	done   chan error
}

// Rounds is how many round trips completed.
func (p *PingPong) Rounds() int64 { return p.rounds.Load() }

// MaxGap is the longest time between two completed round trips so far.
func (p *PingPong) MaxGap() time.Duration { return time.Duration(p.maxGap.Load()) }

// StartPingPong listens on dst in dstNS (an echo server), connects from srcNS and starts the
// exchange; the test's cleanup stops it if Finish is not called.
func StartPingPong(t testing.TB, srcNS, dstNS string, dst netip.AddrPort) *PingPong {
	t.Helper()
	ln := listenIn(t, dstNS, dst)
	go func() {
		defer ln.Close()
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 64)
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	}()
	c := dialFrom(t, srcNS, dst, ln)
	p := &PingPong{stop: make(chan struct{}), done: make(chan error, 1)}
	go func() {
		defer c.Close()
		buf := make([]byte, 64)
		last := time.Now()
		for {
			select {
			case <-p.stop:
				p.done <- nil
				return
			default:
			}
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Write(buf); err != nil {
				p.done <- err
				return
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				p.done <- err
				return
			}
			now := time.Now()
			if g := int64(now.Sub(last)); g > p.maxGap.Load() {
				p.maxGap.Store(g)
			}
			last = now
			p.rounds.Add(1)
			time.Sleep(time.Millisecond)
		}
	}()
	t.Cleanup(func() {
		select {
		case <-p.stop:
		default:
			close(p.stop)
		}
	})
	return p
}

// Finish stops it and returns the error that ended it early, if any.
func (p *PingPong) Finish() error {
	close(p.stop)
	select {
	case err := <-p.done:
		return err
	case <-time.After(10 * time.Second):
		return fmt.Errorf("ping-pong did not stop")
	}
}
