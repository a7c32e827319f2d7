package labtest

import (
	"bufio"
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// EchoTCP serves a TCP echo on addr ("ip:port") inside namespace ns until the test ends: every
// connection gets back what it sends, until it closes.
func EchoTCP(t testing.TB, ns, addr string) {
	t.Helper()
	ln, err := netnsutil.Listen(ns, "tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) { defer c.Close(); _, _ = io.Copy(c, c) }(c)
		}
	}()
}

// EchoNamed serves lab's named TCP echo (lab.ServeTCPEchoFor: every connection is greeted
// with name and a newline, then echoed, limit at most, 0: no limit) on addr inside namespace
// ns until the test ends: a backend that says which one answered.
func EchoNamed(t testing.TB, ns, addr, name string, limit time.Duration) {
	t.Helper()
	ln, err := netnsutil.Listen(ns, "tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go lab.ServeTCPEchoFor(ln, name, limit)
}

// ListenUDP opens a UDP socket on addr inside namespace ns, closed when the test ends.
func ListenUDP(t testing.TB, ns string, addr *net.UDPAddr) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	if err := netnsutil.Do(ns, func() error {
		var err error
		c, err = net.ListenUDP("udp4", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// DialTCP connects to addr from inside namespace ns (3 s at most), failing the test when it
// cannot; the connection is closed when the test ends.
func DialTCP(t testing.TB, ns, addr string) net.Conn {
	t.Helper()
	c, err := netnsutil.DialContext(context.Background(), ns, &net.Dialer{Timeout: 3 * time.Second}, "tcp4", addr)
	if err != nil {
		t.Fatalf("connect from %s to %s: %v", ns, addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// DialNamed connects from namespace ns to addr, where a named echo listens (EchoNamed,
// lab.ServeTCPEchoFor), sets deadline d on the whole conversation and reads the greeting. It
// returns the connection (closed when the test ends), the reader for the rest of it (the
// greeting's read may have buffered echoed bytes, so read through it, not c) and the name that
// answered. A failed connection or greeting fails the test.
func DialNamed(t testing.TB, ns, addr string, d time.Duration) (net.Conn, *bufio.Reader, string) {
	t.Helper()
	c := DialTCP(t, ns, addr)
	_ = c.SetDeadline(time.Now().Add(d))
	r, name, err := ReadGreeting(c)
	if err != nil {
		t.Fatalf("greeting from %s (connected from %s): got %q, %v", addr, ns, name, err)
	}
	return c, r, name
}

// ReadGreeting reads a named echo's greeting line from c and returns the reader for the rest
// of the conversation and the name, trimmed; it fails when the line does not arrive whole.
func ReadGreeting(c net.Conn) (*bufio.Reader, string, error) {
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	return r, strings.TrimSpace(line), err
}
