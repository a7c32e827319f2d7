package fastpath

import (
	"testing"

	"github.com/peregrine-net/peregrine/internal/datapath/ctnl"
)

// TestIPv6ClosedHandOver is TestClosedHandOver for an IPv6 connection (bpf/fastpath6.h): a
// short connection (fHsOnly) sends its FINs and RST on the fast path and hands its tuple to the
// agent once, as an IPv6 record of the shared ring (fp_closed6) that parseClosed reads as the
// IPv6 tuple conntrack knows; either FIN order and a RST push one record each, a repeated FIN,
// a connection conntrack tracks and a same-node one none.
func TestIPv6ClosedHandOver(t *testing.T) {
	e := newProgEnv(t)
	e.learn6(t)
	k := key6(pod6A, pod6B, 40000, 5201, 6)
	want := ctnl.Tuple{Src: pod6A, Dst: pod6B, Sport: 40000, Dport: 5201, Proto: 6}
	setFlags := func(set, clear uint32) {
		t.Helper()
		f := e.flow6(t, k)
		f.Flags = f.Flags&^clear | set
		if err := e.o.PrgFastpathFlow6.Put(k, f); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(what string, n int) {
		t.Helper()
		got := e.closedRecords(t)
		if len(got) != n || (n == 1 && got[0] != want) {
			t.Fatalf("%s: records %+v, want %d of %+v", what, got, n, want)
		}
	}
	podCtl := func(flags uint8) []byte {
		f := pod6Frame()
		f.tcpFlags, f.payload = flags, nil
		return f.bytes()
	}
	remoteCtl := func(flags uint8) []byte {
		f := reply6Frame()
		f.tcpFlags, f.payload = flags, nil
		return vx6(f.bytes())
	}
	const fin, rst = 0x11, 0x04

	// Pod A's FIN first, on the fast path (encapsulated), then pod B's (decapsulated): one record.
	setFlags(fHsOnly, fClosing|fDone)
	e.expect(t, "the pod's FIN", e.o.PrgFastpathTx, podCtl(fin), tcActRedirect, 0, "hit")
	expect("after the pod's FIN", 0)
	e.expect(t, "the remote FIN", e.o.PrgFastpathRx, remoteCtl(fin), tcActRedirect, 1, "hit")
	expect("after both FINs", 1)
	e.run(t, e.o.PrgFastpathTx, podCtl(fin), 0)
	e.run(t, e.o.PrgFastpathRx, remoteCtl(fin), 0)
	e.run(t, e.o.PrgFastpathTx, podCtl(rst), 0)
	expect("after repeated FINs and a RST", 0)

	// The other order.
	setFlags(fHsOnly, fClosing|fDone)
	e.run(t, e.o.PrgFastpathRx, remoteCtl(fin), 0)
	expect("after the remote FIN", 0)
	e.run(t, e.o.PrgFastpathTx, podCtl(fin), 0)
	expect("after the pod's FIN second", 1)

	// A RST (either end's) closes both ways at once: one record, the peer's RST after it none.
	setFlags(fHsOnly, fClosing|fDone)
	e.expect(t, "the remote RST", e.o.PrgFastpathRx, remoteCtl(rst), tcActRedirect, 1, "hit")
	e.run(t, e.o.PrgFastpathTx, podCtl(rst), 0)
	expect("after a RST", 1)

	// Tracked by conntrack (re-learned from data): FINs take the normal path, no record.
	setFlags(0, fHsOnly|fClosing|fDone)
	e.expect(t, "a tracked connection's FIN", e.o.PrgFastpathTx, podCtl(fin), tcxNext, 0, "proto")
	e.expect(t, "its peer's FIN", e.o.PrgFastpathRx, remoteCtl(fin), tcxNext, 1, "proto")
	if f := e.flow6(t, k); f.Flags&fDone != fDone || f.Flags&fClosing == 0 {
		t.Fatalf("tracked connection's FINs: flags %#x, want it closing", f.Flags)
	}
	expect("a tracked connection's FINs", 0)

	// Same node (fLocal): the normal path's, no record.
	setFlags(fHsOnly|fLocal, fClosing|fDone)
	e.expect(t, "a same-node RST", e.o.PrgFastpathTx, podCtl(rst), tcxNext, 0, "proto")
	expect("a same-node connection's RST", 0)

	// The IPv4 table and its records saw none of it; an IPv4 close still gives an IPv4 record.
	if n := countEntries(t, e.o.PrgFastpathFlow); n != 0 {
		t.Fatalf("%d IPv4 flows after an IPv6 exchange", n)
	}
	k4 := keyOf(podA, podB, 40000, 5201, 6)
	e.learn(t, k4, 1)
	f4 := e.flow(t, k4)
	f4.Flags |= fHsOnly
	if err := e.o.PrgFastpathFlow.Put(k4, f4); err != nil {
		t.Fatal(err)
	}
	r4 := podFrame()
	r4.tcpFlags = rst
	e.run(t, e.o.PrgFastpathTx, r4.bytes(), 0)
	got := e.closedRecords(t)
	if w4 := (ctTuple{src: k4.Local, dst: k4.Remote, sport: k4.Lport, dport: k4.Rport, proto: 6}).nl(); len(got) != 1 || got[0] != w4 || !got[0].Src.Is4() {
		t.Fatalf("IPv4 RST next to IPv6 flows: records %+v, want one of %+v", got, w4)
	}
	noCtExpiry(t, e) // no conntrack entry in test_run: every close fell back to the ring
}
