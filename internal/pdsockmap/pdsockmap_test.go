package pdsockmap

import (
	"fmt"
	"io"
	"net"
	"os"
	"testing"

	"github.com/peregrine-net/peregrine/internal/testutil"
)

// With the shortcut attached and this process in its cgroup, a TCP connection's data is
// redirected socket to socket (the counters say so) and arrives intact.
func TestShortcutRedirects(t *testing.T) {
	testutil.RequireRoot(t)
	s, err := Attach(fmt.Sprintf("prg-pdsm-test-%d", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	}()
	if err := s.Enter(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const total = 8 << 20
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		b, _ := io.ReadAll(c)
		got <- b
	}()
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, total)
	for i := range buf {
		buf[i] = byte(i * 13)
	}
	for off := 0; off < total; off += 65536 {
		if _, err := c.Write(buf[off : off+65536]); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	b := <-got
	if len(b) != total {
		t.Fatalf("received %d of %d bytes", len(b), total)
	}
	for i := range b {
		if b[i] != buf[i] {
			t.Fatalf("byte %d differs", i)
		}
	}
	rec, red, _, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if rec < 2 || red == 0 {
		t.Fatalf("sockets recorded %d, messages redirected %d: the shortcut did not work", rec, red)
	}
}
