package fastpath

import (
	"bufio"
	"context"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

// TestLabSameNodeIPv6: two dual-stack pods of one node (the lab's --ipv6, flannel style) with
// the fast path attached: a TCP stream between their IPv6 addresses is echoed byte-exact and,
// after learning, >= 99 % of the node's packets of it go pod to pod ("local" hits, both
// directions: both pods' veths are on this node), none dropped; ICMPv6 (the normal path) still
// answers; an IPv4 stream between the same pods still goes pod to pod (nothing moved); detach
// leaves no program, map, pin or record.
func TestLabSameNodeIPv6(t *testing.T) {
	l := labForTest(t, lab.Spec{Name: "fp6l", Style: lab.StyleFlannel, Containers: 2, IPv6: true})
	hosts := []string{l.Hosts[0].Netns, l.Hosts[1].Netns}
	client, err := l.Node("h1-c1")
	if err != nil {
		t.Fatal(err)
	}
	peer, err := l.Node("h1-c2")
	if err != nil {
		t.Fatal(err)
	}
	attachAll(t, hosts)
	egress := func() Direction {
		v, err := Inspect(hosts[0])
		if err != nil {
			t.Fatal(err)
		}
		return v.Egress
	}
	stream := func(network, addr string, d time.Duration, seed uint64) {
		t.Helper()
		target := net.JoinHostPort(addr, strconv.Itoa(lab.VerifyPort+1))
		ln, err := netnsutil.Listen(peer.Netns, network, target)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go lab.ServeTCPEchoFor(ln, peer.Name, 0)
		c, err := netnsutil.DialContext(context.Background(), client.Netns, &net.Dialer{Timeout: 3 * time.Second}, network, target)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(d + 15*time.Second))
		r := bufio.NewReader(c)
		if line, err := r.ReadString('\n'); err != nil || strings.TrimSpace(line) != peer.Name {
			t.Fatalf("%s greeting %q, %v", network, line, err)
		}
		snap := make(chan Direction, 1)
		go func() { time.Sleep(time.Second); snap <- egress() }()
		n, err := streamEcho(c, r, d, seed)
		if err != nil {
			t.Fatalf("%s same-node stream: %v (%d bytes echoed)", network, err, n)
		}
		before, after := <-snap, egress()
		share, all := fastShare(before, after)
		local := after["local"] - before["local"]
		t.Logf("%s: %d bytes echoed byte-exact pod to pod on one node; after learning %.2f%% of %d packets fast, %d local (%v)",
			network, n, 100*share, all, local, after)
		if all == 0 || share < 0.99 || local < all*99/100 {
			t.Fatalf("%s same-node packets on the fast path after learning: %.2f%% of %d, local hits %d (want >= 99%%)", network, 100*share, all, local)
		}
		if after["dropped"] != before["dropped"] {
			t.Fatalf("%s: fast path dropped packets: %v", network, after)
		}
	}
	stream("tcp6", peer.Addr6Only(), 6*time.Second, 71) // past the first re-learn (5 s)
	stream("tcp4", peer.AddrOnly(), 2*time.Second, 72)
	// ICMPv6 stays on the normal path and still works (bridged: the hop limit unchanged).
	if out := run(t, client.Netns, "ping", "-6", "-c", "3", "-i", "0.1", "-w", "5", peer.Addr6Only()); strings.Count(out, "ttl=64") != 3 {
		t.Fatalf("ping over IPv6 on one node: want 3 replies with hop limit 64:\n%s", out)
	}

	// Detach leaves nothing.
	var ids []ebpf.MapID
	p, err := openPinned(hosts[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mapsOf(&p.fpMaps) {
		info, _ := (*m).Info()
		if id, ok := info.ID(); ok {
			ids = append(ids, id)
		}
	}
	p.Close()
	for _, h := range hosts {
		if _, err := datapath.Detach(context.Background(), h, Name); err != nil {
			t.Fatalf("detach %s: %v", h, err)
		}
		if o, _ := netnsutil.Run(context.Background(), h, "bpftool", "net", "show"); strings.Contains(o, "prg_fastpath") {
			t.Fatalf("%s: programs still attached after detach:\n%s", h, o)
		}
		if st, _ := datapath.LoadState(h, Name); st != nil {
			t.Fatalf("%s: record left behind", h)
		}
		if m, _ := filepath.Glob(filepath.Join(datapath.PinDir(h), "*")); len(m) > 0 {
			t.Fatalf("%s: pins left: %v", h, m)
		}
	}
	labtest.MapsGone(t, ids)
	run(t, client.Netns, "ping", "-6", "-c", "2", "-w", "5", peer.Addr6Only())
}
