package pipedevice

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultSocket is where the daemon listens unless told otherwise.
const DefaultSocket = "/run/peregrine/pd.sock"

// Config of a daemon.
type Config struct {
	Socket     string
	EngineCPUs []int // one engine thread per CPU, pinned; empty: one unpinned engine
	Direct     bool  // --mode direct: senders write into the peer's ring, pd_send publishes a descriptor
	Ring       int   // default receive ring per socket (bytes, power of two)
	Pool       int   // default send ring (pd_malloc pool) per process
	Spin       time.Duration
	QDepth     int
	MaxSock    int
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
	if c.MaxSock == 0 {
		c.MaxSock = DefaultMaxSock
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
	nextPort   uint16
	procList   atomic.Pointer[[]*proc] // what the engines poll (copy on write)
	engines    []*engine
	doorbell   int
	engPage    *Memfd
	reclaimMu  sync.Mutex
	reclaimQ   []*sock
	reclaimSig chan struct{}
	done       chan struct{}
	wg         sync.WaitGroup
	closeOnce  sync.Once

	ringsHuge, ringsNormal atomic.Int64
	ringsLive              atomic.Int64
	bytesMoved, published  atomic.Uint64
	entries, failed        atomic.Uint64
	internalErrors         atomic.Uint64
}

type bindKey struct {
	ns   string
	ip   [4]byte
	port uint16
}

// NewDaemon listens on cfg.Socket and starts the engines; Serve runs the control loop.
func NewDaemon(cfg Config) (*Daemon, error) {
	cfg.defaults()
	if cfg.Ring&(cfg.Ring-1) != 0 || cfg.Ring < 4096 {
		return nil, fmt.Errorf("ring size %d: want a power of two >= 4096", cfg.Ring)
	}
	if cfg.Pool&(cfg.Pool-1) != 0 || cfg.Pool < 4096 {
		return nil, fmt.Errorf("pool size %d: want a power of two >= 4096", cfg.Pool)
	}
	if err := os.MkdirAll(filepath.Dir(cfg.Socket), 0o755); err != nil {
		return nil, err
	}
	if c, err := net.Dial("unixpacket", cfg.Socket); err == nil {
		c.Close()
		return nil, fmt.Errorf("a daemon already serves %s", cfg.Socket)
	}
	os.Remove(cfg.Socket)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: cfg.Socket, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	// Containers run as any user; access control is per network namespace, not by file mode.
	os.Chmod(cfg.Socket, 0o666)
	db, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		ln.Close()
		return nil, err
	}
	page, err := NewMemfd("prg-pd-engine", 4096, false)
	if err != nil {
		ln.Close()
		unix.Close(db)
		return nil, err
	}
	d := &Daemon{cfg: cfg, ln: ln, procs: map[*proc]bool{}, bound: map[bindKey]*sock{}, nsAddrs: map[string][]netip.Addr{},
		nextPort: 32768, doorbell: db, engPage: page, reclaimSig: make(chan struct{}, 1), done: make(chan struct{}), nextCID: 1}
	d.procList.Store(&[]*proc{})
	n := len(cfg.EngineCPUs)
	if n == 0 {
		n = 1
	}
	for i := 0; i < n; i++ {
		cpu := -1
		if i < len(cfg.EngineCPUs) {
			cpu = cfg.EngineCPUs[i]
		}
		e := &engine{d: d, idx: i, n: n, cpu: cpu}
		d.engines = append(d.engines, e)
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
		unix.Close(d.doorbell)
		d.engPage.Close()
	})
}

func (d *Daemon) wakeEngines() {
	var one [8]byte
	one[0] = 1
	unix.Write(d.doorbell, one[:])
}

func (d *Daemon) serveConn(c *net.UnixConn) {
	defer d.wg.Done()
	var p *proc
	defer func() {
		c.Close()
		if p != nil {
			d.dropProc(p)
		}
	}()
	buf := make([]byte, 512)
	for {
		n, _, _, _, err := c.ReadMsgUnix(buf, nil)
		if err != nil || n == 0 {
			return
		}
		req, err := parseRequest(buf[:n])
		var rep Reply
		if err != nil {
			rep.Err = uint32(unix.EINVAL)
		} else if rep, err = d.safeHandle(c, &p, req); err != nil {
			stderrf("pd daemon: dropping client (pid %d): %v", pidOf(p), err)
			return
		}
		var oob []byte
		if len(rep.FDs) > 0 {
			oob = unix.UnixRights(rep.FDs...)
		}
		if _, _, err := c.WriteMsgUnix(rep.marshal(), oob, nil); err != nil {
			return
		}
	}
}

func errReply(e unix.Errno) Reply { return Reply{Err: uint32(e)} }

// safeHandle is the last line of defence: a bug that panics on some request drops that client
// (its memory is reclaimed as after a crash) and is counted; the daemon and everyone else go on.
func (d *Daemon) safeHandle(c *net.UnixConn, pp **proc, r Request) (rep Reply, err error) {
	defer func() {
		if x := recover(); x != nil {
			d.internalErrors.Add(1)
			err = fmt.Errorf("internal error on op %d: %v", r.Op, x)
		}
	}()
	return d.handle(c, pp, r), nil
}

func pidOf(p *proc) int {
	if p == nil {
		return 0
	}
	return p.pid
}

func stderrf(format string, a ...any) { fmt.Fprintf(os.Stderr, format+"\n", a...) }

// handle runs one control request; it never panics on bad input: every field is checked.
func (d *Daemon) handle(c *net.UnixConn, pp **proc, r Request) Reply {
	if r.Op == OpStatus {
		b, _ := json.Marshal(d.Status())
		return Reply{Body: b}
	}
	if r.Op == OpHello {
		if *pp != nil {
			return errReply(unix.EALREADY)
		}
		p, rep := d.hello(c, r)
		*pp = p
		return rep
	}
	p := *pp
	if p == nil {
		return errReply(unix.ENOTCONN) // pd_init first
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	switch r.Op {
	case OpSocket:
		return d.socket(p)
	case OpBind, OpListen, OpAccept, OpConnect, OpClose, OpGetName:
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
		return d.bind(p, s, r.Addr, r.Port)
	case OpListen:
		return d.listen(s, int(r.A0))
	case OpAccept:
		return d.accept(p, s)
	case OpConnect:
		return d.connect(p, s, r.Addr, r.Port)
	case OpGetName:
		if !s.peerAddr.IsValid() {
			return errReply(unix.ENOTCONN)
		}
		return Reply{Addr: s.peerAddr.Addr().As4(), Port: s.peerAddr.Port(), SID: s.sid}
	default: // OpClose
		return d.closeSock(p, s, int(r.A0))
	}
}

func (d *Daemon) hello(c *net.UnixConn, r Request) (*proc, Reply) {
	pid, ns, err := peerNetns(c)
	if err != nil {
		return nil, errReply(unix.EACCES)
	}
	ring, pool := d.cfg.Ring, d.cfg.Pool
	if r.A0 != 0 {
		ring = int(r.A0)
	}
	if r.A1 != 0 {
		pool = int(r.A1)
	}
	depth := d.cfg.QDepth
	if r.A2 != 0 {
		depth = int(r.A2)
	}
	if ring&(ring-1) != 0 || ring < 4096 || ring > 1<<30 || pool&(pool-1) != 0 || pool < 4096 || pool > 1<<30 ||
		depth&(depth-1) != 0 || depth < 64 || depth > 65536 {
		return nil, errReply(unix.EINVAL)
	}
	d.mu.Lock()
	cid := d.nextCID
	d.nextCID++
	if d.nextCID == 0 {
		d.nextCID = 1
	}
	d.mu.Unlock()
	p, err := newProc(d, c, cid, pid, ns, ring, pool, depth)
	if err != nil {
		return nil, errReply(unix.ENOMEM)
	}
	d.mu.Lock()
	d.procs[p] = true
	d.refreshAddrs(p)
	d.publishProcs()
	d.mu.Unlock()
	mode := uint32(0)
	if d.cfg.Direct {
		mode = 1
	}
	huge := uint32(0)
	if p.pool.Huge {
		huge = 1
	}
	return p, Reply{SID: uint32(cid), V: [6]uint32{mode, uint32(p.lay.NQ), uint32(p.lay.QDepth), uint32(p.lay.MaxSock), huge, uint32(len(d.engines))},
		W: [2]uint64{uint64(ring), uint64(pool)}, FDs: []int{p.ctl.FD, p.pool.FD, d.doorbell, p.notify, d.engPage.FD}}
}

// publishProcs gives the engines a new list (called with d.mu held).
func (d *Daemon) publishProcs() {
	l := make([]*proc, 0, len(d.procs))
	for p := range d.procs {
		if !p.dead.Load() {
			l = append(l, p)
		}
	}
	d.procList.Store(&l)
}

func (d *Daemon) socket(p *proc) Reply {
	sid := p.freeSID()
	if sid < 0 {
		return errReply(unix.EMFILE)
	}
	s, err := d.newSock(p, sid)
	if err != nil {
		return errReply(unix.ENOMEM)
	}
	s.setState(SockActive)
	huge := uint32(0)
	if s.rx.Huge {
		huge = 1
	}
	return Reply{SID: uint32(sid), V: [6]uint32{huge}, W: [2]uint64{uint64(s.R)}, FDs: []int{s.rx.FD}}
}

func (d *Daemon) newSock(p *proc, sid int) (*sock, error) {
	rx, err := NewMemfd(fmt.Sprintf("prg-pd-rx-%d-%d", p.cid, sid), p.ring, true)
	if err != nil {
		return nil, err
	}
	if rx.Huge {
		d.ringsHuge.Add(1)
	} else {
		d.ringsNormal.Add(1)
	}
	d.ringsLive.Add(1)
	off := p.lay.SockOff(sid)
	s := &sock{p: p, sid: uint32(sid), hdr: p.ctl.Mem[off : off+SockHdrSize], rx: rx, R: uint64(p.ring)}
	clear(s.hdr)
	p.socks[sid].Store(s)
	return s, nil
}

// addrOK: a caller binds only 0.0.0.0, loopback, or an address of its own network namespace.
func (d *Daemon) addrOK(p *proc, ip netip.Addr) bool {
	if ip.IsUnspecified() || ip.IsLoopback() {
		return true
	}
	d.refreshAddrs(p)
	for _, a := range d.nsAddrs[p.ns] {
		if a == ip {
			return true
		}
	}
	return false
}

func (d *Daemon) bind(p *proc, s *sock, a [4]byte, port uint16) Reply {
	if s.state() != SockActive || s.bound {
		return errReply(unix.EINVAL)
	}
	ip := netip.AddrFrom4(a)
	if !d.addrOK(p, ip) {
		return errReply(unix.EADDRNOTAVAIL)
	}
	if port == 0 {
		port = d.ephemeral(p.ns, a)
		if port == 0 {
			return errReply(unix.EADDRINUSE)
		}
	}
	k := bindKey{p.ns, a, port}
	if d.bound[k] != nil || (a != [4]byte{} && d.bound[bindKey{p.ns, [4]byte{}, port}] != nil) {
		return errReply(unix.EADDRINUSE)
	}
	d.bound[k] = s
	s.bound, s.key = true, k
	s.addr = netip.AddrPortFrom(ip, port)
	return Reply{Port: port}
}

func (d *Daemon) ephemeral(ns string, a [4]byte) uint16 {
	for i := 0; i < 28232; i++ {
		port := d.nextPort
		d.nextPort++
		if d.nextPort == 0 || d.nextPort < 32768 {
			d.nextPort = 32768
		}
		if d.bound[bindKey{ns, a, port}] == nil && d.bound[bindKey{ns, [4]byte{}, port}] == nil {
			return port
		}
	}
	return 0
}

func (d *Daemon) listen(s *sock, backlog int) Reply {
	if !s.bound || (s.state() != SockActive && s.state() != SockListen) {
		return errReply(unix.EINVAL)
	}
	if backlog <= 0 || backlog > 65535 {
		backlog = 4096
	}
	s.backlogMax = backlog
	s.setState(SockListen)
	return Reply{}
}

func (d *Daemon) findListener(p *proc, a [4]byte, port uint16) *sock {
	ip := netip.AddrFrom4(a)
	try := func(ns string) *sock {
		if l := d.bound[bindKey{ns, a, port}]; l != nil && l.state() == SockListen {
			return l
		}
		if l := d.bound[bindKey{ns, [4]byte{}, port}]; l != nil && l.state() == SockListen {
			return l
		}
		return nil
	}
	if ip.IsLoopback() || ip.IsUnspecified() {
		return try(p.ns)
	}
	for ns, addrs := range d.nsAddrs {
		for _, x := range addrs {
			if x == ip {
				if l := try(ns); l != nil {
					return l
				}
			}
		}
	}
	return nil
}

func (d *Daemon) connect(p *proc, s *sock, a [4]byte, port uint16) Reply {
	switch s.state() {
	case SockConnected, SockPeerClosed:
		return errReply(unix.EISCONN)
	case SockActive:
	default:
		return errReply(unix.EINVAL)
	}
	l := d.findListener(p, a, port)
	if l == nil || len(l.backlog) >= l.backlogMax {
		return errReply(unix.ECONNREFUSED)
	}
	lp := l.p
	sid := lp.freeSID()
	if sid < 0 {
		return errReply(unix.ECONNREFUSED)
	}
	srv, err := d.newSock(lp, sid)
	if err != nil {
		return errReply(unix.ENOMEM)
	}
	if !s.bound {
		src := a
		if !netip.AddrFrom4(a).IsLoopback() {
			if addrs := d.nsAddrs[p.ns]; len(addrs) > 0 {
				src = addrs[0].As4()
			}
		}
		s.addr = netip.AddrPortFrom(netip.AddrFrom4(src), d.ephemeral(p.ns, src))
	}
	srv.addr = netip.AddrPortFrom(netip.AddrFrom4(a), port)
	srv.peerAddr, s.peerAddr = s.addr, srv.addr
	srv.pending = true
	// Both rings are empty: each side may send a whole ring before the first release.
	store64(s.hdr, ShTxLimit, srv.R)
	store64(srv.hdr, ShTxLimit, s.R)
	srv.peer.Store(s)
	s.peer.Store(srv)
	srv.setState(SockConnected)
	s.setState(SockConnected)
	l.backlog = append(l.backlog, srv)
	store32(l.hdr, ShPending, uint32(len(l.backlog)))
	lp.wake()
	rep := Reply{Addr: s.addr.Addr().As4(), Port: s.addr.Port()}
	if d.cfg.Direct {
		rep.FDs = []int{srv.rx.FD}
	}
	return rep
}

func (d *Daemon) accept(p *proc, l *sock) Reply {
	if l.state() != SockListen {
		return errReply(unix.EINVAL)
	}
	if len(l.backlog) == 0 {
		return errReply(unix.EAGAIN)
	}
	s := l.backlog[0]
	l.backlog = l.backlog[1:]
	store32(l.hdr, ShPending, uint32(len(l.backlog)))
	s.pending = false
	rep := Reply{SID: s.sid, Addr: s.peerAddr.Addr().As4(), Port: s.peerAddr.Port(), W: [2]uint64{s.R}, FDs: []int{s.rx.FD}}
	if d.cfg.Direct {
		if peer := s.peer.Load(); peer != nil {
			rep.FDs = append(rep.FDs, peer.rx.FD)
			rep.V[0] = 1
		}
	}
	return rep
}

// closeSock: a listening socket resets its pending connections at once; a connected one posts a
// close entry behind the entries it already queued, so the peer sees all data before the end.
func (d *Daemon) closeSock(p *proc, s *sock, q int) Reply {
	s.closing.Store(true)
	// The address is free again at once (a restarted server must not see EADDRINUSE while the
	// ring waits for the engines to let go).
	if s.bound && d.bound[s.key] == s {
		delete(d.bound, s.key)
	}
	if s.state() == SockListen {
		for _, c := range s.backlog {
			c.closing.Store(true)
			d.detach(c)
			d.toReclaim(c)
		}
		s.backlog = nil
		d.detach(s)
		d.toReclaim(s)
		return Reply{}
	}
	if q < 0 || q >= p.lay.NQ {
		q = 0
	}
	e := Entry{Type: ReqClose, ConnID: uint16(s.sid), CID: p.cid}
	deadline := time.Now().Add(time.Second)
	for !p.sqs[q].Push(e) {
		if time.Now().After(deadline) {
			// The process does not let its queue drain: close without ordering.
			d.detach(s)
			d.toReclaim(s)
			return Reply{}
		}
		d.wakeEngines()
		time.Sleep(100 * time.Microsecond)
	}
	d.wakeEngines()
	return Reply{}
}

// detach cuts s from its peer (the peer sees the end of the stream) and unbinds it.
func (d *Daemon) detach(s *sock) {
	s.setState(SockClosed)
	if peer := s.peer.Swap(nil); peer != nil {
		if peer.peer.CompareAndSwap(s, nil) && peer.state() == SockConnected {
			peer.setState(SockPeerClosed)
		}
		peer.p.wake()
	}
}

// toReclaim queues s for freeing; it never blocks (the engine calls it).
func (d *Daemon) toReclaim(s *sock) {
	d.reclaimMu.Lock()
	d.reclaimQ = append(d.reclaimQ, s)
	d.reclaimMu.Unlock()
	select {
	case d.reclaimSig <- struct{}{}:
	default:
	}
}

// reclaimer frees sockets once no engine can still hold a pointer to them.
func (d *Daemon) reclaimer() {
	defer d.wg.Done()
	for {
		stop := false
		select {
		case <-d.reclaimSig:
		case <-d.done:
			stop = true
		}
		d.reclaimMu.Lock()
		batch := d.reclaimQ
		d.reclaimQ = nil
		d.reclaimMu.Unlock()
		if !stop {
			d.quiesce()
		}
		for _, s := range batch {
			d.free(s)
		}
		if stop {
			return
		}
	}
}

func (d *Daemon) free(s *sock) {
	s.freeOnce.Do(func() {
		d.mu.Lock()
		if s.bound && d.bound[s.key] == s {
			delete(d.bound, s.key)
		}
		if !s.p.unmapped && s.p.socks[s.sid].CompareAndSwap(s, nil) {
			clear(s.hdr)
		}
		d.mu.Unlock()
		s.rx.Close()
		d.ringsLive.Add(-1)
	})
}

// quiesce waits until every engine finished the pass it was in (or sleeps).
func (d *Daemon) quiesce() {
	marks := make([]uint64, len(d.engines))
	for i, e := range d.engines {
		marks[i] = e.pass.Load()
	}
	d.wakeEngines()
	for i, e := range d.engines {
		for e.pass.Load() == marks[i] && !e.stopped.Load() {
			if e.idle.Load() && e.pass.Load() == marks[i] {
				// an idle engine holds no pointers; but it may wake any moment: let it finish a pass
				d.wakeEngines()
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
}

// dropProc reclaims everything of a client that went away (crash or exit): its connections end
// (peers see the end of stream), its rings and queues are unmapped once the engines let go.
func (d *Daemon) dropProc(p *proc) {
	p.dead.Store(true)
	d.mu.Lock()
	delete(d.procs, p)
	d.publishProcs()
	var all []*sock
	for i := range p.socks {
		if s := p.socks[i].Load(); s != nil {
			all = append(all, s)
		}
	}
	for _, s := range all {
		s.closing.Store(true)
		for _, c := range s.backlog {
			d.detach(c)
		}
		d.detach(s)
		if s.bound && d.bound[s.key] == s {
			delete(d.bound, s.key)
		}
	}
	d.mu.Unlock()
	d.quiesce()
	for _, s := range all {
		for _, c := range s.backlog {
			if c.p != p {
				d.free(c)
			}
		}
		d.free(s)
	}
	d.mu.Lock()
	p.unmapped = true
	d.mu.Unlock()
	p.close()
}

// refreshAddrs caches the IPv4 addresses of p's network namespace (d.mu held).
func (d *Daemon) refreshAddrs(p *proc) {
	addrs, err := nsAddrs(p.pid)
	if err == nil {
		d.nsAddrs[p.ns] = addrs
	}
}

// Status is what `peregrine pd status` shows.
type Status struct {
	Socket        string        `json:"socket"`
	Mode          string        `json:"mode"`
	Engines       []int         `json:"engine_cpus"`
	RingBytes     int           `json:"ring_bytes"`
	PoolBytes     int           `json:"pool_bytes"`
	RingsHuge     int64         `json:"rings_hugepage"`
	RingsNormal   int64         `json:"rings_normal_pages"`
	RingsLive     int64         `json:"rings_live"`
	Hugepages     string        `json:"hugepages"`
	BytesCopied   uint64        `json:"bytes_copied"`
	BytesPublish  uint64        `json:"bytes_published_in_place"`
	Entries       uint64        `json:"entries"`
	FailedEntries uint64        `json:"failed_entries"`
	InternalErrs  uint64        `json:"internal_errors"`
	Clients       []ClientState `json:"clients"`
}

// ClientState is one connected process.
type ClientState struct {
	PID     int    `json:"pid"`
	Netns   string `json:"netns"`
	Sockets int    `json:"sockets"`
}

// Status snapshots the daemon.
func (d *Daemon) Status() Status {
	st := Status{Socket: d.cfg.Socket, Mode: "engine", Engines: d.cfg.EngineCPUs, RingBytes: d.cfg.Ring, PoolBytes: d.cfg.Pool,
		RingsHuge: d.ringsHuge.Load(), RingsNormal: d.ringsNormal.Load(), RingsLive: d.ringsLive.Load(), BytesCopied: d.bytesMoved.Load(),
		BytesPublish: d.published.Load(), Entries: d.entries.Load(), FailedEntries: d.failed.Load(), InternalErrs: d.internalErrors.Load()}
	if d.cfg.Direct {
		st.Mode = "direct"
	}
	st.Hugepages = hugepageNote()
	d.mu.Lock()
	for p := range d.procs {
		n := 0
		for i := range p.socks {
			if p.socks[i].Load() != nil {
				n++
			}
		}
		st.Clients = append(st.Clients, ClientState{PID: p.pid, Netns: p.ns, Sockets: n})
	}
	d.mu.Unlock()
	return st
}

func hugepageNote() string {
	b, err := os.ReadFile("/proc/sys/vm/nr_hugepages")
	if err != nil {
		return "unknown"
	}
	n := string(b)
	for len(n) > 0 && (n[len(n)-1] == '\n') {
		n = n[:len(n)-1]
	}
	if n == "0" {
		return "none reserved (vm.nr_hugepages=0): rings fall back to normal pages; reserve with sysctl vm.nr_hugepages=N"
	}
	return "vm.nr_hugepages=" + n + " (2 MiB); rings that are a multiple of 2 MiB use them while free ones last"
}
