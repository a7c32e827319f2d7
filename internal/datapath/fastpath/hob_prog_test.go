package fastpath

import (
	"encoding/binary"
	"testing"
)

// TestServiceNATHandoverBinding: IPv4's per-CPU handover record is bound to its frame (the IP
// identification and 8 L4 bytes, fastpath_nat.h's prg_fastpath_hob). A translated frame that
// reaches the egress learner after another frame's handover rewrote the record (the normal path
// delayed it) learns nothing and marks neither flow; the same frame right after its own
// handover learns the translation.
func TestServiceNATHandoverBinding(t *testing.T) {
	for _, c := range []struct {
		name  string
		proto uint8
		other func(pkt []byte) // makes the second flow's frame differ in its binding only
	}{
		{"tcp, another identification", 6, func(pkt []byte) {
			binary.BigEndian.PutUint16(pkt[14+4:], 0x5678)
			binary.BigEndian.PutUint16(pkt[14+10:], 0)
			binary.BigEndian.PutUint16(pkt[14+10:], csum(pkt[14:34], 0))
		}},
		{"udp, other first payload bytes", 17, func(pkt []byte) {
			copy(pkt[14+20+8:], "XXXXXXXX") // checksum left stale: the tx program reads no further
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			onOneCPU(t)
			e := newProgEnv(t)
			e.putPod(t, podA, macPod, 7)
			first := frame{dst: macBridge, src: macPod, saddr: podA, daddr: svcAddr, proto: c.proto, sport: 40000, dport: 80,
				tcpFlags: 0x10, payload: []byte("to a ClusterIP, translated by the normal path")}
			e.expect(t, "first flow's packet", e.o.PrgFastpathTx, first.bytes(), tcxNext, 0, "miss")
			second := first
			second.sport = 40001
			pkt := second.bytes()
			c.other(pkt)
			e.expect(t, "second flow's packet", e.o.PrgFastpathTx, pkt, tcxNext, 0, "miss")

			tr := first // the first flow's frame as the normal path translated it, late
			tr.daddr, tr.dport = podB, 5201
			e.expect(t, "the delayed frame", e.o.PrgFastpathLrnTx4t, encap4(tr), tcxNext, 0, "")
			for _, lp := range []uint16{40000, 40001} {
				if f := e.flow(t, keyOf(podA, svcAddr, lp, 80, c.proto)); f.Flags&(fOut|fDNAT|fNATX) != 0 {
					t.Fatalf("flow from port %d: flags %#x after another frame's record", lp, f.Flags)
				}
			}
			if n := countEntries(t, e.o.PrgFastpathFlow); n != 2 {
				t.Fatalf("%d IPv4 entries, want the 2 flows (no alias)", n)
			}

			// Its own record: learned, translated, the alias written.
			e.expect(t, "first flow's packet again", e.o.PrgFastpathTx, first.bytes(), tcxNext, 0, "miss")
			e.expect(t, "the frame after its own handover", e.o.PrgFastpathLrnTx4t, encap4(tr), tcxNext, 0, "")
			if f := e.flow(t, keyOf(podA, svcAddr, 40000, 80, c.proto)); f.Flags&(fOut|fDNAT) != fOut|fDNAT {
				t.Fatalf("flow not learned from its own record: flags %#x", f.Flags)
			}
			if a := e.flow(t, keyOf(podA, podB, 40000, 5201, c.proto)); a.Flags&fAlias == 0 {
				t.Fatalf("no alias under the translated key: flags %#x", a.Flags)
			}
		})
	}
}
