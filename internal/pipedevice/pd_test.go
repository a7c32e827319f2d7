package pipedevice

import (
	"bytes"
	"errors"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// startDaemon runs a daemon on a private socket for one test.
func startDaemon(t testing.TB, cfg Config) *Daemon {
	t.Helper()
	return startDaemonAt(t, cfg, filepath.Join(t.TempDir(), "pd.sock"))
}

func startDaemonAt(t testing.TB, cfg Config, socket string) *Daemon {
	t.Helper()
	cfg.Socket = socket
	if cfg.Ring == 0 {
		cfg.Ring = 256 << 10
	}
	if cfg.Pool == 0 {
		cfg.Pool = 1 << 20
	}
	d, err := NewDaemon(cfg)
	if err != nil {
		t.Fatal(err)
	}
	go d.Serve()
	t.Cleanup(d.Close)
	return d
}

func dial(t testing.TB, d *Daemon) *Client {
	t.Helper()
	c, err := Dial(d.cfg.Socket, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

var lo = netip.MustParseAddrPort("127.0.0.1:7000")

// pair connects a client socket of a to a listener of b and returns (client sid, server sid).
func pair(t testing.TB, a, b *Client, port uint16) (int, int) {
	t.Helper()
	ap := netip.AddrPortFrom(lo.Addr(), port)
	l, err := b.Socket()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Bind(l, ap); err != nil {
		t.Fatal(err)
	}
	if err := b.Listen(l, 16); err != nil {
		t.Fatal(err)
	}
	cs, _ := a.Socket()
	if err := a.Connect(cs, ap); err != nil {
		t.Fatal(err)
	}
	ss, peer, err := b.Accept(l)
	if err != nil {
		t.Fatal(err)
	}
	if !peer.Addr().IsLoopback() {
		t.Fatalf("peer %v", peer)
	}
	return cs, ss
}

// transfer sends total bytes of a pattern from a:cs to b:ss and checks every byte.
func transfer(t *testing.T, a, b *Client, cs, ss int, total, msg int) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		var got int
		for got < total {
			v, err := b.Recv(ss, 1<<20)
			if IsAgain(err) {
				b.Wait(func() bool { return b.Readable(ss) }, time.Second)
				continue
			}
			if err != nil || v == nil {
				done <- errors.Join(err, errors.New("early end"))
				return
			}
			for i, x := range v {
				if x != byte((got+i)*7) {
					done <- errors.New("corrupt byte")
					return
				}
			}
			got += len(v)
			b.RecvDone(ss, len(v))
		}
		done <- nil
	}()
	sent := 0
	for sent < total {
		n := min(msg, total-sent)
		buf, err := a.Malloc(cs, n)
		if err != nil {
			a.Wait(func() bool { return a.Room(cs) > 0 }, 10*time.Millisecond)
			continue
		}
		for i := range buf {
			buf[i] = byte((sent + i) * 7)
		}
		off := 0
		for off < n {
			k, err := a.Send(cs, buf[off:])
			if IsAgain(err) {
				a.Wait(func() bool { return a.Room(cs) > 0 }, 100*time.Millisecond)
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			off += k
		}
		a.Free(buf)
		sent += n
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("transfer stuck")
	}
}

func TestTransferIntegrity(t *testing.T) {
	for _, direct := range []bool{false, true} {
		d := startDaemon(t, Config{Direct: direct})
		a, b := dial(t, d), dial(t, d)
		cs, ss := pair(t, a, b, 7001)
		// 64 MiB through a 256 KiB ring in odd-sized messages: many wrap-arounds of both rings.
		transfer(t, a, b, cs, ss, 64<<20, 65536+333)
		if direct && d.Status().BytesCopied != 0 {
			t.Fatalf("direct mode copied %d bytes", d.Status().BytesCopied)
		}
		if !direct && d.Status().BytesCopied != 64<<20 {
			t.Fatalf("engine copied %d bytes", d.Status().BytesCopied)
		}
		_ = bytes.Equal
		_ = unix.EAGAIN
	}
}
