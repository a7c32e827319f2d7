package fastpath

import (
	"bytes"
	"context"
	"encoding/binary"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/datapath/ctnl"
)

// fakeRing serves queued records; an empty ring with a deadline says so, one without ends.
type fakeRing struct {
	recs     [][]byte
	deadline time.Time
	end      func()
}

func (r *fakeRing) SetDeadline(t time.Time) { r.deadline = t }

func (r *fakeRing) ReadInto(rec *ringbuf.Record) error {
	if len(r.recs) == 0 {
		if r.deadline.IsZero() {
			r.end()
			return os.ErrClosed
		}
		return os.ErrDeadlineExceeded
	}
	rec.RawSample, r.recs = r.recs[0], r.recs[1:]
	return nil
}

func closedRecord(i int, at uint64) []byte {
	b := make([]byte, sizeofClosed)
	binary.NativeEndian.PutUint32(b[0:], 0x0201a8c0)
	binary.NativeEndian.PutUint32(b[4:], 0x0202a8c0)
	binary.NativeEndian.PutUint16(b[8:], uint16(i))
	binary.NativeEndian.PutUint16(b[10:], 0x5000)
	b[12] = 6
	binary.NativeEndian.PutUint64(b[16:], at)
	return b
}

// The agent sends the closed connections in batches of at most closedBatchMax, every record
// once and in order; a short record is skipped.
func TestDrainClosed(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := &fakeRing{end: cancel}
	at := monoNs() - uint64(30*time.Millisecond)
	const n = 600
	for i := range n {
		r.recs = append(r.recs, closedRecord(i, at))
		if i == 10 {
			r.recs = append(r.recs, []byte{1, 2, 3})
		}
	}
	var got []ctnl.Tuple
	var sizes []int
	drainClosed(ctx, r, func(ts []ctnl.Tuple, lag time.Duration) {
		sizes = append(sizes, len(ts))
		got = append(got, ts...)
		if lag < 30*time.Millisecond || lag > time.Minute {
			t.Errorf("lag %v, want the 30 ms since the records' close", lag)
		}
	})
	if len(got) != n {
		t.Fatalf("%d tuples sent, want %d (batches %v)", len(got), n, sizes)
	}
	for i, tu := range got {
		if want := (ctTuple{src: 0x0201a8c0, dst: 0x0202a8c0, sport: uint16(i), dport: 0x5000, proto: 6}).nl(); tu != want {
			t.Fatalf("tuple %d: %+v", i, tu)
		}
	}
	for _, s := range sizes {
		if s > closedBatchMax {
			t.Fatalf("a batch of %d (max %d): %v", s, closedBatchMax, sizes)
		}
	}
	// At the end (ctx done, the ring flushed) the records still there are sent, at once.
	done, stop := context.WithCancel(context.Background())
	stop()
	r = &fakeRing{end: func() {}}
	for i := range 10 {
		r.recs = append(r.recs, closedRecord(i, at))
	}
	got = got[:0]
	start := time.Now()
	drainClosed(done, r, func(ts []ctnl.Tuple, _ time.Duration) { got = append(got, ts...) })
	if len(got) != 10 || time.Since(start) > closedBatchWait {
		t.Fatalf("at the end: %d of 10 records sent, after %v", len(got), time.Since(start))
	}
	if _, _, ok := parseClosed(make([]byte, sizeofClosed-1)); ok {
		t.Fatal("a short record parsed")
	}
}

// The conntrack watch skips the DESTROY events of entries the agent deleted itself, by either
// of their tuples: the client node deletes a Service connection by the Service address (its
// entry's original tuple), the backend's node by the backend's tuple (its entry's reply).
func TestSelfDeleted(t *testing.T) {
	var s selfDeleted
	pod, svc, be := uint32(0x0201f40a), uint32(0x0a0060a), uint32(0x0301f40a)
	s.add([]ctnl.Tuple{ctTuple{src: pod, dst: svc, sport: 40000, dport: 80, proto: 6}.nl()})  // client node
	s.add([]ctnl.Tuple{ctTuple{src: be, dst: pod, sport: 8080, dport: 40001, proto: 6}.nl()}) // backend node
	client := ctEntry{orig: ctTuple{pod, svc, 40000, 80, 6}, reply: ctTuple{be, pod, 8080, 40000, 6}}
	backend := ctEntry{orig: ctTuple{pod, be, 40001, 8080, 6}, reply: ctTuple{be, pod, 8080, 40001, 6}}
	other := ctEntry{orig: ctTuple{pod, be, 40002, 8080, 6}, reply: ctTuple{be, pod, 8080, 40002, 6}}
	if !s.has(client) || !s.has(backend) || s.has(other) {
		t.Fatalf("self-deleted: client %v, backend %v, other %v; want true, true, false", s.has(client), s.has(backend), s.has(other))
	}
}

// A GET's answer gives the entry's id and TCP state; the delete carries the id back as it came.
func TestCTFoundAndDeleteID(t *testing.T) {
	id := []byte{0xde, 0xad, 0xbe, 0xef}
	tcp := nlAttr(nil, nl.CTA_PROTOINFO_TCP_STATE, []byte{2}) // SYN_RECV
	info := nlAttr(nil, nl.CTA_PROTOINFO_TCP|unix.NLA_F_NESTED, tcp)
	tu := ctTuple{src: 0x0201a8c0, dst: 0x0202a8c0, sport: 0x409c, dport: 0x5000, proto: 6}
	msg := append([]byte{unix.AF_INET, 0, 0, 0}, ctTupleAttr(tu)...)
	msg = nlAttr(msg, nl.CTA_ID, id)
	msg = nlAttr(msg, nl.CTA_PROTOINFO|unix.NLA_F_NESTED, info)
	f, ok := parseCTFound(msg)
	if !ok || f.state != 2 || !bytes.Equal(be32(f.id), id) {
		t.Fatalf("parsed %+v (%v), want state 2 and id % x", f, ok, id)
	}
	if _, ok := parseCTFound(msg[:4]); ok {
		t.Fatal("an entry without an id parsed")
	}
	del := appendCTDeleteID(nil, ctIdent{tu.nl(), f.id}, 7)
	var gotID []byte
	var gotT ctTuple
	nlAttrs(del[unix.SizeofNlMsghdr+sizeofNfgenmsg:], func(typ uint16, v []byte) {
		switch typ {
		case nl.CTA_ID:
			gotID = v
		case nl.CTA_TUPLE_ORIG:
			gotT, _ = parseCTTuple(v)
		}
	})
	if binary.NativeEndian.Uint16(del[4:]) != unix.NFNL_SUBSYS_CTNETLINK<<8|ipctnlMsgCTDel || !bytes.Equal(gotID, id) || gotT != tu {
		t.Fatalf("delete: type %#x, id % x, tuple %+v", binary.NativeEndian.Uint16(del[4:]), gotID, gotT)
	}
}

// An IPv6 record (struct fp_closed6, 48 bytes) reads as the IPv6 tuple of its key; the agent's
// own deletes of IPv6 entries are recognised by either direction of their DESTROY event.
func TestClosedIPv6Record(t *testing.T) {
	k := key6(pod6A, pod6B, 40000, 5201, 6)
	b := make([]byte, sizeofClosed6)
	for i := range 4 {
		binary.NativeEndian.PutUint32(b[4*i:], k.Local[i])
		binary.NativeEndian.PutUint32(b[16+4*i:], k.Remote[i])
	}
	binary.NativeEndian.PutUint16(b[32:], k.Lport)
	binary.NativeEndian.PutUint16(b[34:], k.Rport)
	b[36] = 6
	binary.NativeEndian.PutUint64(b[40:], 12345)
	tu, at, ok := parseClosed(b)
	want := ctnl.Tuple{Src: pod6A, Dst: pod6B, Sport: 40000, Dport: 5201, Proto: 6}
	if !ok || at != 12345 || tu != want {
		t.Fatalf("parsed %+v at %d (%v), want %+v at 12345", tu, at, ok, want)
	}
	for _, n := range []int{sizeofClosed6 - 1, sizeofClosed6 + 8, sizeofClosed + 4} {
		if _, _, ok := parseClosed(make([]byte, n)); ok {
			t.Fatalf("a record of %d bytes parsed", n)
		}
	}
	var s selfDeleted
	s.add([]ctnl.Tuple{want})
	mine := ctEntry{v6: true, orig: ctTuple{sport: k.Lport, dport: k.Rport, proto: 6}, reply: ctTuple{sport: k.Rport, dport: k.Lport, proto: 6},
		orig6: ctAddrs6{k.Local, k.Remote}, reply6: ctAddrs6{k.Remote, k.Local}}
	other := mine
	other.orig.sport, other.reply.dport = htons(40001), htons(40001)
	v4 := ctEntry{orig: ctTuple{sport: k.Lport, dport: k.Rport, proto: 6}, reply: ctTuple{sport: k.Rport, dport: k.Lport, proto: 6}}
	if !s.has(mine) || s.has(other) || s.has(v4) {
		t.Fatalf("self-deleted: mine %v, other port %v, IPv4 %v; want true, false, false", s.has(mine), s.has(other), s.has(v4))
	}
}

// TestClosedFastEvent: the DESTROY event of an entry the programs expired at its close (marked
// IPS_FIXED_TIMEOUT, big-endian in CTA_STATUS as the kernel writes it) is recognised, so the
// conntrack watch does not make the next connection on the same ports due; an ordinary TCP
// entry's, and a UDP one with the bit, are deletions to act on.
func TestClosedFastEvent(t *testing.T) {
	a, b := netip.MustParseAddr("10.244.1.2"), netip.MustParseAddr("10.244.2.2")
	event := func(proto uint8, status uint32) []byte {
		msg := []byte{unix.AF_INET, 0, 0, 0}
		msg = append(msg, ctnl.TupleAttr(ctnl.Tuple{Src: a, Dst: b, Sport: 40000, Dport: 80, Proto: proto})...)
		r := ctnl.TupleAttr(ctnl.Tuple{Src: b, Dst: a, Sport: 80, Dport: 40000, Proto: proto})
		msg = nlAttr(msg, nl.CTA_TUPLE_REPLY|unix.NLA_F_NESTED, r[unix.SizeofNlAttr:])
		return nlAttr(msg, nl.CTA_STATUS, binary.BigEndian.AppendUint32(nil, status))
	}
	for _, c := range []struct {
		name   string
		proto  uint8
		status uint32
		want   bool
	}{
		{"expired at the close (SEEN_REPLY|CONFIRMED|FIXED_TIMEOUT)", unix.IPPROTO_TCP, 2 | 8 | 1024, true},
		{"handshake-only, not marked (SEEN_REPLY|CONFIRMED)", unix.IPPROTO_TCP, 2 | 8, false},
		{"UDP with a fixed timeout", unix.IPPROTO_UDP, 8 | 1024, false},
		{"bit 10 in the wrong byte order", unix.IPPROTO_TCP, 0x00040000, false},
	} {
		e, ok := parseCTEvent(event(c.proto, c.status))
		if !ok {
			t.Fatalf("%s: did not parse", c.name)
		}
		if got := e.closedFast(); got != c.want {
			t.Errorf("%s: closedFast = %v, want %v (status %#x)", c.name, got, c.want, e.status)
		}
	}
}
