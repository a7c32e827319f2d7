package fastpath

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
)

// Service NAT on the fast path, checked against a Go model: frame.bytes() computes every
// checksum from scratch, so the frame the program rewrote incrementally must equal the frame
// built directly with the translated addresses.

var svcAddr = netip.MustParseAddr("198.18.255.3")

// learnDNAT installs pod A's flow to the Service (svcAddr:80) translated to pod B:5201, learned
// both ways, and the alias under the translated key.
func (e *progEnv) learnDNAT(t *testing.T, proto uint8) {
	t.Helper()
	f := fpFpFlow{Vtep: binary.LittleEndian.Uint32(vtepB.AsSlice()), OutIfindex: 1, InIfindex: 1, OutNs: monoNs(), InNs: monoNs(),
		Flags: fOut | fIn | fDNAT, OutTtlDec: 1, InTtlDec: 1,
		NatAddr: binary.LittleEndian.Uint32(podB.AsSlice()), NatPort: htons(5201)}
	copy(f.Tmpl[:], template())
	copy(f.InMac[:6], macPod)
	copy(f.InMac[6:], macBridge)
	if err := e.o.PrgFastpathFlow.Put(keyOf(podA, svcAddr, 40000, 80, proto), f); err != nil {
		t.Fatal(err)
	}
	a := fpFpFlow{Flags: fAlias, NatAddr: binary.LittleEndian.Uint32(svcAddr.AsSlice()), NatPort: htons(80)}
	if err := e.o.PrgFastpathFlow.Put(keyOf(podA, podB, 40000, 5201, proto), a); err != nil {
		t.Fatal(err)
	}
}

// TestTxServiceDNAT: a pod's packet to the ClusterIP leaves encapsulated with the backend as
// destination, IPv4 and TCP/UDP checksums right (also a UDP checksum of 0, which stays 0).
func TestTxServiceDNAT(t *testing.T) {
	for _, c := range []struct {
		name   string
		proto  uint8
		noCsum bool
	}{{"tcp", 6, false}, {"udp", 17, false}, {"udp without checksum", 17, true}} {
		t.Run(c.name, func(t *testing.T) {
			e := newProgEnv(t)
			e.learnDNAT(t, c.proto)
			sent := frame{dst: macBridge, src: macPod, saddr: podA, daddr: svcAddr, proto: c.proto, sport: 40000, dport: 80,
				tcpFlags: 0x10, payload: []byte("peregrine service nat test payload, odd length!")}
			want := sent
			want.daddr, want.dport, want.ttl = podB, 5201, 63
			pkt, wantPkt := sent.bytes(), want.bytes()
			if c.noCsum {
				binary.BigEndian.PutUint16(pkt[40:], 0)
				binary.BigEndian.PutUint16(wantPkt[40:], 0)
			}
			ret, out := e.run(t, e.o.PrgFastpathTx, pkt, 0)
			if ret != tcActRedirect {
				eg, _ := e.counters(t)
				t.Fatalf("verdict %d, want redirect (%v)", int32(ret), eg)
			}
			if len(out) != len(pkt)+50 || !bytes.Equal(out[64:], wantPkt[14:]) {
				t.Fatalf("inner packet\n got %x\nwant %x", out[64:], wantPkt[14:])
			}
		})
	}
}

// TestRxServiceReverse: the backend's reply reaches the pod with the Service address and
// port as its source, checksums right.
func TestRxServiceReverse(t *testing.T) {
	for _, proto := range []uint8{6, 17} {
		e := newProgEnv(t)
		e.learnDNAT(t, proto)
		e.putPod4(t)
		reply := frame{dst: macVxA, src: macVxB, saddr: podB, daddr: podA, proto: proto, sport: 5201, dport: 40000, tcpFlags: 0x10,
			payload: []byte("the backend answers, 33 bytes ok")}
		want := reply
		want.saddr, want.sport, want.ttl = svcAddr, 80, 63
		pkt := frame{dst: net.HardwareAddr{0, 0, 0, 0, 0, 0}, src: macNicB, saddr: vtepB, daddr: vtepA, proto: 17, sport: 40001, dport: 8472,
			payload: append([]byte{8, 0, 0, 0, 0, 0, 1, 0}, reply.bytes()...)}.bytes()
		ret, out := e.run(t, e.o.PrgFastpathRx, pkt, 0)
		if ret != tcActRedirect {
			_, in := e.counters(t)
			t.Fatalf("proto %d: verdict %d, want redirect (%v)", proto, int32(ret), in)
		}
		w := want.bytes()
		if !bytes.Equal(out[14:len(w)], w[14:]) || !bytes.Equal(out[:6], macPod) {
			t.Fatalf("proto %d: delivered\n got %x\nwant %x", proto, out[:len(w)], w)
		}
	}
}

// A reply from a backend the flow is no longer translated to stays on the normal path.
func TestRxServiceOtherBackend(t *testing.T) {
	e := newProgEnv(t)
	e.learnDNAT(t, 6)
	other := netip.MustParseAddr("198.19.2.3")
	a := fpFpFlow{Flags: fAlias, NatAddr: binary.LittleEndian.Uint32(svcAddr.AsSlice()), NatPort: htons(80)}
	if err := e.o.PrgFastpathFlow.Put(keyOf(podA, other, 40000, 5201, 6), a); err != nil {
		t.Fatal(err)
	}
	reply := frame{dst: macVxA, src: macVxB, saddr: other, daddr: podA, proto: 6, sport: 5201, dport: 40000, tcpFlags: 0x10, payload: make([]byte, 10)}
	pkt := frame{dst: net.HardwareAddr{0, 0, 0, 0, 0, 0}, src: macNicB, saddr: vtepB, daddr: vtepA, proto: 17, sport: 40001, dport: 8472,
		payload: append([]byte{8, 0, 0, 0, 0, 0, 1, 0}, reply.bytes()...)}.bytes()
	_, before := e.counters(t)
	ret, out := e.run(t, e.o.PrgFastpathRx, pkt, 0)
	_, after := e.counters(t)
	if ret != tcxNext || !bytes.Equal(out, pkt) || after["stale"] != before["stale"]+1 {
		t.Fatalf("verdict %d, changed %v, counters %v", int32(ret), !bytes.Equal(out, pkt), after)
	}
}

// TestRxServiceForgedFromClusterIP: a frame from the Service address itself (the translated
// flow's own key), which the normal path never sends over the overlay, is not delivered and
// does not touch the flow, not even as a FIN or RST.
func TestRxServiceForgedFromClusterIP(t *testing.T) {
	onOneCPU(t)
	e := newProgEnv(t)
	e.learnDNAT(t, 6)
	fk := keyOf(podA, svcAddr, 40000, 80, 6)
	var before, after fpFpFlow
	if err := e.o.PrgFastpathFlow.Lookup(fk, &before); err != nil {
		t.Fatal(err)
	}
	for _, flags := range []uint8{0x10, 0x04, 0x11, 0x02} { // ACK, RST, FIN, SYN
		forged := frame{dst: macVxA, src: macVxB, saddr: svcAddr, daddr: podA, proto: 6, sport: 80, dport: 40000, tcpFlags: flags,
			payload: []byte("from the ClusterIP itself")}
		pkt := frame{dst: net.HardwareAddr{0, 0, 0, 0, 0, 0}, src: macNicB, saddr: vtepB, daddr: vtepA, proto: 17, sport: 40001, dport: 8472,
			payload: append([]byte{8, 0, 0, 0, 0, 0, 1, 0}, forged.bytes()...)}.bytes()
		e.expect(t, "forged reply", e.o.PrgFastpathRx, pkt, tcxNext, 1, "nat")
	}
	if err := e.o.PrgFastpathFlow.Lookup(fk, &after); err != nil {
		t.Fatal(err)
	}
	if after.Flags != before.Flags || after.InTtlSeen != before.InTtlSeen || after.InNs != before.InNs {
		t.Fatalf("the flow changed: flags %#x -> %#x, ttl seen %d -> %d", before.Flags, after.Flags, before.InTtlSeen, after.InTtlSeen)
	}
}
