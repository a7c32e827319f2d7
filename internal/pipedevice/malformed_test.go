package pipedevice

import (
	"encoding/binary"
	"math/rand"
	"net"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

func rawConn(t *testing.T, d *Daemon) *net.UnixConn {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: d.cfg.Socket, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// rawCall sends b and returns the reply's errno and sid (the fds that came with it are closed).
func rawCall(t *testing.T, c *net.UnixConn, b []byte, fds ...int) (uint32, uint32) {
	t.Helper()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := c.WriteMsgUnix(b, oob, nil); err != nil {
		t.Fatalf("write: %v", err)
	}
	buf := make([]byte, 64<<10)
	roob := make([]byte, unix.CmsgSpace(8*4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, roob)
	if err != nil || n < MsgSize {
		t.Fatalf("no reply (%d bytes): %v", n, err)
	}
	if msgs, err := unix.ParseSocketControlMessage(roob[:oobn]); err == nil {
		for _, m := range msgs {
			if f, err := unix.ParseUnixRights(&m); err == nil {
				for _, fd := range f {
					unix.Close(fd)
				}
			}
		}
	}
	return binary.LittleEndian.Uint32(buf), binary.LittleEndian.Uint32(buf[4:])
}

// Malformed control requests get an errno and the daemon goes on serving.
func TestMalformedRequests(t *testing.T) {
	d := startDaemon(t, Config{})
	fds0 := countFDs()
	c := rawConn(t, d)
	req := func(r Request) []byte { return r.marshal() }
	cases := []struct {
		what string
		msg  []byte
		want unix.Errno
	}{
		{"empty-ish message", []byte{1}, unix.EINVAL},
		{"short message", make([]byte, 63), unix.EINVAL},
		{"long message", make([]byte, 65), unix.EINVAL},
		{"socket before hello", req(Request{Op: OpSocket}), unix.ENOTCONN},
		{"bind before hello", req(Request{Op: OpBind, SID: 0}), unix.ENOTCONN},
		{"unknown op before hello", req(Request{Op: 999}), unix.ENOTCONN},
		{"hello with a ring not a power of two", req(Request{Op: OpHello, A0: 5000}), unix.EINVAL},
		{"hello with a huge ring", req(Request{Op: OpHello, A0: 1 << 31}), unix.EINVAL},
		{"hello with a tiny pool", req(Request{Op: OpHello, A1: 1024}), unix.EINVAL},
		{"hello with a queue depth not a power of two", req(Request{Op: OpHello, A2: 100}), unix.EINVAL},
		{"hello with a huge queue depth", req(Request{Op: OpHello, A2: 1 << 40}), unix.EINVAL},
		{"hello with a queue depth over the limit", req(Request{Op: OpHello, A2: 65536}), unix.ENOBUFS},
		{"hello", req(Request{Op: OpHello, A0: 8192, A1: 8192}), 0},
		{"socket before the seal", req(Request{Op: OpSocket}), unix.ENOTCONN},
		{"seal something unknown", req(Request{Op: OpSeal, A0: 7}), unix.EINVAL},
		{"seal", req(Request{Op: OpSeal}), 0},
		{"seal twice", req(Request{Op: OpSeal}), unix.EALREADY},
		{"seal a peer ring in engine mode", req(Request{Op: OpSeal, A0: 1}), unix.EINVAL},
		{"hello twice", req(Request{Op: OpHello}), unix.EALREADY},
		{"unknown op", req(Request{Op: 999}), unix.EOPNOTSUPP},
		{"op zero", req(Request{Op: 0}), unix.EOPNOTSUPP},
		{"bind an unknown sid", req(Request{Op: OpBind, SID: 5}), unix.EBADF},
		{"bind sid 2^32-1", req(Request{Op: OpBind, SID: 0xFFFFFFFF}), unix.EBADF},
		{"close sid beyond the table", req(Request{Op: OpClose, SID: DefaultMaxSock}), unix.EBADF},
		{"accept sid 2^31", req(Request{Op: OpAccept, SID: 1 << 31}), unix.EBADF},
		{"socket", req(Request{Op: OpSocket}), 0},
		{"bind a broadcast address", req(Request{Op: OpBind, SID: 0, Addr: [4]byte{255, 255, 255, 255}, Port: 1}), unix.EADDRNOTAVAIL},
		{"listen before bind", req(Request{Op: OpListen, SID: 0, A0: 1 << 31}), unix.EINVAL},
		{"connect to nowhere", req(Request{Op: OpConnect, SID: 0, Addr: [4]byte{127, 0, 0, 1}, Port: 1}), unix.ECONNREFUSED},
		{"bind loopback", req(Request{Op: OpBind, SID: 0, Addr: [4]byte{127, 0, 0, 1}, Port: 7950}), 0},
		{"listen with a negative backlog", req(Request{Op: OpListen, SID: 0, A0: 0xFFFFFFFF}), 0},
		{"close on a queue that does not exist", req(Request{Op: OpClose, SID: 0, A0: 1 << 30}), 0},
		{"use after close", req(Request{Op: OpAccept, SID: 0}), unix.EBADF},
	}
	for _, tc := range cases {
		got, _ := rawCall(t, c, tc.msg)
		if unix.Errno(got) != tc.want {
			t.Errorf("%s: errno %v, want %v", tc.what, unix.Errno(got), tc.want)
		}
	}
	if _, sid := rawCall(t, c, req(Request{Op: OpSocket})); true {
		if e, _ := rawCall(t, c, req(Request{Op: OpGetName, SID: sid})); unix.Errno(e) != unix.ENOTCONN {
			t.Errorf("peer name of an unconnected socket: %v", unix.Errno(e))
		}
	}
	// fds sent to the daemon are not kept
	p := make([]int, 2)
	unix.Pipe(p)
	for i := 0; i < 20; i++ {
		rawCall(t, c, req(Request{Op: 999}), p[0], p[1])
	}
	unix.Close(p[0])
	unix.Close(p[1])

	// random requests: every op with random fields, then random bytes
	r := rand.New(rand.NewSource(1))
	for i := 0; i < 3000; i++ {
		var b []byte
		if i%3 == 0 {
			b = make([]byte, r.Intn(200))
			r.Read(b)
		} else {
			rq := Request{Op: uint32(r.Intn(12)), SID: uint32(r.Intn(8)), A0: r.Uint32(), A1: r.Uint32(), A2: r.Uint64(), Port: uint16(r.Intn(4) + 7960)}
			if r.Intn(2) == 0 {
				rq.Addr = [4]byte{127, 0, 0, 1}
			} else {
				binary.LittleEndian.PutUint32(rq.Addr[:], r.Uint32())
			}
			if rq.Op == OpHello && r.Intn(4) != 0 {
				rq.Op = OpSocket
			}
			b = rq.marshal()
		}
		if len(b) == 0 {
			continue
		}
		rawCall(t, c, b)
	}
	c.Close()
	// the daemon still serves and moves data correctly, and keeps nothing of the fuzzer
	a1, b1 := dial(t, d), dial(t, d)
	cs, ss := pair(t, a1, b1, 7990)
	transfer(t, a1, b1, cs, ss, 1<<20, 5000)
	a1.Close()
	b1.Close()
	eventually(t, "every ring freed", func() bool { return d.Status().RingsLive == 0 })
	eventually(t, "every fd closed", func() bool { return countFDs() <= fds0 })
	if n := d.Status().InternalErrs; n != 0 {
		t.Fatalf("%d requests hit an internal error (a panic caught)", n)
	}
}

// A client scribbles over everything it can write: its queue entries, queue indexes and socket
// headers. The engine rejects what it cannot use and a transfer between two other clients, run
// at the same time, arrives intact.
func TestGarbageInSharedMemory(t *testing.T) {
	for _, direct := range []bool{false, true} {
		d := startDaemon(t, Config{Direct: direct})
		a, b := dial(t, d), dial(t, d)
		cs, ss := pair(t, a, b, 7995)
		evil, peer := dial(t, d), dial(t, d)
		ecs, _ := pair(t, evil, peer, 7996)
		// first, garbage entries alone: the engine must reject them and go on
		r0 := rand.New(rand.NewSource(3))
		for i := 0; i < 500; i++ {
			b := make([]byte, EntrySize)
			r0.Read(b)
			var e Entry
			e.get(b)
			if !evil.sqs[i%len(evil.sqs)].Push(e) {
				t.Fatalf("push %d into a fresh queue failed", i)
			}
		}
		evil.ring()
		eventually(t, "the engine rejects garbage entries", func() bool { return d.Status().FailedEntries > 0 })
		eventually(t, "the engine consumes every garbage entry", func() bool {
			evil.drainCQ()
			for _, q := range evil.sqs {
				if q.Len() != 0 {
					return false
				}
			}
			return true
		})
		stop := make(chan struct{})
		done := make(chan struct{})
		pushed := 0
		go func() {
			defer close(done)
			r := rand.New(rand.NewSource(2))
			ent := make([]byte, EntrySize)
			for i := 0; ; i++ {
				if i > 20000 {
					select {
					case <-stop:
						return
					default:
					}
				}
				q := evil.sqs[r.Intn(len(evil.sqs))]
				op := 3 + r.Intn(7) // first well-formed pushes of garbage entries (they reach the engine)
				if i > 10000 {
					op = r.Intn(10) // then scribbling over indexes and headers too
				}
				switch op {
				case 0: // random queue index words
					store64(q.mem, 0, r.Uint64())
					store64(q.mem, 64, r.Uint64())
				case 1: // random socket header
					off := evil.lay.SockOff(ecs)
					r.Read(evil.ctl[off : off+SockHdrSize])
				case 2: // the whole control page
					r.Read(evil.ctl[8:HdrPage])
				default: // well-formed pushes of random entries
					r.Read(ent)
					var e Entry
					e.get(ent)
					if r.Intn(2) == 0 {
						e.Type = uint8(1 + r.Intn(4))
						e.ConnID = uint16(r.Intn(4))
					}
					if q.Push(e) {
						pushed++
					}
					evil.ring()
				}
				if i%64 == 0 {
					var e Entry
					for _, cq := range evil.cqs {
						cq.Pop(&e)
					}
				}
			}
		}()
		transfer(t, a, b, cs, ss, 16<<20, 30000)
		close(stop)
		<-done
		if d.Status().FailedEntries == 0 {
			t.Fatalf("no garbage entry was rejected: the test did not reach the engine (direct=%v, pushed %d, status %+v)", direct, pushed, d.Status())
		}
		_ = netip.AddrPort{}
	}
}
