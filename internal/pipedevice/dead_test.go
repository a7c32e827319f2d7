package pipedevice

import (
	"bufio"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// pd.h: once the daemon is gone every call fails with ECONNRESET. Issue 28: pd_buf_refresh said
// 0 forever after `kill -9` of the daemon, so a sender waiting for its buffer spun. Here the
// daemon (a helper process) is stopped while a send is queued (the buffer stays in flight), then
// killed with SIGKILL and reaped; the waiting sender must learn within 100 ms, and every entry
// point of libpd (a C program built from pd.h) and of the Go client must say ECONNRESET.
func TestDaemonGoneEveryCall(t *testing.T) {
	t.Run("libpd", func(t *testing.T) {
		_, prog := buildCTest(t, "pd_dead")
		sock, dm := startKillableDaemon(t)
		c := exec.Command(prog, sock, "7960")
		in, err := c.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		pout, err := c.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
		r := bufio.NewReader(pout)
		if l := readLine(t, r, 10*time.Second); l != "ready" {
			t.Fatalf("pd_dead: %q, want ready", l)
		}
		stopDaemon(t, dm)
		in.Write([]byte("go\n"))
		if l := readLine(t, r, 10*time.Second); l != "sent" {
			t.Fatalf("pd_dead: %q, want sent", l)
		}
		killDaemon(t, dm)
		in.Write([]byte("go\n"))
		done := make(chan string, 1)
		go func() {
			var b strings.Builder
			for {
				l, err := r.ReadString('\n')
				b.WriteString(l)
				if err != nil {
					done <- b.String()
					return
				}
			}
		}()
		select {
		case rest := <-done:
			err := c.Wait()
			if err != nil || !strings.HasPrefix(rest, "OK ") {
				t.Fatalf("pd_dead: %v\n%s", err, rest)
			}
			t.Log(strings.TrimSpace(rest))
		case <-time.After(10 * time.Second):
			t.Fatal("pd_dead still running 10 s after the daemon was killed (a call spins or blocks)")
		}
	})

	t.Run("go", func(t *testing.T) {
		sock, dm := startKillableDaemon(t)
		c, err := Dial(sock, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		cs, ss := pair(t, c, c, 7961)
		l, err := c.Socket()
		if err != nil {
			t.Fatal(err)
		}
		buf, err := c.Malloc(-1, 4096)
		if err != nil {
			t.Fatal(err)
		}
		stopDaemon(t, dm)
		if n, err := c.Send(cs, buf); n != len(buf) || err != nil {
			t.Fatalf("Send to a stopped daemon: %d, %v (want it queued)", n, err)
		}
		if ok, err := c.Reusable(buf); ok || err != nil {
			t.Fatalf("Reusable with the send in flight: %v, %v", ok, err)
		}
		killDaemon(t, dm)

		start := time.Now()
		calls := 0
		for ; time.Since(start) < 2*time.Second; calls++ {
			ok, err := c.Reusable(buf)
			if ok {
				t.Fatal("the buffer came back though its send never completed")
			}
			if err != nil {
				if !errors.Is(err, unix.ECONNRESET) {
					t.Fatalf("Reusable: %v, want ECONNRESET", err)
				}
				break
			}
		}
		if d := time.Since(start); d > 100*time.Millisecond {
			t.Fatalf("a sender waiting for its buffer spun %d calls, %v, after the daemon was killed", calls, d)
		}
		t.Logf("the waiting sender learned after %d calls, %v", calls, time.Since(start))

		reset := func(what string, err error) {
			t.Helper()
			if !errors.Is(err, unix.ECONNRESET) {
				t.Errorf("%s after the daemon's end: %v, want ECONNRESET", what, err)
			}
		}
		_, err = c.Malloc(-1, 64)
		reset("Malloc", err)
		_, err = c.Send(cs, buf[:1])
		reset("Send", err)
		_, err = c.Reusable(buf)
		reset("Reusable", err)
		_, err = c.Recv(ss, 100)
		reset("Recv", err)
		reset("RecvDone", c.RecvDone(ss, 0))
		_, err = c.Socket()
		reset("Socket", err)
		_, err = c.Bind(l, netip.MustParseAddrPort("127.0.0.1:7962"))
		reset("Bind", err)
		reset("Listen", c.Listen(l, 4))
		_, _, err = c.Accept(l)
		reset("Accept", err)
		reset("Connect", c.Connect(l, netip.MustParseAddrPort("127.0.0.1:7961")))
		reset("Free", c.Free(buf))
		reset("CloseSock", c.CloseSock(cs))
		reset("CloseSock again", c.CloseSock(cs))
		if c.nsocks() != 3 { // pair's listener, ss and l; cs released all the same
			t.Errorf("%d sockets left after closing one of 4", c.nsocks())
		}
		if !c.Readable(ss) || c.Room(ss) != 0 || !c.Dead() {
			t.Errorf("readiness after the daemon's end: readable %v room %d dead %v (want true, 0, true)", c.Readable(ss), c.Room(ss), c.Dead())
		}
		t0 := time.Now()
		if !c.Wait(func() bool { return false }, time.Second) || time.Since(t0) > 100*time.Millisecond {
			t.Errorf("Wait after the daemon's end took %v", time.Since(t0))
		}
	})
}

// startKillableDaemon runs a daemon in a helper process (to be stopped and killed) and returns
// its socket.
func startKillableDaemon(t *testing.T) (string, *exec.Cmd) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "pd.sock")
	dm, dout := startHelper(t, "daemon", "", "PD_SOCK="+sock)
	if l := readLine(t, dout, 20*time.Second); l != "ready" {
		t.Fatalf("daemon: %q", l)
	}
	return sock, dm
}

// stopDaemon stops the daemon (SIGSTOP): nothing it is sent completes.
func stopDaemon(t *testing.T, dm *exec.Cmd) {
	t.Helper()
	if err := dm.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// stopped once /proc says so (the signal is delivered asynchronously)
	eventually(t, "the daemon stopped", func() bool {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", dm.Process.Pid))
		i := strings.LastIndexByte(string(b), ')')
		return i > 0 && i+2 < len(b) && b[i+2] == 'T'
	})
}

// killDaemon kills the daemon with SIGKILL and reaps it: its end of every control socket is
// closed when this returns.
func killDaemon(t *testing.T, dm *exec.Cmd) {
	t.Helper()
	if err := dm.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	dm.Wait()
}
