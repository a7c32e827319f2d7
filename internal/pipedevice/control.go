package pipedevice

import (
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The connection table: sockets, binding, connections, closing and reclaiming. Everything here
// runs with d.mu held unless it says otherwise, and touches client-writable memory only with
// single atomic stores into the client's control pages (populated and sealed against hole
// punching, so a store cannot fault or block); no loop here is driven by what a client wrote.

func (d *Daemon) socket(p *proc) Reply {
	sid := p.freeSID()
	if sid < 0 {
		d.refused.Add(1)
		return errReply(unix.EMFILE)
	}
	s, e := d.newSock(p, p.id.ns, sid)
	if e != 0 {
		return errReply(e)
	}
	s.setState(SockActive)
	huge := uint32(0)
	if s.rx.Huge {
		huge = 1
	}
	return Reply{SID: uint32(sid), V: [6]uint32{huge}, W: [2]uint64{uint64(s.R)}, FDs: []int{s.rx.FD}}
}

// newSock makes socket sid of p, its receive ring charged to namespace payer.
func (d *Daemon) newSock(p *proc, payer string, sid int) (*sock, unix.Errno) {
	if e := d.charge(payer, 1, int64(p.ring)); e != 0 {
		return nil, e
	}
	pages := p.ring / hugePage
	rx, err := NewMemfd(fmt.Sprintf("prg-pd-rx-%d-%d", p.cid, sid), p.ring, d.hugeOK(payer, pages))
	if err == nil && !d.cfg.Direct {
		// engine mode: only the engine writes a receive ring; sealed before anyone else has it
		if err = rx.SealWrites(); err != nil {
			rx.Close()
		}
	}
	if err != nil {
		d.uncharge(payer, 1, int64(p.ring), 0)
		return nil, unix.ENOMEM
	}
	if rx.Huge {
		d.ringsHuge.Add(1)
		d.addHuge(payer, pages)
	} else {
		d.ringsNormal.Add(1)
		pages = 0
	}
	d.ringsLive.Add(1)
	off := p.lay.SockOff(sid)
	s := &sock{p: p, sid: uint32(sid), hdr: p.ctl.Mem[off : off+SockHdrSize], rx: rx, R: uint64(p.ring), payer: payer, huge: pages}
	clear(s.hdr)
	p.socks[sid].Store(s)
	p.nsocks++
	return s, 0
}

func (d *Daemon) bind(p *proc, s *sock, a [4]byte, port uint16, v nsView) Reply {
	d.remember(p, v)
	if s.state() != SockActive || s.bound {
		return errReply(unix.EINVAL)
	}
	ip := netip.AddrFrom4(a)
	if !d.addrOK(p, ip) {
		return errReply(unix.EADDRNOTAVAIL)
	}
	if port == 0 {
		port = d.ephemeral(p.id.ns, a)
		if port == 0 {
			return errReply(unix.EADDRINUSE)
		}
	}
	k := bindKey{p.id.ns, a, port}
	if d.bound[k] != nil || (a != [4]byte{} && d.bound[bindKey{p.id.ns, [4]byte{}, port}] != nil) {
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

func (d *Daemon) listen(s *sock, backlog int, v nsView) Reply {
	if !s.bound || (s.state() != SockActive && s.state() != SockListen) {
		return errReply(unix.EINVAL)
	}
	if backlog <= 0 || backlog > 65535 {
		backlog = 4096
	}
	s.backlogMax = backlog
	s.setState(SockListen)
	d.remember(s.p, v)
	return Reply{}
}

// connect makes the server's end of the connection in the listener's table, both ends charged
// to the connector's namespace: a connect flood spends the attacker's quota, and it can hold at
// most PendingPerProc of the listener's socket ids (and half of a backlog when it comes from
// another namespace), so the victim keeps ids of its own and room for other callers.
func (d *Daemon) connect(p *proc, s *sock, a [4]byte, port uint16) Reply {
	switch s.state() {
	case SockConnected, SockPeerClosed:
		return errReply(unix.EISCONN)
	case SockActive:
	default:
		return errReply(unix.EINVAL)
	}
	l, errno := d.findListener(p, a, port)
	if l == nil {
		return errReply(errno)
	}
	lp := l.p
	if len(l.backlog) >= l.backlogMax || lp.pending >= d.cfg.Limits.PendingPerProc ||
		(lp.id.ns != p.id.ns && l.pendingFrom[p.id.ns] >= max(l.backlogMax/2, 1)) {
		d.refused.Add(1)
		return errReply(unix.ECONNREFUSED)
	}
	sid := lp.freeSID()
	if sid < 0 {
		return errReply(unix.ECONNREFUSED)
	}
	srv, e := d.newSock(lp, p.id.ns, sid)
	if e != 0 {
		return errReply(e)
	}
	if !s.bound {
		src := a
		if !netip.AddrFrom4(a).IsLoopback() {
			if addrs := d.nsAddrs[p.id.ns]; len(addrs) > 0 {
				src = addrs[0].As4()
			}
		}
		s.addr = netip.AddrPortFrom(netip.AddrFrom4(src), d.ephemeral(p.id.ns, src))
	}
	srv.addr = netip.AddrPortFrom(netip.AddrFrom4(a), port)
	srv.peerAddr, s.peerAddr = s.addr, srv.addr
	srv.pending = true
	srv.from = p.id.ns
	lp.pending++
	if l.pendingFrom == nil {
		l.pendingFrom = map[string]int{}
	}
	l.pendingFrom[p.id.ns]++
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

// unpend takes c out of listener l's accounting of waiting connections.
func (d *Daemon) unpend(l, c *sock) {
	c.pending = false
	c.p.pending--
	if l.pendingFrom[c.from]--; l.pendingFrom[c.from] <= 0 {
		delete(l.pendingFrom, c.from)
	}
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
	d.unpend(l, s)
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
// The post goes into the client's own queue, so it happens without d.mu: a client whose queue
// is full or corrupt delays only its own pd_close (by at most a second), never anyone else.
func (d *Daemon) closeSock(p *proc, r Request) Reply {
	d.mu.Lock()
	s := p.sock(int(r.SID))
	if s == nil || s.closing.Load() || s.pending {
		d.mu.Unlock()
		return errReply(unix.EBADF)
	}
	s.closing.Store(true)
	// The address is free again at once (a restarted server must not see EADDRINUSE while the
	// ring waits for the engines to let go).
	if s.bound && d.bound[s.key] == s {
		delete(d.bound, s.key)
	}
	if s.state() == SockListen || s.state() == SockActive {
		for _, c := range s.backlog {
			c.closing.Store(true)
			d.unpend(s, c)
			d.detach(c)
			d.toReclaim(c)
		}
		s.backlog = nil
		d.detach(s)
		d.toReclaim(s)
		d.mu.Unlock()
		return Reply{}
	}
	d.mu.Unlock()
	q := int(r.A0)
	if q < 0 || q >= p.lay.NQ {
		q = 0
	}
	e := Entry{Type: ReqClose, ConnID: uint16(s.sid), CID: p.cid}
	deadline := time.Now().Add(time.Second)
	for !p.sqs[q].Push(e) {
		if time.Now().After(deadline) {
			// The process does not let its queue drain: close without ordering.
			d.mu.Lock()
			d.detach(s)
			d.mu.Unlock()
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
			s.p.nsocks--
		}
		d.uncharge(s.payer, 1, int64(s.R), s.huge)
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

// dropProc reclaims everything of a client that went away (crash, exit, or dropped): its
// connections end (peers see the end of stream), its rings and queues are unmapped once the
// engines let go.
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
			d.unpend(s, c)
			d.detach(c)
		}
		d.detach(s)
		if s.bound && d.bound[s.key] == s {
			delete(d.bound, s.key)
		}
	}
	d.mu.Unlock()
	for _, e := range d.engines {
		unix.EpollCtl(e.epfd, unix.EPOLL_CTL_DEL, p.doorbell, nil)
	}
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
	d.uncharge(p.id.ns, 0, p.charged, p.hugeCharged())
	d.mu.Unlock()
	p.close()
}

// Status is what `peregrine pd status` shows.
type Status struct {
	Socket        string           `json:"socket"`
	Mode          string           `json:"mode"`
	Engines       []int            `json:"engine_cpus"`
	RingBytes     int              `json:"ring_bytes"`
	PoolBytes     int              `json:"pool_bytes"`
	RingsHuge     int64            `json:"rings_hugepage"`
	RingsNormal   int64            `json:"rings_normal_pages"`
	RingsLive     int64            `json:"rings_live"`
	Hugepages     string           `json:"hugepages"`
	BytesCopied   uint64           `json:"bytes_copied"`
	BytesPublish  uint64           `json:"bytes_published_in_place"`
	Entries       uint64           `json:"entries"`
	FailedEntries uint64           `json:"failed_entries"`
	InternalErrs  uint64           `json:"internal_errors"`
	Dropped       uint64           `json:"clients_dropped"`
	Refused       uint64           `json:"requests_refused_by_limits"`
	Limits        Limits           `json:"limits"`
	Usage         map[string]usage `json:"namespaces"`
	Clients       []ClientState    `json:"clients"`
	Note          string           `json:"note,omitempty"`
}

// ClientState is one connected process.
type ClientState struct {
	PID     int    `json:"pid"`
	Netns   string `json:"netns"`
	Sockets int    `json:"sockets"`
}

// Status snapshots the daemon (everything: for the daemon's own use and root).
func (d *Daemon) Status() Status { return d.status("") }

// status: with onlyNS set, the clients and usage of that namespace only.
func (d *Daemon) status(onlyNS string) Status {
	st := Status{Socket: d.cfg.Socket, Mode: "engine", Engines: d.cfg.EngineCPUs, RingBytes: d.cfg.Ring, PoolBytes: d.cfg.Pool,
		RingsHuge: d.ringsHuge.Load(), RingsNormal: d.ringsNormal.Load(), RingsLive: d.ringsLive.Load(), BytesCopied: d.bytesMoved.Load(),
		BytesPublish: d.published.Load(), Entries: d.entries.Load(), FailedEntries: d.failed.Load(), InternalErrs: d.internalErrors.Load(),
		Dropped: d.dropped.Load(), Refused: d.refused.Load(), Limits: d.cfg.Limits, Usage: map[string]usage{}}
	if d.cfg.Direct {
		st.Mode = "direct"
	}
	if onlyNS != "" {
		st.Note = "only this client's namespace is shown (root sees all)"
	}
	st.Hugepages = hugepageNote()
	d.mu.Lock()
	for ns, u := range d.usage {
		if onlyNS == "" || ns == onlyNS {
			st.Usage[ns] = *u
		}
	}
	for p := range d.procs {
		if onlyNS == "" || p.id.ns == onlyNS {
			st.Clients = append(st.Clients, ClientState{PID: p.id.pid, Netns: p.id.ns, Sockets: p.nsocks})
		}
	}
	d.mu.Unlock()
	return st
}

func hugepageNote() string {
	b, err := os.ReadFile("/proc/sys/vm/nr_hugepages")
	if err != nil {
		return "unknown"
	}
	n := strings.TrimSpace(string(b))
	if n == "0" {
		return "none reserved (vm.nr_hugepages=0): rings fall back to normal pages; reserve with sysctl vm.nr_hugepages=N"
	}
	return "vm.nr_hugepages=" + n + " (2 MiB); rings that are a multiple of 2 MiB use them while free ones last (and the namespace's quota allows)"
}
