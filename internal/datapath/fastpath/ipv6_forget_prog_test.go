package fastpath

import (
	"testing"

	"github.com/peregrine-net/peregrine/internal/datapath/endpoints"
	"github.com/peregrine-net/peregrine/internal/datapath/flow"
)

// TestIPv6ForgetEndpoint: when the endpoints reconcile reports an IPv6 pod changed (gone, or its
// veth/MAC replaced), the agent forgets that pod's IPv6 flows at once, with its flow counter,
// and leaves another pod's IPv6 flows and the IPv4 table alone; a gone overlay forgets the
// IPv6 flows of that overlay too. Before, only the IPv4 table was walked and the stale IPv6
// entry kept steering the pod's traffic to its old veth until it expired.
func TestIPv6ForgetEndpoint(t *testing.T) {
	e := newProgEnv(t)
	e.learn6(t) // pod6A <-> pod6B, learned (and counted) by the programs
	e.learn(t, keyOf(podA, podB, 40000, 5201, 6), 1)
	other := key6(pod6B, pod6A, 5201, 40000, 6) // a flow of another local pod
	if err := e.o.PrgFastpathFlow6.Put(other, e.flow6(t, key6(pod6A, pod6B, 40000, 5201, 6))); err != nil {
		t.Fatal(err)
	}
	mine := key6(pod6A, pod6B, 40000, 5201, 6)
	var c0 uint32
	counted := e.flow6(t, mine).Flags&fCounted != 0
	if counted {
		if err := e.o.PrgFastpathPcnt.Lookup(pcnt6Key(mine), &c0); err != nil {
			t.Fatalf("counter of pod A: %v", err)
		}
	}

	a := &agent{p: &pinned{fpMaps: e.o.fpMaps}}
	if n := a.forgetEndpoints([]endpoints.Key{{Netns: 1, Family: 6, Addr: flow.AddrWords(pod6A)}}); n != 1 {
		t.Fatalf("forgot %d flows, want 1 (pod A's IPv6 flow)", n)
	}
	var f fpFpFlow
	if err := e.o.PrgFastpathFlow6.Lookup(mine, &f); err == nil {
		t.Fatal("the changed IPv6 pod's flow is still cached")
	}
	if err := e.o.PrgFastpathFlow6.Lookup(other, &f); err != nil {
		t.Fatalf("another pod's IPv6 flow went too: %v", err)
	}
	if n := countEntries(t, e.o.PrgFastpathFlow); n != 1 {
		t.Fatalf("%d IPv4 flows after forgetting an IPv6 pod, want 1", n)
	}
	if counted {
		var c uint32
		_ = e.o.PrgFastpathPcnt.Lookup(pcnt6Key(mine), &c)
		if c != c0-1 {
			t.Fatalf("pod A's flow counter %d after the forget, want %d", c, c0-1)
		}
	}

	if n := a.forgetOverlay(0); n != 2 {
		t.Fatalf("a gone overlay forgot %d flows, want 2 (one IPv4, one IPv6)", n)
	}
	if n := countEntries(t, e.o.PrgFastpathFlow6); n != 0 {
		t.Fatalf("%d IPv6 flows left after the overlay went", n)
	}
}
