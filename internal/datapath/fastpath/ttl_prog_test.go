package fastpath

import "testing"

// TestTTLRefusalRelearns: a learned direction whose recorded TTL/hop limit change is wrong (193:
// what 0 - 63 wrapped to when a learner re-read out_ttl_seen after another CPU's learner had
// cleared it, TestSameNodeServiceIPv6 in CI) refuses the packet as "ttl" and hands it to the
// normal path with its hop limit recorded, so the learner puts the right change back (1) and
// the next packet hits. Before, a refused packet was not handed over: the direction stayed on
// the normal path until its 5-s revalidation. Both directions, IPv6 (learn6's flow).
func TestTTLRefusalRelearns(t *testing.T) {
	e := newProgEnv(t)
	e.learn6(t)
	k := key6(pod6A, pod6B, 40000, 5201, 6)

	f := e.flow6(t, k)
	f.OutTtlDec = 193
	if err := e.o.PrgFastpathFlow6.Put(k, f); err != nil {
		t.Fatal(err)
	}
	out := pod6Frame()
	e.expect(t, "egress with a wrapped change", e.o.PrgFastpathTx, out.bytes(), tcxNext, 0, "ttl")
	if f := e.flow6(t, k); f.OutTtlSeen != 64 {
		t.Fatalf("refused egress not handed over: hop limit seen %d, want 64", f.OutTtlSeen)
	}
	e.expect(t, "its VXLAN frame", e.o.PrgFastpathLrnTx, encap6(out), tcxNext, 0, "learned")
	if f := e.flow6(t, k); f.OutTtlDec != 1 || f.OutTtlSeen != 0 {
		t.Fatalf("egress re-learned with hop limit change %d (seen %d), want 1 (0)", f.OutTtlDec, f.OutTtlSeen)
	}
	e.expect(t, "the next segment", e.o.PrgFastpathTx, pod6Frame().bytes(), tcActRedirect, 0, "hit")

	f = e.flow6(t, k)
	f.InTtlDec = 193
	if err := e.o.PrgFastpathFlow6.Put(k, f); err != nil {
		t.Fatal(err)
	}
	in := reply6Frame()
	e.expect(t, "ingress with a wrapped change", e.o.PrgFastpathRx, vx6(in.bytes()), tcxNext, 1, "ttl")
	if f := e.flow6(t, k); f.InTtlSeen != 64 {
		t.Fatalf("refused ingress not handed over: hop limit seen %d, want 64", f.InTtlSeen)
	}
	in.dst, in.src, in.hlim = macPod, macBridge, 63 // as cni0 delivers it
	e.expect(t, "its delivery", e.o.PrgFastpathLrnRx, in.bytes(), tcxNext, 1, "learned")
	if f := e.flow6(t, k); f.InTtlDec != 1 || f.InTtlSeen != 0 {
		t.Fatalf("ingress re-learned with hop limit change %d (seen %d), want 1 (0)", f.InTtlDec, f.InTtlSeen)
	}
	e.expect(t, "the next reply", e.o.PrgFastpathRx, vx6(reply6Frame().bytes()), tcActRedirect, 1, "hit")
}

// TestTTLRefusalHandsOver4: the IPv4 programs hand a TTL-refused packet over the same way
// (its TTL recorded for the learner), egress and ingress.
func TestTTLRefusalHandsOver4(t *testing.T) {
	e := newProgEnv(t)
	k := keyOf(podA, podB, 40000, 5201, 6)
	e.learn(t, k, 193)
	e.expect(t, "egress with a wrapped change", e.o.PrgFastpathTx, podFrame().bytes(), tcxNext, 0, "ttl")
	if f := e.flow(t, k); f.OutTtlSeen != 64 {
		t.Fatalf("refused egress not handed over: TTL seen %d, want 64", f.OutTtlSeen)
	}
}
