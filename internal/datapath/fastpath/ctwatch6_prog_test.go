package fastpath

import (
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/datapath/ctnl"
)

// ctEvent6 is a ctnetlink DESTROY payload (nfgenmsg, tuples) of an IPv6 entry orig/reply, as
// the kernel sends it (built with the shared ctnl package's tuple encoder).
func ctEvent6(orig, reply ctnl.Tuple) []byte {
	msg := []byte{unix.AF_INET6, 0, 0, 0}
	msg = append(msg, ctnl.TupleAttr(orig)...)
	r := ctnl.TupleAttr(reply)
	msg = nlAttr(msg, nl.CTA_TUPLE_REPLY|unix.NLA_F_NESTED, r[unix.SizeofNlAttr:])
	return nlAttr(msg, nl.CTA_STATUS, []byte{0, 0, 0, 8})
}

// TestParseCTEvent6: an IPv6 DESTROY event (here a Service's: the reply from a backend) parses
// into the IPv6 table's keys of the client's flow, the backend alias and the backend node's
// flow, none of them an IPv4 key; truncated or mis-sized ones parse to nothing, without panic.
func TestParseCTEvent6(t *testing.T) {
	vip, be := netip.MustParseAddr("fd70:7267:ffff::10"), netip.MustParseAddr("fd70:7267:0:3::2")
	msg := ctEvent6(ctnl.Tuple{Src: pod6A, Dst: vip, Sport: 40000, Dport: 80, Proto: 6},
		ctnl.Tuple{Src: be, Dst: pod6A, Sport: 8080, Dport: 40000, Proto: 6})
	e, ok := parseCTEvent(msg)
	if !ok || !e.v6 {
		t.Fatalf("parse = %+v, %v; want an IPv6 entry", e, ok)
	}
	b := ctBatch{keys: map[ctKey]bool{}}
	b.add(e)
	if len(b.keys) != 0 {
		t.Fatalf("an IPv6 entry gave IPv4 keys %v", b.keys)
	}
	for what, k := range map[string]fpFpKey6{
		"client's flow":       key6(pod6A, vip, 40000, 80, 6),
		"alias (backend)":     key6(pod6A, be, 40000, 8080, 6),
		"backend node's flow": key6(be, pod6A, 8080, 40000, 6),
	} {
		if !b.keys6[ctKey6{k.Local, k.Remote, k.Lport, k.Rport, k.Proto}] {
			t.Errorf("batch lacks the %s key %+v", what, k)
		}
	}
	// IPv6 family with IPv4-sized addresses, and the reverse: neither parses.
	v4 := ctnl.TupleAttr(ctnl.Tuple{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), Sport: 1, Dport: 2, Proto: 17})
	if _, ok := parseCTEvent(append([]byte{unix.AF_INET6, 0, 0, 0}, v4...)); ok {
		t.Error("an AF_INET6 event with IPv4 addresses parsed")
	}
	if _, ok := parseCTEvent(append([]byte{unix.AF_INET, 0, 0, 0}, msg[4:]...)); ok {
		t.Error("an AF_INET event with IPv6 addresses parsed")
	}
	for n := range len(msg) {
		_, _ = parseCTEvent(msg[:n]) // truncated: no panic
	}
}

// TestIPv6CTDestroyMakesFlowDue: a DESTROY event of an IPv6 conntrack entry (`conntrack -D`)
// makes the learned IPv6 flow due at once, so its next packets take the normal path (and meet
// netfilter) instead of the fast path until the 5 s re-learn; an IPv4 flow on the same ports
// stays learned. Before, IPv6 events were dropped by the parser.
func TestIPv6CTDestroyMakesFlowDue(t *testing.T) {
	e := newProgEnv(t)
	e.learn6(t)
	k4 := keyOf(podA, podB, 40000, 5201, 6)
	e.learn(t, k4, 1)
	e.expect(t, "egress hit before", e.o.PrgFastpathTx, pod6Frame().bytes(), tcActRedirect, 0, "hit")

	a := &agent{p: &pinned{fpMaps: e.o.fpMaps}}
	a.ovs.Store(&[]*overlay{{Index: 0}})
	ev, ok := parseCTEvent(ctEvent6(ctnl.Tuple{Src: pod6A, Dst: pod6B, Sport: 40000, Dport: 5201, Proto: 6},
		ctnl.Tuple{Src: pod6B, Dst: pod6A, Sport: 5201, Dport: 40000, Proto: 6}))
	if !ok {
		t.Fatal("the IPv6 DESTROY event did not parse")
	}
	k6 := key6(pod6A, pod6B, 40000, 5201, 6)
	learned := e.flow6(t, k6)
	for _, lookup := range []bool{true, false} { // a small batch looks keys up; a large one walks
		b := ctBatch{keys: map[ctKey]bool{}}
		b.add(ev)
		if !lookup {
			if err := e.o.PrgFastpathFlow6.Put(k6, learned); err != nil { // learned again
				t.Fatal(err)
			}
			for i := range ctLookupMax + 1 {
				b.keys[ctKey{local: uint32(i), proto: 17}] = true
			}
		}
		if n := a.dueFlows(&b, 0); n != 1 {
			t.Fatalf("lookup %v: %d flows made due, want 1 (the IPv6 flow)", lookup, n)
		}
		e.expect(t, "egress after the deletion", e.o.PrgFastpathTx, pod6Frame().bytes(), tcxNext, 0, "stale")
		var f fpFpFlow
		if err := e.o.PrgFastpathFlow.Lookup(k4, &f); err != nil || f.OutNs == 0 {
			t.Fatalf("the IPv4 flow on the same ports was made due too (%v)", err)
		}
	}
}
