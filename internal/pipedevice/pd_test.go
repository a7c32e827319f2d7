package pipedevice

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"sync"
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
	if err := transferErr(a, b, cs, ss, total, msg, 0); err != nil {
		t.Fatal(err)
	}
}

// transferErr is transfer for any goroutine; seed varies the pattern per connection.
func transferErr(a, b *Client, cs, ss int, total, msg int, seed byte) error {
	pat := func(i int) byte { return byte(i*7) ^ seed ^ byte(i>>13) }
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
				done <- fmt.Errorf("receiver: early end after %d of %d bytes: %v", got, total, err)
				return
			}
			for i, x := range v {
				if x != pat(got+i) {
					done <- fmt.Errorf("receiver: byte %d is %#x, want %#x", got+i, x, pat(got+i))
					return
				}
			}
			got += len(v)
			if err := b.RecvDone(ss, len(v)); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	sent := 0
	deadline := time.Now().Add(60 * time.Second)
	for sent < total {
		if time.Now().After(deadline) {
			return fmt.Errorf("sender stuck after %d of %d bytes", sent, total)
		}
		n := min(msg, total-sent)
		buf, err := a.Malloc(cs, n)
		if err != nil {
			if !IsAgain(err) && err != unix.ENOMEM {
				return fmt.Errorf("malloc: %w", err)
			}
			a.Wait(func() bool { return a.Room(cs) > 0 }, 10*time.Millisecond)
			continue
		}
		for i := range buf {
			buf[i] = pat(sent + i)
		}
		off := 0
		for off < n {
			k, err := a.Send(cs, buf[off:])
			if IsAgain(err) {
				a.Wait(func() bool { return a.Room(cs) > 0 }, 100*time.Millisecond)
				continue
			}
			if err != nil {
				return fmt.Errorf("send: %w", err)
			}
			off += k
		}
		a.Free(buf)
		sent += n
	}
	select {
	case err := <-done:
		return err
	case <-time.After(60 * time.Second):
		return fmt.Errorf("receiver stuck")
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
	}
}

// Long transfers checked byte by byte, in both modes, with two engines: several connections
// between two processes in both directions at once, message sizes from 1 byte to beyond the
// ring (engine mode; direct mode reserves in the peer's ring, so its messages fit in one).
func TestTransferIntegrityMany(t *testing.T) {
	for _, direct := range []bool{false, true} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) {
			d := startDaemon(t, Config{Direct: direct, EngineCPUs: []int{0, 0}})
			a, b := dial(t, d), dial(t, d)
			sizes := []int{1, 100, 4095, 32<<10 + 1, 200 << 10, 1 << 20}
			var wg sync.WaitGroup
			errs := make(chan error, 2*len(sizes))
			for i, size := range sizes {
				if direct && size > 256<<10 {
					size = 256 << 10
				}
				total := 4 << 20
				if size < 1000 {
					total = size * 300 // one entry per message: keep it short
				}
				cs, ss := pair(t, a, b, uint16(8000+2*i))
				bs, as := pair(t, b, a, uint16(8001+2*i))
				wg.Add(2)
				go func() { defer wg.Done(); errs <- transferErr(a, b, cs, ss, total, size, byte(i)) }()
				go func() { defer wg.Done(); errs <- transferErr(b, a, bs, as, total, size, byte(i+100)) }()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Error(err)
				}
			}
			st := d.Status()
			if st.FailedEntries != 0 {
				t.Errorf("%d entries failed", st.FailedEntries)
			}
			if direct && st.BytesCopied != 0 || !direct && st.BytesPublish != 0 {
				t.Errorf("copied %d, published %d in %v mode", st.BytesCopied, st.BytesPublish, direct)
			}
		})
	}
}
