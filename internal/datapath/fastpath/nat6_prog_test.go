package fastpath

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/datapath/endpoints"
	"github.com/peregrine-net/peregrine/internal/datapath/flow"
)

// IPv6 Service NAT (bpf/fastpath_nat6.h) with crafted frames: pod A (node A) connects to an
// IPv6 ClusterIP, the normal path translates it to pod B (node B); the fast path learns that
// through the handover record and the underlay's egress learner, then replays it both ways.
// frame6.bytes() computes every checksum from scratch, so a frame the program rewrote
// incrementally must equal the one built with the translated addresses; the checksums are
// also verified on their own (l4Valid6).

var svc6 = netip.MustParseAddr("fd70:7267:2::a")

// onOneCPU runs the rest of the test on one CPU: the handover record is per CPU, and a test run
// executes on the calling thread's CPU. Per goroutine: each subtest calls it itself.
func onOneCPU(t *testing.T) {
	t.Helper()
	runtime.LockOSThread()
	var old, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		t.Fatal(err)
	}
	for c := 0; c < 1024; c++ {
		if old.IsSet(c) {
			one.Set(c)
			break
		}
	}
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = unix.SchedSetaffinity(0, &old)
		runtime.UnlockOSThread()
	})
}

// svc6Frame is pod A's segment (or datagram) to the ClusterIP, port 80.
func svc6Frame(proto uint8) frame6 {
	return frame6{dst: macBridge, src: macPod, saddr: pod6A, daddr: svc6, proto: proto, sport: 40000, dport: 80,
		tcpFlags: 0x10, payload: []byte("IPv6 to a ClusterIP, translated on the fast path: odd length")}
}

// backend6Reply is pod B's answer (from its own address and port), as flannel.1 on node A
// decapsulates it.
func backend6Reply(proto uint8) frame6 {
	return frame6{dst: macVxA, src: macVxB, saddr: pod6B, daddr: pod6A, proto: proto, sport: 5201, dport: 40000,
		tcpFlags: 0x10, payload: []byte("the backend answers")}
}

// l4Valid6 says whether the IPv6 packet ip (no extension headers) has a valid TCP/UDP checksum.
func l4Valid6(ip []byte) bool {
	l4 := ip[40:]
	var ph uint32
	for i := 8; i < 40; i += 2 {
		ph += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	if ip[6] == 17 && binary.BigEndian.Uint16(l4[6:]) == 0 {
		return false // no checksum: invalid over IPv6
	}
	return csum(l4, ph+uint32(ip[6])+uint32(len(l4))) == 0
}

func (e *progEnv) nat6(t *testing.T, k fpFpKey6) (fpFpNat6, bool) {
	t.Helper()
	var v fpFpNat6
	err := e.o.PrgFastpathNat6.Lookup(k, &v)
	return v, err == nil
}

func nat6Of(a netip.Addr, port uint16) fpFpNat6 {
	k := key6(a, a, port, port, 0)
	return fpFpNat6{Addr: k.Local, Port: k.Lport}
}

// learnSvc6 takes pod A's connection to the ClusterIP through the normal path both ways, as
// the programs see it: the handover, the translated VXLAN frame at the underlay's learner, the
// backend's reply, and its delivery with the Service address restored by conntrack.
func (e *progEnv) learnSvc6(t *testing.T, proto uint8) {
	t.Helper()
	e.putPod6(t, pod6A, macPod, 7)
	out := svc6Frame(proto)
	e.expect(t, "first packet to the ClusterIP", e.o.PrgFastpathTx, out.bytes(), tcxNext, 0, "miss")
	tr := out
	tr.daddr, tr.dport = pod6B, 5201 // conntrack's DNAT
	// The real learner needs handover_out6's tc_index tag, which a test run cannot set.
	e.expect(t, "translated frame, untagged", e.o.PrgFastpathLrnTx, encap6(tr), tcxNext, 0, "")
	if _, ok := e.nat6(t, key6(pod6A, svc6, 40000, 80, proto)); ok {
		t.Fatal("an untagged frame taught a translation")
	}
	e.expect(t, "translated frame", e.o.PrgFastpathLrnTx6t, encap6(tr), tcxNext, 0, "learned")
	e.expect(t, "first reply", e.o.PrgFastpathRx, vx6(backend6Reply(proto).bytes()), tcxNext, 1, "miss")
	in := backend6Reply(proto)
	in.saddr, in.sport = svc6, 80 // conntrack reverses the DNAT
	in.dst, in.src, in.hlim = macPod, macBridge, 63
	e.expect(t, "its delivery", e.o.PrgFastpathLrnRx, in.bytes(), tcxNext, 1, "learned")
}

// TestIPv6ServiceNATLearnAndHit: the flow is learned under the key the pod sent, with the
// backend in the side table and an alias under the translated key; then pod A's packets leave
// with the backend as destination and pod B's replies reach pod A from the ClusterIP, byte for
// byte as the normal path makes them, TCP and UDP checksums valid.
func TestIPv6ServiceNATLearnAndHit(t *testing.T) {
	for _, c := range []struct {
		name  string
		proto uint8
	}{{"tcp", 6}, {"udp", 17}} {
		t.Run(c.name, func(t *testing.T) {
			onOneCPU(t)
			e := newProgEnv(t)
			e.learnSvc6(t, c.proto)

			fk, ak := key6(pod6A, svc6, 40000, 80, c.proto), key6(pod6A, pod6B, 40000, 5201, c.proto)
			f := e.flow6(t, fk)
			if f.Flags&(fOut|fIn|fDNAT) != fOut|fIn|fDNAT || f.Flags&fNATX != 0 || f.Vtep != binary.LittleEndian.Uint32(vtepB.AsSlice()) {
				t.Fatalf("flow to the ClusterIP: flags %#x, vtep %x", f.Flags, f.Vtep)
			}
			if be, ok := e.nat6(t, fk); !ok || be != nat6Of(pod6B, 5201) {
				t.Fatalf("the flow's backend: %+v (%v), want pod B:5201", be, ok)
			}
			if a := e.flow6(t, ak); a.Flags != fAlias {
				t.Fatalf("alias flags %#x, want alias only", a.Flags)
			}
			if s, ok := e.nat6(t, ak); !ok || s != nat6Of(svc6, 80) {
				t.Fatalf("the alias's Service address: %+v (%v)", s, ok)
			}

			sent := svc6Frame(c.proto)
			pkt := sent.bytes()
			out := e.expect(t, "egress hit", e.o.PrgFastpathTx, pkt, tcActRedirect, 0, "hit")
			want := sent
			want.daddr, want.dport = pod6B, 5201
			w := encap6(want)
			if len(out) != len(w) || !bytes.Equal(out[64:], w[64:]) {
				t.Fatalf("inner packet\n got %x\nwant %x", out[64:], w[64:])
			}
			if !l4Valid6(out[64:]) {
				t.Fatalf("egress checksum invalid: %x", out[64:])
			}

			got := e.expect(t, "ingress hit", e.o.PrgFastpathRx, vx6(backend6Reply(c.proto).bytes()), tcActRedirect, 1, "hit")
			wantIn := backend6Reply(c.proto)
			wantIn.saddr, wantIn.sport = svc6, 80
			wantIn.dst, wantIn.src, wantIn.hlim = macPod, macBridge, 63
			if wb := wantIn.bytes(); !bytes.Equal(got, wb) {
				t.Fatalf("delivered reply\n got %x\nwant %x", got, wb)
			}
			if !l4Valid6(got[14:]) {
				t.Fatalf("ingress checksum invalid: %x", got[14:])
			}
		})
	}
}

// TestIPv6ServiceNATUDPZeroChecksum: a UDP datagram with checksum 0 (invalid over IPv6, or a
// checksum-offload seed of 0 a program cannot tell apart) is left unchanged to the normal path.
func TestIPv6ServiceNATUDPZeroChecksum(t *testing.T) {
	onOneCPU(t)
	e := newProgEnv(t)
	e.learnSvc6(t, 17)
	pkt := svc6Frame(17).bytes()
	binary.BigEndian.PutUint16(pkt[14+40+6:], 0)
	e.expect(t, "udp checksum 0", e.o.PrgFastpathTx, pkt, tcxNext, 0, "error")
}

// TestIPv6ServiceNATSourceNAT: a frame the normal path translated in its source too (a
// masquerade) is not reproduced: the flow is marked and its packets stay on the normal path,
// counted "nat".
func TestIPv6ServiceNATSourceNAT(t *testing.T) {
	onOneCPU(t)
	e := newProgEnv(t)
	e.putPod6(t, pod6A, macPod, 7)
	out := svc6Frame(6)
	e.expect(t, "first packet", e.o.PrgFastpathTx, out.bytes(), tcxNext, 0, "miss")
	tr := out
	tr.saddr, tr.sport = netip.MustParseAddr("fd70:7267:0:1::"), 61000 // the node's address
	tr.daddr, tr.dport = pod6B, 5201
	e.expect(t, "source-NATed frame", e.o.PrgFastpathLrnTx6t, encap6(tr), tcxNext, 0, "")
	fk := key6(pod6A, svc6, 40000, 80, 6)
	if f := e.flow6(t, fk); f.Flags&fNATX == 0 || f.Flags&(fOut|fDNAT) != 0 || f.OutTtlSeen != 0 {
		t.Fatalf("flow flags %#x (ttl seen %d), want NATX without OUT/DNAT", f.Flags, f.OutTtlSeen)
	}
	if n := countEntries(t, e.o.PrgFastpathNat6); n != 0 {
		t.Fatalf("%d side entries for a flow that is not reproduced", n)
	}
	if _, ok := e.nat6(t, key6(tr.saddr, pod6B, 61000, 5201, 6)); ok {
		t.Fatal("an alias for the source-NATed key")
	}
	e.expect(t, "next packet", e.o.PrgFastpathTx, out.bytes(), tcxNext, 0, "nat")
}

// TestIPv6ServiceNATHostile: frames a pod (or a delayed frame) could make look like a Service's.
// Each subtest pins its own goroutine (onOneCPU).
func TestIPv6ServiceNATHostile(t *testing.T) {
	t.Run("reply forged from the ClusterIP", func(t *testing.T) {
		onOneCPU(t)
		// A pod on the backend's node sends pod A a segment from the ClusterIP itself: the
		// key is the translated flow's own, which the normal path never sends over the
		// overlay. Not delivered, not counted against the flow (not even its RST).
		e := newProgEnv(t)
		e.learnSvc6(t, 6)
		fk := key6(pod6A, svc6, 40000, 80, 6)
		before := e.flow6(t, fk)
		for _, flags := range []uint8{0x10, 0x04, 0x11} { // ACK, RST, FIN
			forged := backend6Reply(6)
			forged.saddr, forged.sport, forged.tcpFlags = svc6, 80, flags
			e.expect(t, "forged reply", e.o.PrgFastpathRx, vx6(forged.bytes()), tcxNext, 1, "nat")
		}
		if after := e.flow6(t, fk); after.Flags != before.Flags || after.InTtlSeen != 0 {
			t.Fatalf("the flow changed: flags %#x -> %#x, ttl seen %d", before.Flags, after.Flags, after.InTtlSeen)
		}
	})

	t.Run("reply from another backend", func(t *testing.T) {
		onOneCPU(t)
		e := newProgEnv(t)
		e.learnSvc6(t, 6)
		other := netip.MustParseAddr("fd70:7267:0:2::3")
		ak := key6(pod6A, other, 40000, 5201, 6)
		if err := e.o.PrgFastpathFlow6.Put(ak, fpFpFlow{Flags: fAlias}); err != nil {
			t.Fatal(err)
		}
		if err := e.o.PrgFastpathNat6.Put(ak, nat6Of(svc6, 80)); err != nil {
			t.Fatal(err)
		}
		r := backend6Reply(6)
		r.saddr = other
		e.expect(t, "reply of a backend the flow is not translated to", e.o.PrgFastpathRx, vx6(r.bytes()), tcxNext, 1, "stale")
	})

	t.Run("handover record of another flow", func(t *testing.T) {
		onOneCPU(t)
		// The record on this CPU is another flow's (a frame the normal path delayed reaches
		// the learner after another handover): nothing is learned and neither flow is marked.
		e := newProgEnv(t)
		e.putPod6(t, pod6A, macPod, 7)
		out := svc6Frame(6)
		e.expect(t, "first packet", e.o.PrgFastpathTx, out.bytes(), tcxNext, 0, "miss")
		second := out
		second.sport = 40001
		second.payload = []byte("another connection, another sequence number")
		pkt := second.bytes()
		binary.BigEndian.PutUint32(pkt[14+40+4:], 777777) // its own sequence number
		binary.BigEndian.PutUint16(pkt[14+40+16:], 0)
		e.expect(t, "another flow's packet", e.o.PrgFastpathTx, fix6(pkt), tcxNext, 0, "miss")
		tr := out // the first flow's frame, translated, reaching the learner late
		tr.daddr, tr.dport = pod6B, 5201
		e.expect(t, "the delayed frame", e.o.PrgFastpathLrnTx6t, encap6(tr), tcxNext, 0, "")
		for _, lp := range []uint16{40000, 40001} {
			if f := e.flow6(t, key6(pod6A, svc6, lp, 80, 6)); f.Flags&(fOut|fDNAT|fNATX) != 0 {
				t.Fatalf("flow from port %d: flags %#x after another frame's record", lp, f.Flags)
			}
		}
		if n := countEntries(t, e.o.PrgFastpathNat6); n != 0 {
			t.Fatalf("%d side entries learned from another flow's record", n)
		}
		if _, err := e.o.PrgFastpathFlow6.LookupBytes(key6(pod6A, pod6B, 40000, 5201, 6)); err != nil {
			t.Fatal(err)
		}
		if n := countEntries(t, e.o.PrgFastpathFlow6); n != 2 {
			t.Fatalf("%d IPv6 entries, want the 2 flows (no alias)", n)
		}
	})
}

// fix6 recomputes the TCP checksum of an Ethernet + IPv6 + TCP frame whose check field is 0.
func fix6(pkt []byte) []byte {
	ip := pkt[14:]
	var ph uint32
	for i := 8; i < 40; i += 2 {
		ph += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	l4 := ip[40:]
	binary.BigEndian.PutUint16(l4[16:], csum(l4, ph+6+uint32(len(l4))))
	return pkt
}

// TestIPv6ServiceNATSideEntriesGo: the side entries go with their flows: the agent's forget
// deletes them with the flow and its alias, and the kernel's sweep removes those of entries that
// went (here deleted by hand, as the sweep deletes an expired entry) in its next run.
func TestIPv6ServiceNATSideEntriesGo(t *testing.T) {
	onOneCPU(t)
	e := newProgEnv(t)
	e.learnSvc6(t, 6)
	if n := countEntries(t, e.o.PrgFastpathNat6); n != 2 {
		t.Fatalf("%d side entries after learning, want 2 (flow, alias)", n)
	}
	a := &agent{p: &pinned{fpMaps: e.o.fpMaps}}
	if n := a.forgetEndpoints([]endpoints.Key{{Netns: 1, Family: 6, Addr: flow.AddrWords(pod6A)}}); n != 2 {
		t.Fatalf("forgot %d entries, want 2 (the flow and its alias)", n)
	}
	if n := countEntries(t, e.o.PrgFastpathNat6); n != 0 {
		t.Fatalf("%d side entries after the forget", n)
	}

	e.learnSvc6(t, 6)
	if n := countEntries(t, e.o.PrgFastpathNat6); n != 2 {
		t.Fatalf("%d side entries after learning again, want 2", n)
	}
	for _, k := range []fpFpKey6{key6(pod6A, svc6, 40000, 80, 6), key6(pod6A, pod6B, 40000, 5201, 6)} {
		if err := e.o.PrgFastpathFlow6.Delete(k); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for countEntries(t, e.o.PrgFastpathNat6) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d side entries 5 s after their entries went (the sweep runs every second)", countEntries(t, e.o.PrgFastpathNat6))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
