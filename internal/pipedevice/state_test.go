package pipedevice

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: got %v, want %v", what, err, want)
	}
}

func listenOn(t *testing.T, c *Client, ap netip.AddrPort, backlog int) int {
	t.Helper()
	l, err := c.Socket()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Bind(l, ap); err != nil {
		t.Fatalf("bind %v: %v", ap, err)
	}
	if err := c.Listen(l, backlog); err != nil {
		t.Fatal(err)
	}
	return l
}

func TestConnectRefused(t *testing.T) {
	d := startDaemon(t, Config{})
	a, b := dial(t, d), dial(t, d)
	s, _ := a.Socket()
	wantErr(t, "connect with no listener", a.Connect(s, netip.MustParseAddrPort("127.0.0.1:7100")), unix.ECONNREFUSED)

	// bound but not listening: refused too
	nl, _ := b.Socket()
	if _, err := b.Bind(nl, netip.MustParseAddrPort("127.0.0.1:7101")); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "connect to a bound, not listening socket", a.Connect(s, netip.MustParseAddrPort("127.0.0.1:7101")), unix.ECONNREFUSED)

	// a full backlog refuses; accepting makes room
	l := listenOn(t, b, netip.MustParseAddrPort("127.0.0.1:7102"), 2)
	var socks []int
	for i := 0; i < 2; i++ {
		x, _ := a.Socket()
		if err := a.Connect(x, netip.MustParseAddrPort("127.0.0.1:7102")); err != nil {
			t.Fatalf("connect %d: %v", i, err)
		}
		socks = append(socks, x)
	}
	x, _ := a.Socket()
	wantErr(t, "connect beyond the backlog", a.Connect(x, netip.MustParseAddrPort("127.0.0.1:7102")), unix.ECONNREFUSED)
	if !b.Readable(l) {
		t.Fatal("a listener with pending connections is not readable")
	}
	if _, _, err := b.Accept(l); err != nil {
		t.Fatal(err)
	}
	if err := a.Connect(x, netip.MustParseAddrPort("127.0.0.1:7102")); err != nil {
		t.Fatalf("connect after an accept made room: %v", err)
	}
	wantErr(t, "connect twice", a.Connect(x, netip.MustParseAddrPort("127.0.0.1:7102")), unix.EISCONN)

	// a closed listener refuses at once, and its port is free again at once
	if err := b.CloseSock(l); err != nil {
		t.Fatal(err)
	}
	y, _ := a.Socket()
	wantErr(t, "connect to a closed listener", a.Connect(y, netip.MustParseAddrPort("127.0.0.1:7102")), unix.ECONNREFUSED)
	listenOn(t, b, netip.MustParseAddrPort("127.0.0.1:7102"), 2)

	// the connections still pending when the listener closed were reset: end of stream
	for _, sid := range socks[1:] {
		eventually(t, "a pending connection of a closed listener ends", func() bool {
			v, err := a.Recv(sid, 100)
			return v == nil && err == nil
		})
		buf, _ := a.Malloc(-1, 10)
		_, err := a.Send(sid, buf)
		wantErr(t, "send on a reset connection", err, unix.EPIPE)
		a.Free(buf)
	}
}

func TestBindRules(t *testing.T) {
	d := startDaemon(t, Config{})
	a, b := dial(t, d), dial(t, d)
	s1, _ := a.Socket()
	s2, _ := b.Socket()
	if _, err := a.Bind(s1, netip.MustParseAddrPort("127.0.0.1:7200")); err != nil {
		t.Fatal(err)
	}
	_, err := b.Bind(s2, netip.MustParseAddrPort("127.0.0.1:7200"))
	wantErr(t, "bind a taken address", err, unix.EADDRINUSE)
	_, err = a.Bind(s1, netip.MustParseAddrPort("127.0.0.1:7201"))
	wantErr(t, "bind twice", err, unix.EINVAL)
	s3, _ := a.Socket()
	if _, err := a.Bind(s3, netip.MustParseAddrPort("0.0.0.0:7202")); err != nil {
		t.Fatal(err)
	}
	_, err = b.Bind(s2, netip.MustParseAddrPort("127.0.0.1:7202"))
	wantErr(t, "bind an address whose port 0.0.0.0 holds", err, unix.EADDRINUSE)
	_, err = b.Bind(s2, netip.MustParseAddrPort("203.0.113.9:7203"))
	wantErr(t, "bind an address of no interface here", err, unix.EADDRNOTAVAIL)
	port, err := b.Bind(s2, netip.MustParseAddrPort("127.0.0.1:0"))
	if err != nil || port < 32768 {
		t.Fatalf("ephemeral bind: port %d, %v", port, err)
	}
	wantErr(t, "listen on an unbound socket", b.Listen(mustSocket(t, b), 1), unix.EINVAL)
	_, _, err = a.Accept(s1)
	wantErr(t, "accept on a socket that does not listen", err, unix.EINVAL)
	l := listenOn(t, a, netip.MustParseAddrPort("127.0.0.1:7204"), 1)
	_, _, err = a.Accept(l)
	wantErr(t, "accept with none pending", err, unix.EAGAIN)
	wantErr(t, "connect a listening socket", a.Connect(l, netip.MustParseAddrPort("127.0.0.1:7204")), unix.EINVAL)
	wantErr(t, "close an unknown socket", a.CloseSock(4000), unix.EBADF)
	if err := a.CloseSock(s1); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "close twice", a.CloseSock(s1), unix.EBADF)
	s4, _ := b.Socket()
	if _, err := b.Bind(s4, netip.MustParseAddrPort("127.0.0.1:7200")); err != nil {
		t.Fatalf("the address of a closed socket is not free at once: %v", err)
	}
}

func mustSocket(t *testing.T, c *Client) int {
	t.Helper()
	s, err := c.Socket()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestAPIErrors(t *testing.T) {
	for _, direct := range []bool{false, true} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) {
			d := startDaemon(t, Config{Direct: direct})
			a, b := dial(t, d), dial(t, d)
			cs, ss := pair(t, a, b, 7300)
			_, err := a.Send(cs, make([]byte, 10))
			wantErr(t, "send from a buffer that pd_malloc did not give", err, unix.EFAULT)
			_, err = b.Recv(ss, 10)
			wantErr(t, "recv with nothing there", err, unix.EAGAIN)
			wantErr(t, "recv_done beyond what arrived", b.RecvDone(ss, 1), unix.EINVAL)
			_, err = a.Send(999, nil)
			wantErr(t, "send on an unknown socket", err, unix.EBADF)
			u := mustSocket(t, a)
			buf, err := a.Malloc(cs, 16)
			if err != nil {
				t.Fatal(err)
			}
			_, err = a.Send(u, buf)
			wantErr(t, "send on an unconnected socket", err, unix.ENOTCONN)
			if direct {
				b2, err := a.Malloc(cs, 16)
				if err != nil {
					t.Fatal(err)
				}
				_, err = a.Send(cs, b2)
				wantErr(t, "direct: send the second reservation before the first", err, unix.EINVAL)
			}
		})
	}
}

// The send ring is finite: pd_malloc fails with ENOMEM when it is full and succeeds again once
// buffers are freed and no send reads them any more.
func TestPoolExhaustionAndReuse(t *testing.T) {
	d := startDaemon(t, Config{Pool: 64 << 10})
	a, b := dial(t, d), dial(t, d)
	cs, ss := pair(t, a, b, 7400)
	var bufs [][]byte
	for {
		buf, err := a.Malloc(-1, 8192)
		if err != nil {
			wantErr(t, "malloc from a full pool", err, unix.ENOMEM)
			break
		}
		bufs = append(bufs, buf)
		if len(bufs) > 8 {
			t.Fatal("a 64 KiB pool gave more than 8 buffers of 8 KiB")
		}
	}
	if len(bufs) != 8 {
		t.Fatalf("%d buffers of 8 KiB from a 64 KiB pool", len(bufs))
	}
	// send the first, free all but it: the space comes back only behind the oldest live block
	if _, err := a.Send(cs, bufs[0]); err != nil {
		t.Fatal(err)
	}
	for _, buf := range bufs[1:] {
		a.Free(buf)
	}
	a.Free(bufs[0])
	eventually(t, "the sent buffer completes", func() bool {
		_, err := a.Malloc(-1, 60<<10)
		return err == nil
	})
	v, err := b.Recv(ss, 1<<20)
	if err != nil || len(v) != 8192 {
		t.Fatalf("recv %d, %v", len(v), err)
	}
}

// pd_close after sends: the peer receives every byte queued before the close, then the end.
func TestCloseDeliversQueuedData(t *testing.T) {
	for _, direct := range []bool{false, true} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) {
			d := startDaemon(t, Config{Direct: direct})
			a, b := dial(t, d), dial(t, d)
			cs, ss := pair(t, a, b, 7500)
			const total = 200 << 10 // less than the ring: all queued without waiting
			sent := 0
			for sent < total {
				buf, err := a.Malloc(cs, 10000)
				if err != nil {
					t.Fatal(err)
				}
				for i := range buf {
					buf[i] = byte(sent + i)
				}
				n, err := a.Send(cs, buf)
				if err != nil || n != len(buf) {
					t.Fatalf("send %d: %v", n, err)
				}
				sent += n
				if !direct {
					a.Free(buf)
				}
			}
			if err := a.CloseSock(cs); err != nil {
				t.Fatal(err)
			}
			got := recvToEnd(t, b, ss, func(i int) byte { return byte(i) })
			if got != sent {
				t.Fatalf("received %d of %d bytes before the end of stream", got, sent)
			}
			buf, _ := b.Malloc(ss, 10)
			if buf == nil {
				buf, _ = b.Malloc(-1, 10)
			}
			_, err := b.Send(ss, buf)
			wantErr(t, "send to a closed peer", err, unix.EPIPE)
			if err := b.CloseSock(ss); err != nil {
				t.Fatal(err)
			}
			// left: the listener pair() made
			eventually(t, "both connection rings reclaimed", func() bool { return d.Status().RingsLive == 1 })
		})
	}
}

// The receiver closes while the sender streams: the sender learns it (EPIPE), nothing hangs, and
// everything is reclaimed.
func TestCloseWhileSending(t *testing.T) {
	for _, direct := range []bool{false, true} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) {
			d := startDaemon(t, Config{Direct: direct})
			a, b := dial(t, d), dial(t, d)
			cs, ss := pair(t, a, b, 7600)
			errc := make(chan error, 1)
			var buf []byte
			go func() {
				for {
					if buf == nil || direct {
						var err error
						if buf, err = a.Malloc(cs, 32<<10); err != nil {
							if !IsAgain(err) && err != unix.ENOMEM {
								errc <- err
								return
							}
							buf = nil
							a.Wait(func() bool { return a.Room(cs) > 0 }, 10*time.Millisecond)
							continue
						}
					}
					_, err := a.Send(cs, buf)
					if IsAgain(err) {
						a.Wait(func() bool { return a.Room(cs) > 0 }, 10*time.Millisecond)
						continue
					}
					if err != nil {
						if !direct {
							a.Free(buf)
						}
						errc <- err
						return
					}
				}
			}()
			// let some data flow, consume a little, then close mid-stream
			eventually(t, "data arrives", func() bool { return b.Readable(ss) })
			v, _ := b.Recv(ss, 1000)
			b.RecvDone(ss, len(v))
			if err := b.CloseSock(ss); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-errc:
				wantErr(t, "the sender after the receiver closed", err, unix.EPIPE)
			case <-time.After(10 * time.Second):
				t.Fatal("the sender never learnt that the receiver closed")
			}
			if err := a.CloseSock(cs); err != nil {
				t.Fatal(err)
			}
			eventually(t, "connection rings reclaimed", func() bool { return d.Status().RingsLive == 1 })
			// the daemon still works
			cs2, ss2 := pair(t, a, b, 7601)
			transfer(t, a, b, cs2, ss2, 1<<20, 4000)
		})
	}
}

// A client killed with SIGKILL: the daemon notices (its control socket closes), ends its
// connections (the peer reads what was sent, then the end of stream), frees its rings and its
// bound addresses, and keeps no fd of it.
func TestCrashedPeerReclaimed(t *testing.T) {
	for _, direct := range []bool{false, true} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) {
			d := startDaemon(t, Config{Direct: direct})
			b := dial(t, d)
			fds0, rings0 := countFDs(), d.Status().RingsLive
			l := listenOn(t, b, netip.MustParseAddrPort("127.0.0.1:7700"), 4)
			const sent = 100000
			cmd, out := startHelper(t, "crash", "", "PD_SOCK="+d.cfg.Socket, "PD_ADDR=127.0.0.1:7700",
				"PD_BYTES="+strconv.Itoa(sent), "PD_LISTEN=127.0.0.1:7701")
			if l := readLine(t, out, 20*time.Second); l != "ready" {
				t.Fatalf("helper: %q", l)
			}
			var ss int
			eventually(t, "the helper's connection is pending", func() bool {
				var err error
				ss, _, err = b.Accept(l)
				return err == nil
			})
			if st := d.Status(); len(st.Clients) != 2 || st.RingsLive != rings0+4 {
				t.Fatalf("before the crash: %d clients, %d rings live (want 2, %d)", len(st.Clients), st.RingsLive, rings0+4)
			}
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			cmd.Wait()
			got := recvToEnd(t, b, ss, func(i int) byte { return byte(i * 7) })
			if got != sent {
				t.Fatalf("received %d of %d bytes from the crashed peer", got, sent)
			}
			eventually(t, "the crashed client is gone", func() bool { return len(d.Status().Clients) == 1 })
			// its listener ring, its connection ring and its control memory are freed; ours stay
			eventually(t, "its rings are freed", func() bool { return d.Status().RingsLive == rings0+2 })
			if err := b.CloseSock(ss); err != nil {
				t.Fatal(err)
			}
			b.CloseSock(l)
			eventually(t, "every ring is freed", func() bool { return d.Status().RingsLive == rings0 })
			eventually(t, "the daemon keeps no fd of the crashed client", func() bool { return countFDs() <= fds0 })
			// the crashed client's address is free
			s, _ := b.Socket()
			if _, err := b.Bind(s, netip.MustParseAddrPort("127.0.0.1:7701")); err != nil {
				t.Fatalf("the crashed client's listening address: %v", err)
			}
		})
	}
}

var _ = os.Getpid

// A program that never drains its completion queue: the engine keeps serving it (completions
// wait in the daemon's backlog) and every completion arrives once the program looks.
func TestCompletionBacklog(t *testing.T) {
	d := startDaemon(t, Config{})
	a, b := dial(t, d), dial(t, d)
	cs, ss := pair(t, a, b, 7850)
	buf, err := a.Malloc(-1, 64)
	if err != nil {
		t.Fatal(err)
	}
	off, _ := a.poolOff(buf)
	slot, _ := a.block(off)
	const n = 3 * DefaultQDepth
	q := a.socks[cs].q
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; i < n; {
		if time.Now().After(deadline) {
			t.Fatalf("the engine stopped taking entries after %d: it waits for CQ room", i)
		}
		if a.sqs[q].Push(Entry{Type: ReqSend, DataLen: 1, Src: off, CID: a.CID, ConnID: uint16(cs), EntrySeq: slot}) {
			i++
			a.ring()
			continue
		}
		time.Sleep(100 * time.Microsecond) // the engine drains the SQ although the CQ is full
	}
	eventually(t, "every byte delivered with the CQ full", func() bool { return load64(b.socks[ss].hdr, ShRxTail) == n })
	got := 0
	var e Entry
	eventually(t, "every completion arrives", func() bool {
		for a.cqs[q].Pop(&e) {
			if e.Type != ReqCompleted {
				t.Fatalf("completion type %#x", e.Type)
			}
			got++
		}
		return got == n
	})
}

// recvToEnd reads sid until the end of stream, checking every byte against want(offset), and
// returns how many bytes came.
func recvToEnd(t *testing.T, c *Client, sid int, want func(int) byte) int {
	t.Helper()
	got := 0
	for {
		v, err := c.Recv(sid, 1<<20)
		if IsAgain(err) {
			c.Wait(func() bool { return c.Readable(sid) }, 100*time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if v == nil {
			return got
		}
		for i, x := range v {
			if x != want(got+i) {
				t.Fatalf("byte %d: %d, want %d", got+i, x, want(got+i))
			}
		}
		got += len(v)
		c.RecvDone(sid, len(v))
	}
}
