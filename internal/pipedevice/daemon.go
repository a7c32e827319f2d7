package pipedevice

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Config of a daemon.
type Config struct {
	Socket     string
	EngineCPUs []int // one engine thread per CPU, pinned; empty: one unpinned engine
	Direct     bool  // --mode direct: senders write into the peer's ring, pd_send publishes a descriptor
	Ring       int   // default receive ring per socket (bytes, power of two)
	Pool       int   // default send ring (pd_malloc pool) per process
	Spin       time.Duration
	QDepth     int
	Limits     Limits
}

func (c *Config) defaults() {
	if c.Socket == "" {
		c.Socket = DefaultSocket
	}
	if c.Ring == 0 {
		c.Ring = DefaultRing
	}
	if c.Pool == 0 {
		c.Pool = DefaultPool
	}
	if c.Spin == 0 {
		c.Spin = 50 * time.Microsecond
	}
	if c.QDepth == 0 {
		c.QDepth = DefaultQDepth
	}
	c.Limits.defaults()
	if c.QDepth > c.Limits.MaxQDepth {
		c.QDepth = c.Limits.MaxQDepth
	}
}

// Daemon is the PD driver: control server, connection table, memory owner and copy engines.
type Daemon struct {
	cfg Config
	ln  *net.UnixListener

	mu         sync.Mutex
	procs      map[*proc]bool
	nextCID    uint16
	bound      map[bindKey]*sock
	nsAddrs    map[string][]netip.Addr
	domains    map[string][]domainKey
	usage      map[string]*usage
	nextPort   uint16
	procList   atomic.Pointer[[]*proc] // what the engines poll (copy on write)
	engines    []*engine
	doorbell   int // the daemon's own: wakes the engines for closes and reclaims
	engPage    *Memfd
	reclaimMu  sync.Mutex
	reclaimQ   []*sock
	reclaimSig chan struct{}
	done       chan struct{}
	wg         sync.WaitGroup
	closeOnce  sync.Once
	fdLimit    int
	conns      int // control connections (d.mu)

	ringsHuge, ringsNormal atomic.Int64
	ringsLive              atomic.Int64
	bytesMoved, published  atomic.Uint64
	entries, failed        atomic.Uint64
	internalErrors         atomic.Uint64
	dropped, refused       atomic.Uint64
}

type bindKey struct {
	ns   string
	ip   [4]byte
	port uint16
}

// Time limits on control connections: a caller must say hello soon, and must read its replies.
const (
	helloTimeout = 5 * time.Second
	replyTimeout = time.Second
)

// NewDaemon listens on cfg.Socket and starts the engines; Serve runs the control loop.
func NewDaemon(cfg Config) (*Daemon, error) {
	cfg.defaults()
	if cfg.Ring&(cfg.Ring-1) != 0 || cfg.Ring < 4096 {
		return nil, fmt.Errorf("ring size %d: want a power of two >= 4096", cfg.Ring)
	}
	if cfg.Pool&(cfg.Pool-1) != 0 || cfg.Pool < 4096 {
		return nil, fmt.Errorf("pool size %d: want a power of two >= 4096", cfg.Pool)
	}
	if err := cfg.Limits.check(); err != nil {
		return nil, err
	}
	ln, err := listenSocket(cfg.Socket, cfg.Socket == DefaultSocket)
	if err != nil {
		return nil, err
	}
	db, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		ln.Close()
		return nil, err
	}
	// The engines' sleep counter: written only by the daemon, sealed so clients can map it
	// read-only and in no other way (one page shared by all clients, writable by none).
	page, err := NewMemfd("prg-pd-engine", 4096, false)
	if err == nil {
		if err = page.SealWrites(); err != nil {
			page.Close()
		}
	}
	if err != nil {
		ln.Close()
		unix.Close(db)
		return nil, err
	}
	d := &Daemon{cfg: cfg, ln: ln, procs: map[*proc]bool{}, bound: map[bindKey]*sock{}, nsAddrs: map[string][]netip.Addr{},
		domains: map[string][]domainKey{}, usage: map[string]*usage{}, fdLimit: raiseFDLimit(),
		nextPort: 32768, doorbell: db, engPage: page, reclaimSig: make(chan struct{}, 1), done: make(chan struct{}), nextCID: 1}
	d.procList.Store(&[]*proc{})
	n := max(len(cfg.EngineCPUs), 1)
	for i := 0; i < n; i++ {
		cpu := -1
		if i < len(cfg.EngineCPUs) {
			cpu = cfg.EngineCPUs[i]
		}
		e, err := newEngine(d, i, n, cpu)
		if err != nil {
			d.closeEngines()
			ln.Close()
			unix.Close(db)
			page.Close()
			return nil, err
		}
		d.engines = append(d.engines, e)
	}
	for _, e := range d.engines {
		d.wg.Add(1)
		go e.run()
	}
	d.wg.Add(1)
	go d.reclaimer()
	return d, nil
}

// Serve accepts clients until Close.
func (d *Daemon) Serve() error {
	for {
		c, err := d.ln.AcceptUnix()
		if err != nil {
			select {
			case <-d.done:
				return nil
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		d.wg.Add(1)
		go d.serveConn(c)
	}
}

// Close stops accepting, drops every client (their rings and connections are reclaimed), stops
// the engines and removes the socket.
func (d *Daemon) Close() {
	d.closeOnce.Do(func() {
		close(d.done)
		d.ln.Close()
		d.mu.Lock()
		for p := range d.procs {
			p.conn.Close() // serveConn sees EOF and reclaims
		}
		d.mu.Unlock()
		d.wakeEngines()
		d.wg.Wait()
		d.closeEngines()
		unix.Close(d.doorbell)
		d.engPage.Close()
	})
}

func (d *Daemon) closeEngines() {
	for _, e := range d.engines {
		unix.Close(e.epfd)
	}
}

func (d *Daemon) wakeEngines() { ringEventfd(d.doorbell) }

func ringEventfd(fd int) {
	var one [8]byte
	one[0] = 1
	unix.Write(fd, one[:])
}

// serveConn serves one control connection. The caller is identified once, here; its namespace
// pays for the connection from the start, so a flood of connections that never say hello is
// capped like clients are.
func (d *Daemon) serveConn(c *net.UnixConn) {
	defer d.wg.Done()
	defer c.Close()
	id, err := peerIdentity(c)
	if err != nil {
		return
	}
	defer unix.Close(id.nsfd)
	d.mu.Lock()
	u := d.usage[id.ns]
	if u == nil {
		u = &usage{}
		d.usage[id.ns] = u
	}
	// per namespace, and all together: each connection holds two fds (socket and namespace),
	// and namespaces are cheap to make where user namespaces are allowed
	full := u.Conns >= d.cfg.Limits.ClientsPerNS || d.conns >= (d.fdLimit-fdReserve)/8
	if !full {
		u.Conns++
		d.conns++
	}
	d.mu.Unlock()
	if full {
		d.refused.Add(1)
		c.SetDeadline(time.Now().Add(replyTimeout))
		buf := make([]byte, MsgSize)
		if _, _, _, _, err := c.ReadMsgUnix(buf, nil); err == nil {
			c.WriteMsgUnix((&Reply{Err: uint32(unix.EAGAIN)}).marshal(), nil, nil)
		}
		return
	}
	var p *proc
	defer func() {
		if p != nil {
			d.dropProc(p)
		}
		d.mu.Lock()
		if u := d.usage[id.ns]; u != nil {
			u.Conns--
		}
		d.conns--
		d.evictIfIdle(id.ns)
		d.mu.Unlock()
	}()
	buf := make([]byte, 512)
	c.SetReadDeadline(time.Now().Add(helloTimeout))
	for {
		n, _, _, _, err := c.ReadMsgUnix(buf, nil)
		if err != nil || n == 0 {
			return
		}
		req, err := parseRequest(buf[:n])
		var rep Reply
		if err != nil {
			rep.Err = uint32(unix.EINVAL)
		} else if rep, err = d.safeHandle(c, &id, &p, req); err != nil {
			d.drop(p, id, err.Error())
			return
		}
		if p != nil {
			c.SetReadDeadline(time.Time{})
		}
		var oob []byte
		if len(rep.FDs) > 0 {
			oob = unix.UnixRights(rep.FDs...)
		}
		// A client that does not read its replies is dropped, not waited for.
		c.SetWriteDeadline(time.Now().Add(replyTimeout))
		if _, _, err := c.WriteMsgUnix(rep.marshal(), oob, nil); err != nil {
			if p != nil {
				d.drop(p, id, "reply not taken: "+err.Error())
			}
			return
		}
	}
}

// drop logs and counts a client the daemon gives up on (its memory is reclaimed as after a crash).
func (d *Daemon) drop(p *proc, id identity, why string) {
	d.dropped.Add(1)
	stderrf("pd daemon: dropping client pid %d uid %d %s: %s", id.pid, id.uid, id.ns, why)
}

func errReply(e unix.Errno) Reply { return Reply{Err: uint32(e)} }

// safeHandle is the last line of defence: a bug that panics on some request drops that client
// (its memory is reclaimed as after a crash) and is counted; the daemon and everyone else go on.
func (d *Daemon) safeHandle(c *net.UnixConn, id *identity, pp **proc, r Request) (rep Reply, err error) {
	defer func() {
		if x := recover(); x != nil {
			d.internalErrors.Add(1)
			err = fmt.Errorf("internal error on op %d: %v", r.Op, x)
		}
	}()
	return d.handle(c, id, pp, r), nil
}

func stderrf(format string, a ...any) { fmt.Fprintf(os.Stderr, format+"\n", a...) }

// handle runs one control request; it never panics on bad input: every field is checked.
func (d *Daemon) handle(c *net.UnixConn, id *identity, pp **proc, r Request) Reply {
	switch r.Op {
	case OpStatus:
		// Status names other clients' PIDs and namespaces: root sees all, a client (past hello)
		// sees the totals and its own namespace's clients, anyone else nothing.
		if id.uid != 0 && *pp == nil {
			return errReply(unix.EACCES)
		}
		ns := id.ns
		if id.uid == 0 {
			ns = ""
		}
		b, _ := json.Marshal(d.status(ns))
		return Reply{Body: b}
	case OpHello:
		if *pp != nil {
			return errReply(unix.EALREADY)
		}
		p, rep := d.hello(c, id, r)
		*pp = p
		return rep
	}
	p := *pp
	if p == nil {
		return errReply(unix.ENOTCONN) // pd_init first
	}
	if r.Op == OpSeal {
		return d.seal(p, r)
	}
	if !p.sealed.Load() {
		return errReply(unix.ENOTCONN) // pd_init maps and seals its memory before anything else
	}
	if r.Op == OpClose {
		return d.closeSock(p, r)
	}
	var view nsView
	if r.Op == OpBind || r.Op == OpListen {
		view = d.lookNS(p.id.nsfd) // before the lock: see lookNS
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	switch r.Op {
	case OpSocket:
		return d.socket(p)
	case OpBind, OpListen, OpAccept, OpConnect, OpGetName:
	default:
		return errReply(unix.EOPNOTSUPP)
	}
	s := p.sock(int(r.SID))
	if s == nil || s.closing.Load() || s.pending {
		// a connection still in a listener's backlog is not the process's until pd_accept
		return errReply(unix.EBADF)
	}
	switch r.Op {
	case OpBind:
		return d.bind(p, s, r.Addr, r.Port, view)
	case OpListen:
		return d.listen(s, int(r.A0), view)
	case OpAccept:
		return d.accept(p, s)
	case OpConnect:
		return d.connect(p, s, r.Addr, r.Port)
	default: // OpGetName
		if !s.peerAddr.IsValid() {
			return errReply(unix.ENOTCONN)
		}
		return Reply{Addr: s.peerAddr.Addr().As4(), Port: s.peerAddr.Port(), SID: s.sid}
	}
}

func (d *Daemon) hello(c *net.UnixConn, id *identity, r Request) (*proc, Reply) {
	ring, pool, depth := d.cfg.Ring, d.cfg.Pool, d.cfg.QDepth
	if r.A0 != 0 {
		ring = int(r.A0)
	}
	if r.A1 != 0 {
		pool = int(r.A1)
	}
	if r.A2 > 1<<20 {
		return nil, errReply(unix.EINVAL)
	}
	if r.A2 != 0 {
		depth = int(r.A2)
	}
	if ring&(ring-1) != 0 || ring < 4096 || ring > 1<<30 || pool&(pool-1) != 0 || pool < 4096 || pool > 1<<30 ||
		depth&(depth-1) != 0 || depth < 64 {
		return nil, errReply(unix.EINVAL)
	}
	if depth > d.cfg.Limits.MaxQDepth {
		d.refused.Add(1)
		return nil, errReply(unix.ENOBUFS)
	}
	lay := CtlLayout{NQ: len(onlineCPUs()), QDepth: depth, MaxSock: d.cfg.Limits.SocksPerClient}
	bytes := int64(lay.Size() + pool)
	d.mu.Lock()
	if e := d.charge(id.ns, 0, bytes); e != 0 {
		d.mu.Unlock()
		return nil, errReply(e)
	}
	cid := d.nextCID
	d.nextCID++
	if d.nextCID == 0 {
		d.nextCID = 1
	}
	huge := d.hugeOK(id.ns, pool/hugePage)
	d.mu.Unlock()
	p, err := newProc(d, c, *id, cid, ring, lay, pool, huge)
	var view nsView
	if err == nil {
		view = d.lookNS(id.nsfd)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil {
		d.uncharge(id.ns, 0, bytes, 0)
		return nil, errReply(unix.ENOMEM)
	}
	p.charged = bytes
	if p.pool.Huge {
		d.addHuge(id.ns, pool/hugePage)
	}
	d.procs[p] = true
	d.remember(p, view)
	mode := uint32(0)
	if d.cfg.Direct {
		mode = 1
	}
	hugeFlag := uint32(0)
	if p.pool.Huge {
		hugeFlag = 1
	}
	return p, Reply{SID: uint32(cid), V: [6]uint32{mode, uint32(p.lay.NQ), uint32(p.lay.QDepth), uint32(p.lay.MaxSock), hugeFlag, uint32(len(d.engines))},
		W: [2]uint64{uint64(ring), uint64(pool)}, FDs: []int{p.ctl.FD, p.pool.FD, p.doorbell, p.notify, d.engPage.FD}}
}

// seal: A0 == 0, the client mapped its control memory and send pool; A0 == 1, it mapped the peer
// ring of SID (direct mode). The memory is sealed against writable mappings and hole punching and
// then populated again through the daemon's mapping: holes punched before the seal are filled, or,
// with no hugepage left to fill them, the client is refused. Only then does the engine touch it.
func (d *Daemon) seal(p *proc, r Request) Reply {
	var ms []*Memfd
	switch r.A0 {
	case 0:
		if p.sealed.Load() {
			return errReply(unix.EALREADY)
		}
		ms = []*Memfd{p.ctl, p.pool}
	case 1:
		d.mu.Lock()
		s := p.sock(int(r.SID))
		var peer *sock
		if s != nil {
			peer = s.peer.Load()
		}
		d.mu.Unlock()
		if !d.cfg.Direct || peer == nil {
			return errReply(unix.EINVAL)
		}
		if peer.rx.Sealed() {
			return Reply{}
		}
		ms = []*Memfd{peer.rx}
	default:
		return errReply(unix.EINVAL)
	}
	for _, m := range ms {
		if !m.Sealed() {
			if err := m.SealWrites(); err != nil {
				return errReply(unix.EPERM)
			}
		}
		// every time, sealed before or not: a refused seal asked again must not pass unfilled
		if err := unix.Madvise(m.Mem, unix.MADV_POPULATE_WRITE); err != nil {
			return errReply(unix.ENOMEM)
		}
	}
	if r.A0 == 0 {
		p.sealed.Store(true)
		d.mu.Lock()
		d.publishProcs()
		d.mu.Unlock()
	}
	return Reply{}
}

// publishProcs gives the engines a new list of the sealed, live clients (called with d.mu held).
func (d *Daemon) publishProcs() {
	l := make([]*proc, 0, len(d.procs))
	for p := range d.procs {
		if !p.dead.Load() && p.sealed.Load() {
			l = append(l, p)
		}
	}
	d.procList.Store(&l)
}
