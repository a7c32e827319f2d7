package workload

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"runtime"
	"sync"
	"time"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"golang.org/x/sys/unix"
)

// fdConn is a TCP connection on a plain *blocking* socket, read and written with direct
// system calls from a thread that sleeps in the kernel while it waits, like a C client.
//
// Why not net.Conn: a closed-loop latency client waits for every reply, and with net.Conn
// each wait parks the goroutine and each reply needs the netpoller plus the scheduler to
// wake it. On the 2-vCPU lab that halved throughput against memcaslap and put scheduler
// delay into the measured latency. A blocking read wakes the waiting thread directly.
type fdConn struct {
	fd       int
	shutOnce sync.Once
}

// dialBlocking opens n blocking TCP connections to addr:port from inside namespace ns.
// Sockets keep the namespace they were created in, so workers use them from any thread.
// SO_SNDTIMEO bounds connect; ioTimeout bounds every later read and write, so a stalled
// server yields EAGAIN (an error) instead of a hung client.
func dialBlocking(ns, addr string, port int, n int, ioTimeout time.Duration) ([]*fdConn, error) {
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		return nil, fmt.Errorf("server address %q: %w", addr, err)
	}
	var conns []*fdConn
	err = netnsutil.Do(ns, func() error {
		for range n {
			c, err := dialOne(ip, port, ioTimeout)
			if err != nil {
				return fmt.Errorf("connect %s: %w", netip.AddrPortFrom(ip, uint16(port)), err)
			}
			conns = append(conns, c)
		}
		return nil
	})
	if err != nil {
		closeConns(conns)
		return nil, err
	}
	return conns, nil
}

func dialOne(ip netip.Addr, port int, ioTimeout time.Duration) (*fdConn, error) {
	var sa unix.Sockaddr
	family := unix.AF_INET
	if ip.Is4() {
		sa = &unix.SockaddrInet4{Port: port, Addr: ip.As4()}
	} else {
		family = unix.AF_INET6
		sa = &unix.SockaddrInet6{Port: port, Addr: ip.As16()}
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	connectTO := unix.NsecToTimeval((3 * time.Second).Nanoseconds())
	ioTO := unix.NsecToTimeval(ioTimeout.Nanoseconds())
	err = errors.Join(
		unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1),
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &connectTO),
	)
	if err == nil {
		err = ignoreEINTR(func() error { return unix.Connect(fd, sa) })
	}
	if err == nil {
		err = errors.Join(
			unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &ioTO),
			unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &ioTO),
		)
	}
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &fdConn{fd: fd}, nil
}

func ignoreEINTR(f func() error) error {
	for {
		if err := f(); !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

func (c *fdConn) Read(p []byte) (int, error) {
	for {
		n, err := unix.Read(c.fd, p)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			return 0, errors.New("read timed out (server stalled)")
		case err != nil:
			return 0, fmt.Errorf("read: %w", err)
		case n == 0 && len(p) > 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

func (c *fdConn) Write(p []byte) (int, error) {
	done := 0
	for done < len(p) {
		n, err := unix.Write(c.fd, p[done:])
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			return done, errors.New("write timed out (server stalled)")
		case err != nil:
			return done, fmt.Errorf("write: %w", err)
		}
		done += n
	}
	return done, nil
}

// shutdown wakes any thread blocked on the socket (its read returns EOF) without freeing
// the descriptor, which a concurrent close would do unsafely (the number could be reused).
func (c *fdConn) shutdown() {
	c.shutOnce.Do(func() { unix.Shutdown(c.fd, unix.SHUT_RDWR) })
}

func closeConns(conns []*fdConn) {
	for _, c := range conns {
		unix.Close(c.fd)
	}
}

// Each blocked worker sits in a system call without a Go P, but needs one to run again
// when its reply arrives. With GOMAXPROCS (= CPUs) smaller than the number of workers, a
// woken worker waits for a P: fewer requests are really in flight than configured and
// sysmon's hand-off adds multi-ms stalls to the tail (measured: p99.9 10 ms, max 30 ms with
// 4 connections on 2 CPUs, against 0.5 ms / 4 ms with enough Ps). So while a load runs we
// raise GOMAXPROCS by the number of workers, leaving thread scheduling to the kernel, as
// for a threaded C client. Concurrent runs share one raise, undone by the last one out.
var procs struct {
	sync.Mutex
	users int
	saved int
	extra int
}

func raiseGOMAXPROCS(workers int) (restore func()) {
	procs.Lock()
	defer procs.Unlock()
	if procs.users == 0 {
		procs.saved = runtime.GOMAXPROCS(0)
		procs.extra = 0
	}
	procs.users++
	procs.extra += workers
	runtime.GOMAXPROCS(procs.saved + procs.extra)
	return func() {
		procs.Lock()
		defer procs.Unlock()
		procs.users--
		procs.extra -= workers
		runtime.GOMAXPROCS(procs.saved + procs.extra)
	}
}
