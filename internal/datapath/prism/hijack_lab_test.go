package prism

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

// A pod's identity comes from the host side and the normal path, never from the pod (issue 28,
// item 2): pod B, with CAP_NET_ADMIN in its namespace, adds pod A's address to its eth0 (and
// keeps quiet on ARP for it, so the normal path still delivers to A). The hijacker gets nothing
// and the victim gets its traffic: the agent refuses the doubly claimed address (no endpoint:
// the normal path), and even a table that names B's veth for A's address redirects nothing,
// since the normal path delivers A's flows through A's veth.

const hijackPort = 5404

func TestLabHijack(t *testing.T) {
	requireTools(t, "nft", "conntrack")
	l := labtest.Up(t, lab.Spec{Name: "tprhj", Style: lab.StyleFlannel, Containers: 2})
	h2 := l.Hosts[1].Netns
	c11, _ := l.Node("h1-c1")
	a, _ := l.Node("h2-c1")
	b, _ := l.Node("h2-c2")
	victim := a.AddrOnly()
	sinkA := startSink(t, a.Netns, victim, hijackPort)
	attach := func(agent string) {
		t.Helper()
		if _, err := datapath.Attach(context.Background(), h2, Name, datapath.Options{Extra: map[string]string{
			OptRules: fmt.Sprintf("proto=udp dport=%d", hijackPort), OptAgent: agent}}); err != nil {
			t.Fatal(err)
		}
	}
	attach("true")
	labtest.DetachAtEnd(t, h2)
	sport := 43000
	flow := func() {
		t.Helper()
		sport++
		stop := startSource(t, c11.Netns, victim, hijackPort, sport)
		time.Sleep(time.Second)
		stop()
		time.Sleep(50 * time.Millisecond)
	}

	// Before: the victim's HP flow is redirected to it.
	s0, n0 := inspect(t, h2).Stats, sinkA.n.Load()
	flow()
	if s := inspect(t, h2).Stats; s.Redirected-s0.Redirected < 100 || sinkA.n.Load()-n0 < 500 {
		t.Fatalf("before the attack: %d delivered, %d redirected", sinkA.n.Load()-n0, s.Redirected-s0.Redirected)
	}

	// The attack, as issue 28 reproduced it.
	for _, args := range [][]string{{"sysctl", "-qw", "net.ipv4.conf.eth0.arp_ignore=8"}, {"ip", "addr", "add", victim + "/32", "dev", "eth0"}} {
		if out, err := netnsutil.Run(context.Background(), b.Netns, args...); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	sinkB := startSink(t, b.Netns, victim, hijackPort)
	labtest.Eventually(t, 5*time.Second, "the agent refuses the address two pods claim", func() (bool, string) {
		v := inspect(t, h2)
		return len(v.Conflicts) == 1 && v.Conflicts[0].Addr == victim && v.ConflictsSeen == 1, fmt.Sprintf("%+v", v.Conflicts)
	})
	v := inspect(t, h2)
	for _, e := range v.Endpoints {
		if e.Addr == victim {
			t.Errorf("the refused address keeps an endpoint: %+v", e)
		}
	}
	_, entries, err := mode{}.Counters(&datapath.State{Target: h2})
	if err != nil || entries["endpoint_conflicts"] != 1 || entries["endpoint_conflicts_seen"] != 1 {
		t.Errorf("metrics: %v %v", entries, err)
	}
	nA, nB := sinkA.n.Load(), sinkB.n.Load()
	flow()
	if got := sinkB.n.Load() - nB; got != 0 {
		t.Errorf("the hijacker got %d datagrams of the victim's flow", got)
	}
	if got := sinkA.n.Load() - nA; got < 500 {
		t.Errorf("the victim got %d datagrams in 1 s (normal path)", got)
	}

	// No agent, and a table that names the hijacker's veth for the victim's address (what the
	// pod's own word would have given): the normal path delivers the flow through the victim's
	// veth, so the gate redirects nothing to the hijacker.
	if _, err := datapath.Detach(context.Background(), h2, ""); err != nil {
		t.Fatal(err)
	}
	attach("false")
	objs, err := openPinned(h2)
	if err != nil {
		t.Fatal(err)
	}
	defer objs.Close()
	keyOf := func(addr string) prsPrismEpKey {
		for _, vx := range inspect(t, h2).Endpoints {
			if vx.Addr == b.AddrOnly() {
				return prsPrismEpKey{Netns: vx.Domain, Family: 4, Addr: addrWords(netip.MustParseAddr(addr))}
			}
		}
		t.Fatalf("no endpoint for the hijacker's own address: %+v", inspect(t, h2).Endpoints)
		return prsPrismEpKey{}
	}
	var hv prsPrismEp
	if err := objs.PrgPrismEp.Lookup(keyOf(b.AddrOnly()), &hv); err != nil {
		t.Fatal(err)
	}
	if err := objs.PrgPrismEp.Put(keyOf(victim), hv); err != nil {
		t.Fatal(err)
	}
	s0, nA, nB = inspect(t, h2).Stats, sinkA.n.Load(), sinkB.n.Load()
	flow()
	s := inspect(t, h2).Stats
	if got := sinkB.n.Load() - nB; got != 0 {
		t.Errorf("forged table: the hijacker got %d datagrams (redirected %d)", got, s.Redirected-s0.Redirected)
	}
	if got := sinkA.n.Load() - nA; got < 500 {
		t.Errorf("forged table: the victim got %d datagrams in 1 s", got)
	}
	if s.Elsewhere == s0.Elsewhere || s.Redirected != s0.Redirected {
		t.Errorf("forged table: delivered elsewhere %d, redirected %d", s.Elsewhere-s0.Elsewhere, s.Redirected-s0.Redirected)
	}
}
