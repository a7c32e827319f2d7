package pipedevice

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The attacker of TestHostileTenants: a container process (another network namespace, uid
// 65534, nothing but the daemon's socket) that tries each attack of issue 21 and reports what
// the daemon answered, as JSON on stdout.
type attackReport struct {
	UID             int    `json:"uid"`
	StatusNoHello   string `json:"status_before_hello"`
	PoolHuge        bool   `json:"pool_on_hugepages"`
	PunchBeforeSeal string `json:"punch_before_seal"`
	SealAfterPunch  string `json:"seal_after_punch"`
	PunchAfterSeal  string `json:"punch_after_seal"`
	RemoveAfterSeal string `json:"madv_remove_after_seal"`
	RxMapWritable   string `json:"rx_ring_map_writable"`
	EngineWritable  string `json:"engine_page_map_writable"`
	DeepQueue       string `json:"hello_queue_depth_65536"`
	ClientsOpened   int    `json:"clients_opened"`
	ClientsRefusal  string `json:"clients_refusal"`
	SocketsOpened   int    `json:"sockets_opened"`
	SocketsRefusal  string `json:"sockets_refusal"`
	ConnectsMade    int    `json:"connects_made"`
	ConnectsRefusal string `json:"connects_refusal"`
	CrossTenant     string `json:"cross_tenant_connect"`
	CloseCorrupt    string `json:"close_with_corrupt_queue"`
	CloseMillis     int64  `json:"close_with_corrupt_queue_ms"`
	Doorbells       int    `json:"doorbell_rings"`
	NoReadDropped   bool   `json:"not_reading_replies_dropped"`
}

// dropPrivileges makes a helper uid/gid 65534 with no groups.
func dropPrivileges() error {
	if err := unix.Setgroups(nil); err != nil {
		return err
	}
	if err := unix.Setgid(65534); err != nil {
		return err
	}
	return unix.Setuid(65534)
}

func helperAttack() error {
	if err := dropPrivileges(); err != nil {
		return err
	}
	sock, victim := os.Getenv("PD_SOCK"), netip.MustParseAddrPort(os.Getenv("PD_VICTIM"))
	rep := attackReport{UID: os.Getuid()}
	if os.Getenv("PD_ONLY") == "cross-tenant" {
		c, err := Dial(sock, 0, 0)
		if err != nil {
			return err
		}
		s, _ := c.Socket()
		rep.CrossTenant = errName(c.Connect(s, victim))
		return json.NewEncoder(os.Stdout).Encode(rep)
	}
	fmt.Println("started")

	// status before hello
	raw, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		return err
	}
	rc := &Client{conn: raw, connFD: -1}
	_, err = rc.call(Request{Op: OpStatus})
	rep.StatusNoHello = errName(unwrapErrno(err))
	raw.Close()

	attackMemory(sock, &rep)

	// floods: control connections, sockets, queue depth
	var keep []*Client
	for i := 0; i < 64; i++ {
		c, err := Dial(sock, 0, 0)
		if err != nil {
			rep.ClientsRefusal = errName(unwrapErrno(err))
			break
		}
		keep = append(keep, c)
		rep.ClientsOpened++
	}
	for _, c := range keep[1:] {
		c.Close()
	}
	c := keep[0]
	for i := 0; i < 100000; i++ {
		if _, err := c.Socket(); err != nil {
			rep.SocketsRefusal = errName(unwrapErrno(err))
			break
		}
		rep.SocketsOpened++
	}
	if raw, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: sock, Net: "unixpacket"}); err == nil {
		_, err = (&Client{conn: raw, connFD: -1}).call(Request{Op: OpHello, A2: 65536})
		rep.DeepQueue = errName(unwrapErrno(err))
		raw.Close()
	}
	c.Close()
	time.Sleep(100 * time.Millisecond) // let the daemon reclaim (the quota is the namespace's)

	// connect flood on the victim's listener
	c, err = Dial(sock, 0, 0)
	if err != nil {
		return err
	}
	for i := 0; i < 1000; i++ {
		s, err := c.Socket()
		if err == nil {
			err = c.Connect(s, victim)
		}
		if err != nil {
			rep.ConnectsRefusal = errName(unwrapErrno(err))
			break
		}
		rep.ConnectsMade++
	}

	// a close while the queue is corrupt: the daemon retries (a second) outside its lock
	l, _ := c.Socket()
	self := netip.MustParseAddrPort("127.0.0.1:7990")
	c.Bind(l, self)
	c.Listen(l, 4)
	s, _ := c.Socket()
	c.Connect(s, self)
	for q := range c.sqs { // every slot's sequence far from its position: the queue looks full
		for i := 0; i < c.lay.QDepth; i++ {
			store32(c.sqs[q].mem, QueueHdr+i*EntrySize, 0x80000000)
		}
	}
	t0 := time.Now()
	rep.CloseCorrupt = errName(c.CloseSock(s))
	rep.CloseMillis = time.Since(t0).Milliseconds()

	// a doorbell storm: rings wake every engine, nobody else's wake-ups are lost
	end := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(end) {
		ringEventfd(c.doorbell)
		rep.Doorbells++
		time.Sleep(20 * time.Microsecond)
	}
	c.Close()

	rep.NoReadDropped = attackNoRead(sock)
	return json.NewEncoder(os.Stdout).Encode(rep)
}

// attackMemory punches holes into what the daemon hands over and tries writable mappings of what
// it reads: the pool before the seal (the daemon fills the hole again) and after (refused).
func attackMemory(sock string, rep *attackReport) {
	raw, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		rep.PunchBeforeSeal = err.Error()
		return
	}
	defer raw.Close()
	rc := &Client{conn: raw, connFD: -1}
	h, err := rc.call(Request{Op: OpHello})
	if err != nil || len(h.FDs) != 5 {
		rep.PunchBeforeSeal = fmt.Sprintf("hello: %v", err)
		return
	}
	defer closeFDs(h.FDs)
	rep.PoolHuge = h.V[4] == 1
	punch := func(fd int) string {
		return errName(unwrapErrno(unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, int64(h.W[1]))))
	}
	rep.PunchBeforeSeal = punch(h.FDs[1])
	pool, err := unix.Mmap(h.FDs[1], 0, int(h.W[1]), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err == nil {
		defer unix.Munmap(pool)
	}
	_, err = rc.call(Request{Op: OpSeal})
	rep.SealAfterPunch = errName(unwrapErrno(err))
	rep.PunchAfterSeal = punch(h.FDs[1])
	if pool != nil {
		rep.RemoveAfterSeal = errName(unwrapErrno(unix.Madvise(pool, unix.MADV_REMOVE)))
	}
	writable := func(fd, size int) string {
		m, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err == nil {
			unix.Munmap(m)
		}
		return errName(unwrapErrno(err))
	}
	rep.EngineWritable = writable(h.FDs[4], 4096)
	if s, err := rc.call(Request{Op: OpSocket}); err == nil && len(s.FDs) == 1 {
		rep.RxMapWritable = writable(s.FDs[0], int(h.W[0]))
		closeFDs(s.FDs)
	}
}

// attackNoRead floods requests without reading a reply: the daemon must drop it (within its
// reply timeout) rather than block on it. True when the daemon closed the connection.
func attackNoRead(sock string) bool {
	c, err := Dial(sock, 0, 0)
	if err != nil {
		return false
	}
	defer c.Close()
	fd := c.connFD
	unix.SetNonblock(fd, true)
	msg := (&Request{Op: OpGetName, SID: 1 << 20}).marshal()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := unix.Write(fd, msg); err != nil && err != unix.EAGAIN {
			return true // EPIPE/ECONNRESET: dropped
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		if n, _ := unix.Poll(fds, 1); n > 0 && fds[0].Revents&(unix.POLLHUP|unix.POLLRDHUP) != 0 {
			return true
		}
	}
	return false
}

func unwrapErrno(err error) error {
	for e := err; e != nil; {
		if x, ok := e.(unix.Errno); ok {
			return x
		}
		u, ok := e.(interface{ Unwrap() error })
		if !ok {
			break
		}
		e = u.Unwrap()
	}
	if err != nil && strings.Contains(err.Error(), "EAGAIN") {
		return unix.EAGAIN
	}
	return err
}
