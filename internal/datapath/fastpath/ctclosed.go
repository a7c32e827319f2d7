package fastpath

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/datapath/ctnl"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// A short TCP connection (fHsOnly: conntrack saw only its SYN and SYN-ACK) closes on the fast
// path, so conntrack's entry would wait in SYN_RECV for 60 s, and a new connection on the same
// ports (a client's ports wrap within seconds under load) would meet it: its SYN ignored as
// INVALID, dropped by kube-proxy's KUBE-FORWARD, the connection waiting for SYN
// retransmissions. The programs hand each such close over as it happens (closed_push,
// bpf/fastpath_closed.h: a ring buffer, one record per connection, the CPU that completed the
// close pushes it), and the agent deletes the entries: it drains the ring continuously and
// sends the deletes in batches (closedBatchWait, closedBatchMax) to every namespace whose
// conntrack the overlay's traffic crosses. A walk of the flow table once a second used to find
// these connections; it missed some (measured on the k8s lab: 786-1244 SYN_RECV entries left
// after a 4-rep crr run): an entry leaves the table FP_CLOSE_NS after its close, a new
// generation resets its flags and a reused port clears them, before a walk late under load.

const (
	// closedBatchWait bounds how long a closed connection's entry outlives it: well under
	// the time a client takes to reuse its port (seconds at thousands of connections/s with
	// the default port range). A SYN that reuses the port sooner meets the old entry: it
	// passes, ignored, but the server's SYN-ACK is INVALID and the connection waits a second
	// for a retransmission (seen in TestLabClosedLeaveNoConntrack, whose client has 1024
	// ports: about once per 4000 connections at 50 ms). Measured there, the agent's CPU for
	// 4000 connections: 0.14 s at 50 ms, 0.19 s at 10 ms, 0.27 s at 5 ms, 0.4-0.7 s when it
	// reads each record as it comes (a wakeup, a GET and a delete per connection).
	closedBatchWait = 10 * time.Millisecond
	closedBatchMax  = 256
	// closedRecheck is how often a namespace without conntrack is looked at again.
	closedRecheck = 10 * time.Second
)

// sizeofClosed is struct fp_closed (bpf/fastpath_closed.h): local, remote, lport, rport,
// proto, ovl, pad[2], ns; sizeofClosed6 is struct fp_closed6 (bpf/fastpath6.h), the same with
// 16-byte addresses. One ring carries both; a record's length says which it is.
const (
	sizeofClosed  = 24
	sizeofClosed6 = 48
)

// parseClosed reads one ring record: the conntrack tuple of the closed connection (as the
// flow's key holds it), IPv4 or IPv6, and when it closed (CLOCK_MONOTONIC ns); false for a
// record of another length.
func parseClosed(b []byte) (ctnl.Tuple, uint64, bool) {
	switch len(b) {
	case sizeofClosed:
		t := ctTuple{src: binary.NativeEndian.Uint32(b[0:]), dst: binary.NativeEndian.Uint32(b[4:]),
			sport: binary.NativeEndian.Uint16(b[8:]), dport: binary.NativeEndian.Uint16(b[10:]), proto: b[12]}
		return t.nl(), binary.NativeEndian.Uint64(b[16:]), true
	case sizeofClosed6:
		t := ctTuple6{src: words16(b[0:16]), dst: words16(b[16:32]),
			sport: binary.NativeEndian.Uint16(b[32:]), dport: binary.NativeEndian.Uint16(b[34:])}.nl()
		t.Proto = b[36]
		return t, binary.NativeEndian.Uint64(b[40:]), true
	}
	return ctnl.Tuple{}, 0, false
}

// closedStats is what the hand-over did since the last note.
type closedStats struct {
	records, deleted, missing, kept int
	maxLag                          time.Duration
}

// ctDeleter sends conntrack deletes to a set of namespaces, each socket opened once.
type ctDeleter struct {
	nss    []string
	socks  map[string]*ctSock
	absent map[string]time.Time // namespace without conntrack -> when to look again
	failed map[string]bool      // said once
	logf   func(string, ...any)
}

func newCTDeleter(nss []string, logf func(string, ...any)) *ctDeleter {
	return &ctDeleter{nss: nss, socks: map[string]*ctSock{}, absent: map[string]time.Time{}, failed: map[string]bool{}, logf: logf}
}

func (d *ctDeleter) Close() {
	for _, s := range d.socks {
		s.Close()
	}
}

// delete deletes the entries of tuples ts in every namespace and returns how many it deleted,
// how many were gone already and how many it kept, summed over the namespaces. It asks for each
// entry first and deletes that entry only (by its id), unless it is a new connection's, waiting
// for its SYN-ACK (SYN_SENT): a client that reuses its port within the hand-over's delay makes
// a new entry under the same tuple once the old one is gone, and deleting that would make the
// server's SYN-ACK INVALID. The old entry, in SYN_RECV, goes.
func (d *ctDeleter) delete(ts []ctnl.Tuple) (deleted, missing, kept int) {
	for _, ns := range d.nss {
		s := d.socks[ns]
		if s == nil {
			if t, ok := d.absent[ns]; ok && time.Now().Before(t) {
				continue
			}
			if _, err := netnsutil.ReadFileIn(ns, conntrackLiberal); err != nil {
				d.absent[ns] = time.Now().Add(closedRecheck) // no conntrack there (yet)
				continue
			}
			delete(d.absent, ns)
			var err error
			if s, err = openCTSock(ns); err != nil {
				if !d.failed[ns] {
					d.logf("conntrack entries of connections closed on the fast path: %v (they stay in SYN_RECV for 60 s)", err)
					d.failed[ns] = true
				}
				d.absent[ns] = time.Now().Add(closedRecheck)
				continue
			}
			d.socks[ns] = s
		}
		found, err := s.entries(ts)
		var del []ctIdent
		for i, e := range found {
			if e.state == ctTCPSynSent {
				kept++
				continue
			}
			del = append(del, ctIdent{ts[i], e.id})
		}
		missing += len(ts) - len(found)
		var miss int
		if err == nil {
			miss, err = sendCounted(s, del, appendCTDeleteID)
		}
		if err != nil && !d.failed[ns] {
			d.logf("conntrack entries of connections closed on the fast path in %s: %v", netnsutil.Label(ns), err)
			d.failed[ns] = true
		}
		deleted += len(del) - miss
		missing += miss
	}
	return deleted, missing, kept
}

const (
	ipctnlMsgCTGet = 1 // IPCTNL_MSG_CT_GET
	ctTCPSynSent   = 1 // TCP_CONNTRACK_SYN_SENT
)

// ctIdent is one conntrack entry: a tuple of it and its id (CTA_ID, as the kernel wrote it).
type ctIdent struct {
	t  ctnl.Tuple
	id uint32
}

// ctFound is what a GET said of an entry.
type ctFound struct {
	id    uint32
	state uint8 // TCP_CONNTRACK_*
}

// entries asks conntrack for the entries of tuples ts: by index into ts, those found.
func (s *ctSock) entries(ts []ctnl.Tuple) (map[int]ctFound, error) {
	found := map[int]ctFound{}
	var b []byte
	flush := func() error {
		err := s.Exchange(b, func(m syscall.NetlinkMessage) {
			i := int(m.Header.Seq) - 1
			if m.Header.Type != unix.NFNL_SUBSYS_CTNETLINK<<8|ipctnlMsgCTNew || i < 0 || i >= len(ts) {
				return // an error (ENOENT: gone already)
			}
			if f, ok := parseCTFound(m.Data); ok {
				found[i] = f
			}
		})
		b = b[:0]
		return err
	}
	for i, t := range ts {
		b = ctnl.AppendGet(b, t, uint32(i+1))
		if len(b) > 32<<10 {
			if err := flush(); err != nil {
				return found, err
			}
		}
	}
	return found, flush()
}

// parseCTFound reads the id and the TCP state of a ctnetlink entry message.
func parseCTFound(data []byte) (ctFound, bool) {
	var f ctFound
	var haveID bool
	if len(data) < sizeofNfgenmsg {
		return f, false
	}
	nlAttrs(data[sizeofNfgenmsg:], func(typ uint16, v []byte) {
		switch typ {
		case nl.CTA_ID:
			if len(v) == 4 {
				f.id, haveID = binary.NativeEndian.Uint32(v), true
			}
		case nl.CTA_PROTOINFO:
			nlAttrs(v, func(typ uint16, v []byte) {
				if typ == nl.CTA_PROTOINFO_TCP {
					nlAttrs(v, func(typ uint16, v []byte) {
						if typ == nl.CTA_PROTOINFO_TCP_STATE && len(v) == 1 {
							f.state = v[0]
						}
					})
				}
			})
		}
	})
	return f, haveID
}

// appendCTDeleteID appends a ctnetlink delete of entry e: the entry of its tuple, if its id
// is still e's (the kernel refuses another one with ENOENT).
func appendCTDeleteID(b []byte, e ctIdent, seq uint32) []byte {
	return ctnl.AppendDeleteID(b, e.t, e.id, seq)
}

// deleteClosed drains the programs' ring of connections closed on the fast path and deletes
// their conntrack entries in namespaces nss until ctx ends.
func (a *agent) deleteClosed(ctx context.Context, nss []string) {
	rd, err := ringbuf.NewReader(a.p.PrgFastpathClosed)
	if err != nil {
		a.lg.Printf("connections closed on the fast path: open the ring: %v (their conntrack entries stay in SYN_RECV for 60 s)", err)
		return
	}
	// At the end (detach, a new agent), the closes still in the ring are deleted too: Flush
	// ends a blocked read with what the ring holds; the ring goes with the agent's maps.
	go func() {
		<-ctx.Done()
		_ = rd.Flush()
	}()
	defer rd.Close()
	d := newCTDeleter(nss, a.lg.Printf)
	defer d.Close()
	var st closedStats
	logged := time.Now()
	drainClosed(ctx, rd, func(ts []ctnl.Tuple, lag time.Duration) {
		a.ctSelf.add(ts) // before the deletes: their events may be read before they return
		del, miss, kept := d.delete(ts)
		st.records += len(ts)
		st.deleted += del
		st.missing += miss
		st.kept += kept
		st.maxLag = max(st.maxLag, lag)
		if time.Since(logged) >= ctLogEvery {
			// A line per ctLogEvery at most: short connections close all the time.
			a.lg.Printf("connections closed on the fast path: %d; their conntrack entries (over %d namespaces) deleted %d, gone already %d, kept %d (a new connection on the ports); hand-over within %v",
				st.records, len(nss), st.deleted, st.missing, st.kept, st.maxLag.Round(time.Millisecond))
			st, logged = closedStats{}, time.Now()
		}
	})
}

// closedReader is the part of *ringbuf.Reader drainClosed uses.
type closedReader interface {
	ReadInto(*ringbuf.Record) error
	SetDeadline(time.Time)
}

// drainClosed reads the closed connections from rd and hands them to flush in batches of at
// most closedBatchMax, with the largest delay between a close and its read, until the reader
// is closed or ctx ends (then with what the ring still holds, flushed). It waits for the first
// record of a batch, then closedBatchWait, then reads what came meanwhile without waiting: the
// kernel wakes a reader only when a record lands in a ring it had read to the end, so the
// agent wakes once per batch, not once per connection (see closedBatchWait for the cost).
func drainClosed(ctx context.Context, rd closedReader, flush func([]ctnl.Tuple, time.Duration)) {
	var rec ringbuf.Record
	batch := make([]ctnl.Tuple, 0, closedBatchMax)
	var lag time.Duration
	add := func() {
		t, at, ok := parseClosed(rec.RawSample)
		if !ok {
			return
		}
		batch = append(batch, t)
		if now := monoNs(); now > at {
			lag = max(lag, time.Duration(now-at))
		}
	}
	send := func() {
		if len(batch) > 0 {
			flush(batch, lag)
		}
		batch, lag = batch[:0], 0
	}
	for {
		rd.SetDeadline(time.Time{})
		if err := rd.ReadInto(&rec); err != nil {
			if errors.Is(err, os.ErrClosed) || errors.Is(err, ringbuf.ErrClosed) || ctx.Err() != nil {
				return // closed, or flushed at the end with nothing left
			}
			if !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, ringbuf.ErrFlushed) {
				time.Sleep(closedBatchWait) // not expected; no busy loop should it repeat
			}
			continue
		}
		add()
		select {
		case <-ctx.Done(): // the end: what the ring holds now, at once
		case <-time.After(closedBatchWait):
		}
		rd.SetDeadline(time.Now()) // what is there now, no waiting
		for rd.ReadInto(&rec) == nil {
			add()
			if len(batch) == closedBatchMax {
				send()
			}
		}
		send()
		if ctx.Err() != nil {
			return
		}
	}
}

// selfDeleted are the conntrack entries the agent deleted itself in the last second or two
// (their tuples both ways), so that their DESTROY events, one per connection closed on the
// fast path, cost the conntrack watch (ctwatch.go) no flow lookups: such a flow is closed,
// with nothing to re-learn.
type selfDeleted struct {
	mu        sync.Mutex
	cur, prev map[ctnl.Tuple]struct{}
	since     time.Time
}

func (s *selfDeleted) add(ts []ctnl.Tuple) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil || time.Since(s.since) > time.Second {
		s.prev, s.cur, s.since = s.cur, make(map[ctnl.Tuple]struct{}, len(ts)*8), time.Now()
	}
	for _, t := range ts {
		s.cur[t] = struct{}{}
		s.cur[ctnl.Tuple{Src: t.Dst, Dst: t.Src, Sport: t.Dport, Dport: t.Sport, Proto: t.Proto}] = struct{}{}
	}
}

// has says whether the agent deleted entry e itself: the tuple it deleted by is one of e's
// (either direction, NAT included: the client's node deletes by the Service address, the
// backend's node by the backend's own tuple).
func (s *selfDeleted) has(e ctEntry) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range e.tuples() {
		if _, ok := s.cur[k]; ok {
			return true
		}
		if _, ok := s.prev[k]; ok {
			return true
		}
	}
	return false
}

// sendCounted sends one request per tuple (or entry), made by add, in buffers of up to 32
// KiB, and returns how many the kernel refused as ENOENT (no such entry: no error) and the
// first error.
func sendCounted[T any](s *ctSock, ts []T, add func([]byte, T, uint32) []byte) (int, error) {
	var b []byte
	var first error
	missing := 0
	flush := func() {
		m, err := s.send(b)
		missing += m
		if err != nil && first == nil {
			first = err
		}
		b = b[:0]
	}
	for i, t := range ts {
		b = add(b, t, uint32(i+1))
		if len(b) > 32<<10 {
			flush()
		}
	}
	flush()
	return missing, first
}

// tuples are e's two directions in the ctnl package's form (either family).
func (e ctEntry) tuples() [2]ctnl.Tuple {
	if !e.v6 {
		return [2]ctnl.Tuple{e.orig.nl(), e.reply.nl()}
	}
	var out [2]ctnl.Tuple
	for i, d := range []struct {
		t ctTuple
		a ctAddrs6
	}{{e.orig, e.orig6}, {e.reply, e.reply6}} {
		out[i] = ctTuple6{src: d.a.src, dst: d.a.dst, sport: d.t.sport, dport: d.t.dport}.nl()
		out[i].Proto = d.t.proto
	}
	return out
}
