package endpoints_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/endpoints"
	"github.com/peregrine-net/peregrine/internal/datapath/fastpath"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil/agenttest"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

func TestMain(m *testing.M) { agenttest.Main(m) }

// Issue 28, item 2, for the fast path (prism has its own, internal/datapath/prism): pod B adds
// pod A's address to its eth0 (arp_ignore=8: the normal path still delivers to A). The hijacker
// gets none of A's traffic, A gets all of it: the doubly claimed address has no endpoint, and a
// table forged to name B's veth is overruled by the veth and MAC the fast path learned from the
// normal path.

const hijackPort = 5405

// echo serves UDP echo on addr:port in ns, counting the requests.
func echo(t *testing.T, ns, addr string) *atomic.Int64 {
	t.Helper()
	c := labtest.ListenUDP(t, ns, &net.UDPAddr{IP: net.ParseIP(addr), Port: hijackPort})
	var n atomic.Int64
	go func() {
		buf := make([]byte, 2048)
		for {
			k, from, err := c.ReadFromUDP(buf)
			if err != nil {
				return
			}
			n.Add(1)
			_, _ = c.WriteToUDP(buf[:k], from)
		}
	}()
	return &n
}

// pingPong exchanges datagrams with addr for d (each waits up to 20 ms for its echo) and returns
// how many came back.
func pingPong(t *testing.T, ns, addr string, d time.Duration) int {
	t.Helper()
	var c *net.UDPConn
	if err := netnsutil.Do(ns, func() error {
		var err error
		c, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.ParseIP(addr), Port: hijackPort})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 64)
	ok := 0
	for end := time.Now().Add(d); time.Now().Before(end); {
		_ = c.SetDeadline(time.Now().Add(20 * time.Millisecond))
		if _, err := c.Write(buf); err != nil {
			continue
		}
		if _, err := c.Read(buf); err == nil {
			ok++
		}
	}
	return ok
}

func ingressHits(t *testing.T, host string) uint64 {
	t.Helper()
	v, err := fastpath.Inspect(host)
	if err != nil {
		t.Fatal(err)
	}
	return v.Ingress["hit"]
}

func TestLabFastPathHijack(t *testing.T) {
	l := labtest.Up(t, lab.Spec{Name: "tephj", Style: lab.StyleFlannel, Containers: 2})
	hosts := []string{l.Hosts[0].Netns, l.Hosts[1].Netns}
	h2 := hosts[1]
	c11, _ := l.Node("h1-c1")
	a, _ := l.Node("h2-c1")
	b, _ := l.Node("h2-c2")
	victim := a.AddrOnly()
	attach := func(agent string) {
		t.Helper()
		for _, h := range hosts {
			if _, err := datapath.Attach(context.Background(), h, fastpath.Name, datapath.Options{Extra: map[string]string{"agent": agent}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	detach := func() {
		for _, h := range hosts {
			_, _ = datapath.Detach(context.Background(), h, "")
		}
	}
	t.Cleanup(detach)
	toA := echo(t, a.Netns, victim)
	attach("true")
	hit0 := ingressHits(t, h2)
	if n := pingPong(t, c11.Netns, victim, time.Second); n < 100 || ingressHits(t, h2) == hit0 {
		t.Fatalf("before the attack: %d echoes, ingress hits %d -> %d", n, hit0, ingressHits(t, h2))
	}

	for _, args := range [][]string{{"sysctl", "-qw", "net.ipv4.conf.eth0.arp_ignore=8"}, {"ip", "addr", "add", victim + "/32", "dev", "eth0"}} {
		if out, err := netnsutil.Run(context.Background(), b.Netns, args...); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	toB := echo(t, b.Netns, victim)
	labtest.Eventually(t, 5*time.Second, "the agent refuses the doubly claimed address", func() (bool, string) {
		v, err := fastpath.Inspect(h2)
		if err != nil {
			return false, err.Error()
		}
		for _, e := range v.Endpoints {
			if e.Addr == victim {
				return false, fmt.Sprintf("%+v", e)
			}
		}
		return true, ""
	})
	nA, nB := toA.Load(), toB.Load()
	n := pingPong(t, c11.Netns, victim, time.Second)
	if got := toB.Load() - nB; got != 0 {
		t.Errorf("the hijacker got %d of the victim's datagrams", got)
	}
	if got := toA.Load() - nA; got < 100 || n < 100 {
		t.Errorf("the victim got %d datagrams (%d echoes)", got, n)
	}

	// No agent, and a table forged to name the hijacker's veth for the victim's address.
	detach()
	attach("false")
	ep, err := ebpf.LoadPinnedMap(filepath.Join(datapath.ModePinDir(h2, fastpath.Name), "prg_fastpath_ep"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	var bk endpoints.Key
	var bv endpoints.Entry
	found := false
	for it := ep.Iterate(); it.Next(&bk, &bv); {
		if endpoints.WordsAddr(bk.Family, bk.Addr) == netip.MustParseAddr(b.AddrOnly()) {
			found = true
			break
		}
	}
	if !found {
		t.Fatal("no endpoint for the hijacker's own address")
	}
	ak := endpoints.Endpoint{Domain: bk.Netns, Addr: netip.MustParseAddr(victim)}.Key()
	if err := ep.Put(ak, bv); err != nil {
		t.Fatal(err)
	}
	nA, nB = toA.Load(), toB.Load()
	n = pingPong(t, c11.Netns, victim, 1500*time.Millisecond)
	if got := toB.Load() - nB; got != 0 {
		t.Errorf("forged table: the hijacker got %d of the victim's datagrams", got)
	}
	if got := toA.Load() - nA; got < 100 || n < 100 {
		t.Errorf("forged table: the victim got %d datagrams (%d echoes)", got, n)
	}
}
