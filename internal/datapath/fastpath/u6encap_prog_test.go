package fastpath

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// The sending half over an IPv6 underlay encapsulating in the program (bpf/fastpath_u6.h's
// tx_u6_encap): a packet that is not GSO leaves with the whole header the kernel gave the flow
// (outer Ethernet, IPv6, UDP, VXLAN, inner Ethernet: learned from flannel-v6.1's frame on the
// underlay's egress), its lengths and a valid outer UDP checksum, redirected to the underlay.

// TestIPv6UnderlayEncap: the frame is the one flannel-v6.1 builds, byte for byte, with the outer
// UDP checksum valid, also for an inner checksum the NIC fills in later (CHECKSUM_PARTIAL) and
// with the inner ECN copied out; the driver path is kept for what the program does not build.
func TestIPv6UnderlayEncap(t *testing.T) {
	e := newProgEnv(t)
	out, sent := e.learnU6(t)
	e.putU6dev(t, 1) // "lo" stands in for flannel-v6.1 (the test run's namespace)
	k := key6(pod6A, pod6B, 40000, 5201, 6)

	want := vxu6(sent.bytes(), vtep6A, vtep6B, u6opts{}) // the kernel's frame the template came from
	got := e.expect(t, "encapsulated", e.o.PrgFastpathTx, out.bytes(), tcActRedirect, 0, "hit")
	if !bytes.Equal(got, want) {
		t.Fatalf("encapsulated frame\n got %x\nwant %x", got, want)
	}
	if !l4Valid6(got[14:]) || !l4Valid6(got[84:]) {
		t.Fatalf("checksums: outer UDP %v, inner TCP %v", l4Valid6(got[14:]), l4Valid6(got[84:]))
	}

	// A longer segment: the lengths follow it.
	long := out
	long.payload = bytes.Repeat([]byte{0xa5, 0x5a, 0x01}, 401)
	lsent := sent
	lsent.payload = long.payload
	got = e.expect(t, "a longer segment", e.o.PrgFastpathTx, long.bytes(), tcActRedirect, 0, "hit")
	if w := vxu6(lsent.bytes(), vtep6A, vtep6B, u6opts{}); !bytes.Equal(got, w) {
		t.Fatalf("longer segment\n got %x\nwant %x", got, w)
	}

	// CHECKSUM_PARTIAL: the pod's stack left the inner TCP checksum to the NIC (its field holds
	// the pseudo header's sum). Once filled in, as skb_checksum_help does, both checksums hold.
	part := out.bytes()
	ip := part[14:]
	var ph uint32
	for i := 8; i < 40; i += 2 {
		ph += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	ph += 6 + uint32(len(ip)-40)
	binary.BigEndian.PutUint16(ip[40+16:], ^csum(nil, ph))
	got = e.expect(t, "inner checksum partial", e.o.PrgFastpathTx, part, tcActRedirect, 0, "hit")
	l4 := got[84+40:]
	binary.BigEndian.PutUint16(l4[16:], csum(l4, 0))
	if !l4Valid6(got[84:]) || !l4Valid6(got[14:]) {
		t.Fatalf("inner checksum filled in later: inner %v, outer UDP %v", l4Valid6(got[84:]), l4Valid6(got[14:]))
	}

	// ECN: CE inside is ECT(0) outside (ip_tunnel_ecn_encap); the rest of the traffic class and
	// the flow label are the template's.
	ce, cesent := out, sent
	ce.tclass, cesent.tclass = 3, 3
	got = e.expect(t, "inner CE", e.o.PrgFastpathTx, ce.bytes(), tcActRedirect, 0, "hit")
	w := vxu6(cesent.bytes(), vtep6A, vtep6B, u6opts{})
	w[15] |= 2 << 4
	if !bytes.Equal(got, w) {
		t.Fatalf("inner CE\n got %x\nwant %x", got, w)
	}

	// Over the underlay's MTU once encapsulated: the driver path (flannel-v6.1's own MTU is
	// what the pod is told about).
	cfg := e.cfg
	cfg.Mtu = uint32(len(out.bytes())-14+70) - 1
	if err := e.o.PrgFastpathCfg.Put(uint32(0), cfg); err != nil {
		t.Fatal(err)
	}
	got = e.expect(t, "over the underlay's MTU", e.o.PrgFastpathTx, out.bytes(), tcActRedirect, 0, "hit")
	if w := sent.bytes(); !bytes.Equal(got, w) {
		t.Fatalf("over the MTU: frame for flannel-v6.1\n got %x\nwant %x", got, w)
	}
	if err := e.o.PrgFastpathCfg.Put(uint32(0), e.cfg); err != nil {
		t.Fatal(err)
	}

	// A template of an earlier learning (the flow was learned again since), or of another
	// device than the underlay: never used.
	var tm fpFpU6tmpl
	if err := e.o.PrgFastpathU6tmpl.Lookup(k, &tm); err != nil {
		t.Fatal(err)
	}
	if f := e.flow6(t, k); tm.OutNs != f.OutNs || tm.Ifindex != 1 || !bytes.Equal(tm.Hdr[:], want[:84]) {
		t.Fatalf("template: out_ns %d (flow %d), ifindex %d, header %x", tm.OutNs, f.OutNs, tm.Ifindex, tm.Hdr)
	}
	for _, c := range []struct {
		what string
		mod  func(*fpFpU6tmpl)
	}{
		{"an earlier learning's template", func(m *fpFpU6tmpl) { m.OutNs-- }},
		{"another device's template", func(m *fpFpU6tmpl) { m.Ifindex = 2 }},
	} {
		m := tm
		c.mod(&m)
		if err := e.o.PrgFastpathU6tmpl.Put(k, m); err != nil {
			t.Fatal(err)
		}
		got = e.expect(t, c.what, e.o.PrgFastpathTx, out.bytes(), tcActRedirect, 0, "hit")
		if w := sent.bytes(); !bytes.Equal(got, w) {
			t.Fatalf("%s: frame for flannel-v6.1\n got %x\nwant %x", c.what, got, w)
		}
	}
	if err := e.o.PrgFastpathU6tmpl.Put(k, tm); err != nil {
		t.Fatal(err)
	}
	if got = e.expect(t, "the template back", e.o.PrgFastpathTx, out.bytes(), tcActRedirect, 0, "hit"); !bytes.Equal(got, want) {
		t.Fatalf("template back\n got %x\nwant %x", got, want)
	}
}
