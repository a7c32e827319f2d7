package fastpath

import (
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// A pod's new flows beyond its budget stay on the normal path (counted "budget") and take no
// entry; another pod's new flow still gets one.
func TestFlowBudget(t *testing.T) {
	e := newProgEnv(t)
	e.putPod(t, podA, macPod, 100) // the senders, listed on their veths (src_refused)
	e.putPod(t, netip.MustParseAddr("10.244.1.9"), macPo2, 101)
	e.cfg.Budget = 4
	if err := e.o.PrgFastpathCfg.Put(uint32(0), e.cfg); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		f := podFrame()
		f.sport = uint16(41000 + i)
		if ret, _ := e.run(t, e.o.PrgFastpathTx, f.bytes(), 0); ret != tcxNext {
			t.Fatalf("flow %d: verdict %d, want the normal path", i, int32(ret))
		}
	}
	out, _ := e.counters(t)
	if out["miss"] != 10 || out["budget"] != 6 {
		t.Fatalf("counters %v: want 10 misses, 6 refused by the budget", out)
	}
	var n uint32
	if err := e.o.PrgFastpathPcnt.Lookup(uint64(word(podA)), &n); err != nil || n != 4 {
		t.Fatalf("pod A's counter: %d (%v), want 4", n, err)
	}
	other := podFrame()
	other.saddr = netip.MustParseAddr("10.244.1.9")
	e.run(t, e.o.PrgFastpathTx, other.bytes(), 0)
	var f fpFpFlow
	if err := e.o.PrgFastpathFlow.Lookup(keyOf(other.saddr, podB, 40000, 5201, 6), &f); err != nil || f.Flags&fCounted == 0 {
		t.Fatalf("another pod's new flow: %v %+v", err, f)
	}
}

// A SYN (and a SYN-ACK) takes the normal path and records what the learner needs: the
// connection is learned from its handshake. A FIN marks the entry closing; it goes 2 s later.
func TestSynLearnedFinCloses(t *testing.T) {
	e := newProgEnv(t)
	e.putPod(t, podA, macPod, 100) // the sender, listed on its veth (src_refused)
	k := keyOf(podA, podB, 40000, 5201, 6)
	syn := podFrame()
	syn.tcpFlags = 0x02
	syn.payload = nil
	if ret, _ := e.run(t, e.o.PrgFastpathTx, syn.bytes(), 0); ret != tcxNext {
		t.Fatalf("SYN: verdict %d", int32(ret))
	}
	var f fpFpFlow
	if err := e.o.PrgFastpathFlow.Lookup(k, &f); err != nil || f.OutTtlSeen != 64 || f.Flags&(fOut|fIn) != 0 {
		t.Fatalf("SYN handed over: %v %+v, want an entry waiting for the egress learner", err, f)
	}
	out, _ := e.counters(t)
	if out["proto"] != 1 || out["hit"] != 0 {
		t.Fatalf("SYN counted %v, want proto 1", out)
	}
	e.learn(t, k, 1) // learned both ways, as the learners would after the handshake
	data := podFrame()
	if ret, _ := e.run(t, e.o.PrgFastpathTx, data.bytes(), 0); ret != tcActRedirect {
		t.Fatalf("data after the handshake: verdict %d, want the fast path", int32(ret))
	}
	fin := podFrame()
	fin.tcpFlags = 0x11
	if ret, _ := e.run(t, e.o.PrgFastpathTx, fin.bytes(), 0); ret != tcxNext {
		t.Fatalf("FIN: verdict %d", int32(ret))
	}
	if err := e.o.PrgFastpathFlow.Lookup(k, &f); err != nil || f.Flags&fClosing == 0 || f.Flags&fDone != fFinOut {
		t.Fatalf("after FIN: %v %+v, want closing, the pod's FIN only", err, f)
	}
	// The remote end's FIN (arriving over VXLAN): both ends closed, which the agent's liberal
	// marking skips (ctliberal.go).
	lo := net.HardwareAddr{0, 0, 0, 0, 0, 0} // test runs deliver on lo: frames to its MAC are PACKET_HOST
	rfin := frame{dst: lo, src: macNicB, saddr: vtepB, daddr: vtepA, proto: 17, sport: 40001, dport: 8472,
		payload: append([]byte{8, 0, 0, 0, 0, 0, 1, 0}, frame{dst: macVxA, src: macVxB, saddr: podB, daddr: podA, proto: 6,
			sport: 5201, dport: 40000, tcpFlags: 0x11}.bytes()...)}
	if ret, _ := e.run(t, e.o.PrgFastpathRx, rfin.bytes(), 0); ret != tcxNext {
		t.Fatalf("remote FIN: verdict %d", int32(ret))
	}
	if err := e.o.PrgFastpathFlow.Lookup(k, &f); err != nil || f.Flags&fDone != fDone {
		t.Fatalf("after both FINs: %v %+v, want both FIN flags", err, f)
	}
	// A SYN on the same ports is a new connection: neither closing nor closed.
	e.run(t, e.o.PrgFastpathTx, syn.bytes(), 0)
	if err := e.o.PrgFastpathFlow.Lookup(k, &f); err != nil || f.Flags&(fClosing|fDone) != 0 {
		t.Fatalf("after a new SYN: %v %+v, want the closing flags cleared", err, f)
	}
	e.o.PrgFastpathFlow.Delete(k)
	e.run(t, e.o.PrgFastpathTx, syn.bytes(), 0) // a fresh, counted entry with its timer
	e.learn2(t, k)
	e.run(t, e.o.PrgFastpathTx, fin.bytes(), 0)
	var n0 uint32 // the first entry, replaced and deleted from userspace above, stays counted
	if err := e.o.PrgFastpathPcnt.Lookup(uint64(word(podA)), &n0); err != nil || n0 == 0 {
		t.Fatalf("pod A's counter: %d (%v)", n0, err)
	}
	deadline := time.Now().Add(4 * time.Second)
	for {
		err := e.o.PrgFastpathFlow.Lookup(k, &f)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("closed connection's entry still there 4 s after its FIN: %+v", f)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var n uint32
	if err := e.o.PrgFastpathPcnt.Lookup(uint64(word(podA)), &n); err != nil || n != n0-1 {
		t.Fatalf("pod A's counter after the expiry: %d (%v), want %d", n, err, n0-1)
	}
}

// learn2 marks an existing (program-made) entry learned both ways in place, keeping its timer.
func (e *progEnv) learn2(t *testing.T, k fpFpKey) {
	t.Helper()
	var f fpFpFlow
	if err := e.o.PrgFastpathFlow.Lookup(k, &f); err != nil {
		t.Fatal(err)
	}
	f.Flags |= fOut | fIn
	f.OutNs, f.InNs = monoNs(), monoNs()
	if err := e.o.PrgFastpathFlow.Update(k, f, ebpf.UpdateExist); err != nil {
		t.Fatal(err)
	}
}

// A new generation (the agent forgetting every flow) makes learned flows miss, and their next
// handover resets them.
func TestGenerationForgets(t *testing.T) {
	e := newProgEnv(t)
	k := keyOf(podA, podB, 40000, 5201, 6)
	e.learn(t, k, 1)
	data := podFrame()
	if ret, _ := e.run(t, e.o.PrgFastpathTx, data.bytes(), 0); ret != tcActRedirect {
		t.Fatalf("learned: verdict %d", int32(ret))
	}
	e.cfg.Gen = 7
	if err := e.o.PrgFastpathCfg.Put(uint32(0), e.cfg); err != nil {
		t.Fatal(err)
	}
	if ret, _ := e.run(t, e.o.PrgFastpathTx, data.bytes(), 0); ret != tcxNext {
		t.Fatalf("after a new generation: verdict %d, want the normal path", int32(ret))
	}
	var f fpFpFlow
	if err := e.o.PrgFastpathFlow.Lookup(k, &f); err != nil || f.Gen != 7 || f.Flags&(fOut|fIn) != 0 || f.OutTtlSeen == 0 {
		t.Fatalf("after the handover: %v %+v, want a reset entry of generation 7 waiting for the learner", err, f)
	}
}

// A connection conntrack has seen only the handshake of (learned from its SYN and SYN-ACK, no
// data through the normal path since) sends its FIN and RST on the fast path: down the normal
// path their numbers lie beyond the window conntrack knows, INVALID, and kube-proxy drops them
// (every crr connection stalled 1.66 s on the k8s lab). A flow re-learned from data loses the
// flag, and its FIN goes the normal path, which closes conntrack's entry.
func TestShortConnectionFinRidesFastPath(t *testing.T) {
	e := newProgEnv(t)
	k := keyOf(podA, podB, 40000, 5201, 6)
	setFlags := func(set, clear uint32) {
		t.Helper()
		f := e.flow(t, k)
		f.Flags = f.Flags&^clear | set
		if err := e.o.PrgFastpathFlow.Put(k, f); err != nil {
			t.Fatal(err)
		}
	}
	// The learner marks a direction learned from a SYN-ACK handshake-only, and a data packet
	// learned later clears it.
	e.learn(t, k, 1)
	delivered := frame{dst: macPod, src: macBridge, saddr: podB, daddr: podA, proto: 6, sport: 5201, dport: 40000, tcpFlags: 0x12, ttl: 63}
	for _, c := range []struct {
		name  string
		flags uint8
		want  uint32
	}{{"SYN-ACK", 0x12, fHsOnly}, {"data", 0x18, 0}} {
		f := e.flow(t, k)
		f.InTtlSeen = 64 // handed over: the learner's cue
		if err := e.o.PrgFastpathFlow.Put(k, f); err != nil {
			t.Fatal(err)
		}
		delivered.tcpFlags = c.flags
		if ret, _ := e.run(t, e.o.PrgFastpathLrnRx, delivered.bytes(), 0); ret != tcxNext {
			t.Fatalf("%s learned: verdict %d", c.name, int32(ret))
		}
		if got := e.flow(t, k).Flags & fHsOnly; got != c.want {
			t.Fatalf("learned from a %s: handshake-only flag %#x, want %#x", c.name, got, c.want)
		}
	}

	fin := podFrame()
	fin.tcpFlags = 0x11
	// Re-learned from data: the FIN goes the normal path (conntrack tracks the connection).
	out0, _ := e.counters(t)
	if ret, _ := e.run(t, e.o.PrgFastpathTx, fin.bytes(), 0); ret != tcxNext {
		t.Fatalf("FIN of a tracked connection: verdict %d, want the normal path", int32(ret))
	}
	if out1, _ := e.counters(t); out1["proto"] != out0["proto"]+1 {
		t.Fatalf("FIN of a tracked connection counted %v, want proto +1", out1)
	}
	// Handshake-only: the pod's FIN is encapsulated like its data, and marks the entry closing.
	setFlags(fHsOnly, fClosing|fDone)
	out0, _ = e.counters(t)
	if ret, _ := e.run(t, e.o.PrgFastpathTx, fin.bytes(), 0); ret != tcActRedirect {
		t.Fatalf("FIN of a short connection: verdict %d, want the fast path", int32(ret))
	}
	if out1, _ := e.counters(t); out1["hit"] != out0["hit"]+1 || out1["proto"] != out0["proto"] {
		t.Fatalf("FIN of a short connection counted %v (before %v), want hit +1", out1, out0)
	}
	if f := e.flow(t, k); f.Flags&fClosing == 0 || f.Flags&fDone != fFinOut {
		t.Fatalf("after the fast FIN: flags %#x, want closing and the pod's FIN", f.Flags)
	}
	// The remote end's FIN arriving over VXLAN takes the ingress fast path as far as the pod
	// table (empty here: counted no-pod, not proto), and records the second FIN.
	lo := net.HardwareAddr{0, 0, 0, 0, 0, 0}
	rfin := frame{dst: lo, src: macNicB, saddr: vtepB, daddr: vtepA, proto: 17, sport: 40001, dport: 8472,
		payload: append([]byte{8, 0, 0, 0, 0, 0, 1, 0}, frame{dst: macVxA, src: macVxB, saddr: podB, daddr: podA, proto: 6,
			sport: 5201, dport: 40000, tcpFlags: 0x11}.bytes()...)}
	_, in0 := e.counters(t)
	e.run(t, e.o.PrgFastpathRx, rfin.bytes(), 0)
	if _, in1 := e.counters(t); in1["proto"] != in0["proto"] || in1["no-pod"] != in0["no-pod"]+1 {
		t.Fatalf("remote FIN of a short connection counted %v (before %v), want no-pod +1 and no proto", in1, in0)
	}
	if f := e.flow(t, k); f.Flags&fDone != fDone {
		t.Fatalf("after both FINs: flags %#x, want both", f.Flags)
	}
	// A RST the same way: both ends closed at once.
	setFlags(fHsOnly, fClosing|fDone)
	rst := podFrame()
	rst.tcpFlags = 0x04
	if ret, _ := e.run(t, e.o.PrgFastpathTx, rst.bytes(), 0); ret != tcActRedirect {
		t.Fatalf("RST of a short connection: verdict %d, want the fast path", int32(ret))
	}
	if f := e.flow(t, k); f.Flags&fDone != fDone {
		t.Fatalf("after the RST: flags %#x, want both FIN flags", f.Flags)
	}
}
