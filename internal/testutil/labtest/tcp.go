package labtest

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// TCPStream is one TCP transfer between two namespaces, written as fast as it goes (or paced)
// until Finish. Setup happens on the test goroutine; the sender and receiver goroutines only
// report through channels, so a failure never calls t.Fatal off the test goroutine.
type TCPStream struct {
	sent, received atomic.Int64
	stop           chan struct{}
	stopOnce       sync.Once
	sendErr        chan error
	recvDone       chan struct{}
}

// StartTCP listens on dst in dstNS, connects from srcNS and starts writing 16 KiB chunks,
// sleeping pace between them (0: flat out). The test's cleanup stops it if Finish is not called.
func StartTCP(t testing.TB, srcNS, dstNS string, dst netip.AddrPort, pace time.Duration) *TCPStream {
	t.Helper()
	ln := listenIn(t, dstNS, dst)
	s := &TCPStream{stop: make(chan struct{}), sendErr: make(chan error, 1), recvDone: make(chan struct{})}
	go func() {
		defer close(s.recvDone)
		defer ln.Close()
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 64<<10)
		for {
			k, err := c.Read(buf)
			s.received.Add(int64(k))
			if err != nil {
				return
			}
		}
	}()
	c := dialFrom(t, srcNS, dst, ln)
	go func() {
		buf := make([]byte, 16<<10)
		for {
			select {
			case <-s.stop:
				s.sendErr <- c.Close()
				return
			default:
			}
			_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
			k, err := c.Write(buf)
			s.sent.Add(int64(k))
			if err != nil {
				c.Close()
				s.sendErr <- err
				return
			}
			if pace > 0 {
				time.Sleep(pace)
			}
		}
	}()
	t.Cleanup(func() { s.stopOnce.Do(func() { close(s.stop) }) })
	return s
}

// Received is how many bytes have arrived so far.
func (s *TCPStream) Received() int64 { return s.received.Load() }

// WaitFlowing waits until n more bytes have arrived: the transfer is running (now, not before).
func (s *TCPStream) WaitFlowing(t testing.TB, n int64, timeout time.Duration) {
	t.Helper()
	from := s.Received()
	Eventually(t, timeout, "TCP transfer flowing", func() (bool, string) {
		got := s.Received() - from
		return got >= n, strconv.FormatInt(got, 10) + " bytes arrived"
	})
}

// Finish stops the sender and waits for both ends; it fails the test when a write failed (the
// connection did not survive) or bytes are missing, and returns the bytes carried.
func (s *TCPStream) Finish(t testing.TB) int64 {
	t.Helper()
	s.stopOnce.Do(func() { close(s.stop) })
	select {
	case err := <-s.sendErr:
		if err != nil && !errors.Is(err, net.ErrClosed) {
			t.Fatalf("sender: %v (the connection did not survive)", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("sender did not stop")
	}
	select {
	case <-s.recvDone:
	case <-time.After(10 * time.Second):
		t.Fatal("receiver did not finish")
	}
	if got, sent := s.received.Load(), s.sent.Load(); got != sent || sent == 0 {
		t.Fatalf("received %d bytes of %d", got, sent)
	}
	return s.sent.Load()
}

// listenIn listens on dst (TCP) inside ns.
func listenIn(t testing.TB, ns string, dst netip.AddrPort) net.Listener {
	t.Helper()
	ln, err := netnsutil.Listen(ns, "tcp", dst.String())
	if err != nil {
		t.Fatalf("listen on %s in %s: %v", dst, ns, err)
	}
	return ln
}

// dialFrom connects to dst from ns; on failure it closes ln and fails the test.
func dialFrom(t testing.TB, ns string, dst netip.AddrPort, ln net.Listener) net.Conn {
	t.Helper()
	c, err := netnsutil.DialContext(context.Background(), ns, &net.Dialer{Timeout: 2 * time.Second}, "tcp", dst.String())
	if err != nil {
		ln.Close()
		t.Fatalf("connect from %s to %s: %v", ns, dst, err)
	}
	return c
}
