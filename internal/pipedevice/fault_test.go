package pipedevice

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// A fault on a client's memory in the engine (what a punched hugepage did before the seals)
// drops that client, counted; the daemon, the engine and every other client go on. The fault is
// made by taking away the daemon's own access to the sender's pool.
func TestEngineFaultDropsTheClient(t *testing.T) {
	d := startDaemon(t, Config{})
	a, b := dial(t, d), dial(t, d)
	cs, ss := pair(t, a, b, 7880)
	transfer(t, a, b, cs, ss, 1<<20, 4096)
	var pa *proc
	d.mu.Lock()
	for p := range d.procs {
		if p.cid == a.CID {
			pa = p
		}
	}
	d.mu.Unlock()
	if err := unix.Mprotect(pa.pool.Mem, unix.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	buf, err := a.Malloc(-1, 4096)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "room to send", func() bool { return a.Room(cs) >= 4096 })
	if _, err := a.Send(cs, buf); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the faulting client dropped", func() bool { return d.Status().Dropped == 1 && a.Dead() })
	eventually(t, "its peer sees the end of the stream", func() bool {
		v, err := b.Recv(ss, 1<<20)
		return v == nil && err == nil
	})
	// everyone else is served
	c, e := dial(t, d), dial(t, d)
	cs2, ss2 := pair(t, c, e, 7881)
	transfer(t, c, e, cs2, ss2, 4<<20, 65536)
}

// A fake daemon that hands out nonsense (no queues, no fds, sizes that are not powers of two)
// gets a clean EPROTO from both clients, never a crash (the SIGFPE of issue 21).
func TestClientsCheckDaemonReplies(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "fake.sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	bad := []Reply{
		{V: [6]uint32{0, 0, 1024, 8192}, W: [2]uint64{1 << 20, 1 << 20}},       // nq = 0
		{V: [6]uint32{0, 2, 1000, 8192}, W: [2]uint64{1 << 20, 1 << 20}},       // depth not a power of two
		{V: [6]uint32{0, 2, 1024, 0}, W: [2]uint64{1 << 20, 1 << 20}},          // no socket table
		{V: [6]uint32{0, 2, 1024, 8192}, W: [2]uint64{3 << 20, 1 << 20}},       // ring not a power of two
		{V: [6]uint32{0, 2, 1024, 8192}, W: [2]uint64{1 << 20, 1 << 40}},       // a pool of a TiB
		{V: [6]uint32{0, 1 << 30, 1024, 8192}, W: [2]uint64{1 << 20, 1 << 20}}, // a billion queues
	}
	go func() {
		for i := 0; ; i++ {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			buf := make([]byte, 512)
			c.ReadMsgUnix(buf, nil)
			var fds []int
			for k := 0; k < 5; k++ {
				fd, _ := unix.Eventfd(0, unix.EFD_CLOEXEC)
				fds = append(fds, fd)
			}
			r := bad[i%len(bad)]
			c.WriteMsgUnix(r.marshal(), unix.UnixRights(fds...), nil)
			closeFDs(fds)
			c.Close()
		}
	}()
	for i := range bad {
		if _, err := Dial(sock, 0, 0); !errors.Is(err, unix.EPROTO) {
			t.Errorf("Go client, reply %d: %v, want EPROTO", i, err)
		}
	}
	out, _ := buildLibpd(t)
	for i := range bad {
		cmd := exec.Command(filepath.Join(out, "pd-example-client"), "127.0.0.1", "1", "1024", "1024")
		cmd.Env = append(os.Environ(), "PD_SOCKET="+sock)
		b, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(strings.ToLower(string(b)), "protocol") {
			t.Errorf("C client, reply %d: %v: %s (want exit 1 with EPROTO)", i, err, b)
		}
	}
}

// --socket: only a stale socket is replaced; a missing or shared directory is refused.
func TestSocketPathRules(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "not-a-socket")
	os.WriteFile(file, []byte("keep me"), 0o600)
	if _, err := NewDaemon(Config{Socket: file}); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("a regular file at --socket: %v", err)
	}
	if b, _ := os.ReadFile(file); string(b) != "keep me" {
		t.Error("the regular file was touched")
	}
	if _, err := NewDaemon(Config{Socket: filepath.Join(dir, "missing", "pd.sock")}); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("a missing directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "missing")); err == nil {
		t.Error("the missing directory was made")
	}
	shared := filepath.Join(dir, "shared")
	os.Mkdir(shared, 0o777)
	os.Chmod(shared, 0o777)
	if _, err := NewDaemon(Config{Socket: filepath.Join(shared, "pd.sock")}); err == nil || !strings.Contains(err.Error(), "writable by others") {
		t.Errorf("a world-writable directory: %v", err)
	}
	// a stale socket (nobody answers) is replaced; a live one is not
	stale := filepath.Join(dir, "pd.sock")
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: stale, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	d := startDaemonAt(t, Config{}, stale)
	if _, err := NewDaemon(Config{Socket: stale}); err == nil || !strings.Contains(err.Error(), "already serves") {
		t.Errorf("a second daemon on a live socket: %v", err)
	}
	c := dial(t, d)
	mustSocket(t, c)
}

// Per-namespace memory is refused with ENOBUFS and given back when the client goes.
func TestNamespaceMemoryQuota(t *testing.T) {
	d := startDaemon(t, Config{Ring: 64 << 10, Pool: 1 << 20, Limits: Limits{BytesPerNS: 4 << 20}})
	c := dial(t, d)
	n := 0
	var err error
	for ; n < 1000; n++ {
		if _, err = c.Socket(); err != nil {
			break
		}
	}
	if !errors.Is(err, unix.ENOBUFS) || n == 0 || int64(n)*(64<<10) > 4<<20 {
		t.Fatalf("%d sockets of 64 KiB in a 4 MiB quota, then %v (want ENOBUFS)", n, err)
	}
	c.Close()
	eventually(t, "the quota given back", func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return len(d.usage) == 0 && len(d.nsAddrs) == 0
	})
	c2 := dial(t, d)
	for i := 0; i < n; i++ {
		mustSocket(t, c2)
	}
}
