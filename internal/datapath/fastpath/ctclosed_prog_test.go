package fastpath

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/peregrine-net/peregrine/internal/datapath/ctnl"
)

// closedRecords drains the ring of connections closed on the fast path (prg_fastpath_closed).
func (e *progEnv) closedRecords(t *testing.T) []ctnl.Tuple {
	t.Helper()
	rd, err := ringbuf.NewReader(e.o.PrgFastpathClosed)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	rd.SetDeadline(time.Now())
	var out []ctnl.Tuple
	for {
		rec, err := rd.Read()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		tu, at, ok := parseClosed(rec.RawSample)
		if !ok || at == 0 || at > monoNs()+uint64(time.Second) { // monoNs is the coarse clock: a tick behind
			t.Fatalf("record %x: not a closed connection with a time", rec.RawSample)
		}
		out = append(out, tu)
	}
}

// remoteFin is pod B's FIN (or RST: flags) to pod A arriving over VXLAN at host A, from sport.
func remoteFin(src, dst frame, flags uint8) []byte {
	lo := net.HardwareAddr{0, 0, 0, 0, 0, 0}
	inner := frame{dst: macVxA, src: macVxB, saddr: src.saddr, daddr: dst.daddr, proto: 6, sport: src.sport, dport: dst.dport, tcpFlags: flags}
	return frame{dst: lo, src: macNicB, saddr: vtepB, daddr: vtepA, proto: 17, sport: 40001, dport: 8472,
		payload: append([]byte{8, 0, 0, 0, 0, 0, 1, 0}, inner.bytes()...)}.bytes()
}

// A short connection (fHsOnly) closed on the fast path hands its conntrack tuple to the agent
// exactly once: the FIN that completes the close (either end's, either order) or a RST pushes
// one record; a repeated FIN, a connection conntrack tracks (its FIN on the normal path) and
// a same-node one push none. A Service connection's record is the tuple the client node's
// conntrack entry was made with: the pod and the Service address.
func TestClosedHandOver(t *testing.T) {
	e := newProgEnv(t)
	k := keyOf(podA, podB, 40000, 5201, 6)
	want := ctTuple{src: k.Local, dst: k.Remote, sport: k.Lport, dport: k.Rport, proto: 6}.nl()
	setFlags := func(k fpFpKey, set, clear uint32) {
		t.Helper()
		f := e.flow(t, k)
		f.Flags = f.Flags&^clear | set
		if err := e.o.PrgFastpathFlow.Put(k, f); err != nil {
			t.Fatal(err)
		}
	}
	fin := podFrame()
	fin.tcpFlags = 0x11
	rst := podFrame()
	rst.tcpFlags = 0x04
	peer := frame{saddr: podB, sport: 5201}
	self := frame{daddr: podA, dport: 40000}
	e.learn(t, k, 1)
	expect := func(what string, n int, tu ctnl.Tuple) {
		t.Helper()
		got := e.closedRecords(t)
		if len(got) != n || (n == 1 && got[0] != tu) {
			t.Fatalf("%s: records %+v, want %d of %+v", what, got, n, tu)
		}
	}

	// Handshake-only: the pod's FIN alone closes half the connection (no record), the remote
	// end's FIN completes it (one record), and each FIN again pushes nothing.
	setFlags(k, fHsOnly, fClosing|fDone)
	if ret, _ := e.run(t, e.o.PrgFastpathTx, fin.bytes(), 0); ret != tcActRedirect {
		t.Fatalf("FIN of a short connection: verdict %d, want the fast path", int32(ret))
	}
	expect("after the pod's FIN", 0, want)
	e.run(t, e.o.PrgFastpathRx, remoteFin(peer, self, 0x11), 0)
	expect("after both FINs", 1, want)
	e.run(t, e.o.PrgFastpathTx, fin.bytes(), 0)
	e.run(t, e.o.PrgFastpathRx, remoteFin(peer, self, 0x11), 0)
	e.run(t, e.o.PrgFastpathTx, rst.bytes(), 0)
	expect("after repeated FINs and a RST", 0, want)

	// The other order: the remote end closes first.
	setFlags(k, fHsOnly, fClosing|fDone)
	e.run(t, e.o.PrgFastpathRx, remoteFin(peer, self, 0x11), 0)
	expect("after the remote FIN", 0, want)
	e.run(t, e.o.PrgFastpathTx, fin.bytes(), 0)
	expect("after the pod's FIN second", 1, want)

	// A RST closes both ways at once: one record; the peer's RST after it none.
	setFlags(k, fHsOnly, fClosing|fDone)
	if ret, _ := e.run(t, e.o.PrgFastpathTx, rst.bytes(), 0); ret != tcActRedirect {
		t.Fatalf("RST of a short connection: verdict %d, want the fast path", int32(ret))
	}
	e.run(t, e.o.PrgFastpathRx, remoteFin(peer, self, 0x04), 0)
	expect("after a RST", 1, want)

	// A reused port (a SYN reopens the entry) is a new connection: its close pushes again.
	syn := podFrame()
	syn.tcpFlags = 0x02
	syn.payload = nil
	e.run(t, e.o.PrgFastpathTx, syn.bytes(), 0)
	if f := e.flow(t, k); f.Flags&(fClosing|fDone) != 0 {
		t.Fatalf("after a SYN on the closed key: flags %#x, want it open", f.Flags)
	}
	setFlags(k, fOut|fIn|fHsOnly, 0)
	e.run(t, e.o.PrgFastpathTx, rst.bytes(), 0)
	expect("after the reopened connection's RST", 1, want)

	// Tracked by conntrack (learned from data, not fHsOnly): its FINs take the normal path,
	// which closes the entry there; nothing to hand over.
	setFlags(k, 0, fHsOnly|fClosing|fDone)
	if ret, _ := e.run(t, e.o.PrgFastpathTx, fin.bytes(), 0); ret != tcxNext {
		t.Fatalf("FIN of a tracked connection: verdict %d, want the normal path", int32(ret))
	}
	e.run(t, e.o.PrgFastpathRx, remoteFin(peer, self, 0x11), 0)
	expect("a tracked connection's FINs", 0, want)

	// Same node (fLocal): its FIN takes the normal path too.
	setFlags(k, fHsOnly|fLocal, fClosing|fDone)
	e.run(t, e.o.PrgFastpathTx, rst.bytes(), 0)
	expect("a same-node connection's RST", 0, want)

	// A Service connection: pod A to svcAddr:80, translated to pod B:5201. The backend's FIN
	// arrives from pod B and finds the flow through its alias; the record holds the Service.
	e2 := newProgEnv(t)
	e2.learnDNAT(t, 6)
	sk := keyOf(podA, svcAddr, 40000, 80, 6)
	f := e2.flow(t, sk)
	f.Flags |= fHsOnly
	if err := e2.o.PrgFastpathFlow.Put(sk, f); err != nil {
		t.Fatal(err)
	}
	sfin := frame{dst: macBridge, src: macPod, saddr: podA, daddr: svcAddr, proto: 6, sport: 40000, dport: 80, tcpFlags: 0x11}
	if ret, _ := e2.run(t, e2.o.PrgFastpathTx, sfin.bytes(), 0); ret != tcActRedirect {
		t.Fatalf("FIN of a short Service connection: verdict %d, want the fast path", int32(ret))
	}
	e2.run(t, e2.o.PrgFastpathRx, remoteFin(peer, self, 0x11), 0)
	got := e2.closedRecords(t)
	sw := ctTuple{src: sk.Local, dst: sk.Remote, sport: sk.Lport, dport: sk.Rport, proto: 6}.nl()
	if len(got) != 1 || got[0] != sw {
		t.Fatalf("Service connection: records %+v, want one of %+v (pod A to %s:80)", got, sw, svcAddr)
	}
	// BPF_PROG_TEST_RUN has no conntrack entry for these tuples: the program's own expiry
	// (bpf_skb_ct_lookup) finds none, so every close above fell back to the ring.
	noCtExpiry(t, e)
	noCtExpiry(t, e2)
}

// noCtExpiry: no close was counted as expired in the kernel (closed-ct), which needs an entry.
func noCtExpiry(t *testing.T, e *progEnv) {
	t.Helper()
	tx, rx := e.counters(t)
	if n := tx["closed-ct"] + rx["closed-ct"]; n != 0 {
		t.Fatalf("closed-ct %d without any conntrack entry: want every close handed to the ring", n)
	}
}
