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

// TestLabIPv6: dual-stack pods (the lab's --ipv6: IPv6 inside flannel.1, its IPv4 underlay
// outside). Attach serves both addresses of each pod; a TCP stream between two pods' IPv6
// addresses is echoed byte-exact past its first re-learn, with INVALID dropped as kube-proxy
// does, with, after learning, at least 99 % of each direction's packets on the fast path on
// both nodes and none dropped; IPv4 still works beside it; detach
// leaves no program, map, pin or record.
func TestLabIPv6(t *testing.T) {
	l := labForTest(t, lab.Spec{Name: "fp6", Style: lab.StyleFlannel, Containers: 1, IPv6: true})
	hosts := []string{l.Hosts[0].Netns, l.Hosts[1].Netns}
	c1, c2 := l.Containers[0], l.Containers[1]
	target := net.JoinHostPort(c2.Addr6Only(), strconv.Itoa(lab.VerifyPort))
	ln, err := netnsutil.Listen(c2.Netns, "tcp6", target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go lab.ServeTCPEchoFor(ln, c2.Name, 0)
	attachAll(t, hosts)
	for i, h := range hosts {
		v, err := Inspect(h)
		if err != nil {
			t.Fatal(err)
		}
		want := l.Containers[i].Addr6Only()
		found := false
		for _, p := range v.Overlays[0].Pods {
			found = found || p.Addr == want
		}
		if !found {
			t.Fatalf("%s: attached, but pod address %s is not served: %+v", h, want, v.Overlays[0].Pods)
		}
	}
	counters := func(h string) (Direction, Direction) {
		v, err := Inspect(h)
		if err != nil {
			t.Fatal(err)
		}
		return v.Egress, v.Ingress
	}

	// As kube-proxy's KUBE-FORWARD does: INVALID packets are dropped. A long flow's re-learn
	// packet (every 5 s) meets conntrack far beyond its window: only the agent's liberal
	// marking of the IPv6 entry (ctliberal6.go) lets it through, or the stream stalls.
	for _, h := range hosts {
		run(t, h, "ip6tables", "-A", "FORWARD", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP")
	}
	c, err := netnsutil.DialContext(context.Background(), c1.Netns, &net.Dialer{Timeout: 3 * time.Second}, "tcp6", target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(25 * time.Second))
	r := bufio.NewReader(c)
	if line, err := r.ReadString('\n'); err != nil || strings.TrimSpace(line) != c2.Name {
		t.Fatalf("greeting %q, %v", line, err)
	}
	type snapshot struct{ eg, in [2]Direction }
	snap := make(chan snapshot, 1)
	go func() {
		time.Sleep(time.Second) // learned by then: the handshake and the first segments
		var s snapshot
		for i, h := range hosts {
			s.eg[i], s.in[i] = counters(h)
		}
		snap <- s
	}()
	n, err := streamEcho(c, r, 7*time.Second, 61) // past the first re-learn (5 s)
	c.Close()
	if err != nil {
		t.Fatalf("stream between IPv6 pods: %v (%d bytes echoed)", err, n)
	}
	before := <-snap
	for i, h := range hosts {
		eg, in := counters(h)
		sOut, allOut := fastShare(before.eg[i], eg)
		sIn, allIn := fastShare(before.in[i], in)
		t.Logf("%s: %d bytes echoed byte-exact; after learning egress %.2f%% of %d, ingress %.2f%% of %d packets fast",
			h, n, 100*sOut, allOut, 100*sIn, allIn)
		if sOut < 0.99 || sIn < 0.99 || allOut == 0 || allIn == 0 {
			t.Fatalf("%s: established IPv6 stream on the fast path: egress %.2f%% of %d, ingress %.2f%% of %d (want >= 99%%)\negress %v\ningress %v",
				h, 100*sOut, allOut, 100*sIn, allIn, eg, in)
		}
		if eg["dropped"]+in["dropped"] > 0 {
			t.Fatalf("%s: fast path dropped packets: egress %v ingress %v", h, eg, in)
		}
	}
	// Both families beside each other: ICMPv6 (normal path) with the hop limit of two routed
	// hops, and IPv4.
	if out := run(t, c1.Netns, "ping", "-6", "-c", "3", "-i", "0.1", "-w", "5", c2.Addr6Only()); strings.Count(out, "ttl=62") != 3 {
		t.Fatalf("ping over IPv6: want 3 replies with hop limit 62:\n%s", out)
	}
	run(t, c1.Netns, "ping", "-c", "3", "-i", "0.1", "-w", "5", c2.AddrOnly())

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
	run(t, c1.Netns, "ping", "-6", "-c", "2", "-w", "5", c2.Addr6Only())
}

// TestLabIPv6Underlay: the dual-stack layout of real flannel (--ipv6-underlay: the pods' IPv6
// on flannel-v6.1 over IPv6 addresses of eth0). The fast path receives over it (strips outer
// IPv6 + UDP + VXLAN on eth0's ingress) and sends over it (hands the inner frame to flannel-v6.1
// with the MACs its FDB forwards by): an IPv6 stream between the pods is byte-exact with >= 99 %
// of node A's sent segments and received echoes on the fast path, none dropped; with outer
// checksums computed in software and verified by node B's kernel none is wrong; an IPv4 stream
// beside it still takes the fast path both ways, and detach leaves nothing attached.
func TestLabIPv6Underlay(t *testing.T) {
	l := labForTest(t, lab.Spec{Name: "fp6u", Style: lab.StyleFlannel, Containers: 1, IPv6: true, IPv6Underlay: true})
	hosts := []string{l.Hosts[0].Netns, l.Hosts[1].Netns}
	c1, c2 := l.Containers[0], l.Containers[1]
	attachAll(t, hosts)
	v, err := Inspect(hosts[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("attached: %s", v.Format())
	stream := func(network, addr string, seed uint64) (Direction, Direction, int64) {
		target := net.JoinHostPort(addr, strconv.Itoa(lab.VerifyPort))
		ln, err := netnsutil.Listen(c2.Netns, network, target)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go lab.ServeTCPEchoFor(ln, c2.Name, 0)
		c, err := netnsutil.DialContext(context.Background(), c1.Netns, &net.Dialer{Timeout: 3 * time.Second}, network, target)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		r := bufio.NewReader(c)
		if line, err := r.ReadString('\n'); err != nil || strings.TrimSpace(line) != c2.Name {
			t.Fatalf("%s greeting %q, %v", network, line, err)
		}
		eg0, in0 := counters(t, hosts[0])
		n, err := streamEcho(c, r, 2*time.Second, seed)
		if err != nil {
			t.Fatalf("%s stream: %v (%d bytes echoed)", network, err, n)
		}
		eg, in := counters(t, hosts[0])
		for k := range eg {
			eg[k] -= eg0[k]
		}
		for k := range in {
			in[k] -= in0[k]
		}
		return eg, in, n
	}
	// What the vxlan driver forwards by: the remote VTEP's MAC in flannel-v6.1's FDB (to its
	// IPv6 address) and in its neighbour table (the route's gateway). tx_u6 gives the inner
	// frame that MAC, learned from the kernel's own frame.
	dev, mac1, vtep1 := l.Spec.FlannelV6(), l.Spec.VTEPMAC6(2).String(), l.Spec.HostAddr6(2).Addr().String() // h2
	fdb := run(t, hosts[0], "bridge", "fdb", "show", "dev", dev)
	neigh := run(t, hosts[0], "ip", "-6", "neigh", "show", "dev", dev)
	t.Logf("%s FDB:\n%s%s neighbours:\n%s", dev, fdb, dev, neigh)
	if !strings.Contains(fdb, mac1+" dst "+vtep1) || !strings.Contains(neigh, mac1) {
		t.Fatalf("%s: no FDB entry %s dst %s or neighbour with that MAC", dev, mac1, vtep1)
	}
	enc0 := u6Encapsulated(t, hosts[0])
	eg, in, n := stream("tcp6", c2.Addr6Only(), 62)
	enc := u6Encapsulated(t, hosts[0]) - enc0
	t.Logf("IPv6 over the IPv6 underlay: %d bytes echoed byte-exact; egress %v (%d encapsulated in the program), ingress %v", n, eg, enc, in)
	// The packets that are not GSO (the pod's ACKs, short segments) are encapsulated by tx_u6
	// itself (tx_u6_encap), the rest by flannel-v6.1's driver.
	if enc == 0 {
		t.Fatalf("IPv6 underlay: no packet encapsulated in the program (%d hits)", eg["hit"])
	}
	// Both halves (bpf/fastpath_u6.h): node A's egress hands the stream to flannel-v6.1 (tx_u6),
	// its ingress decapsulates the echoes (rx_u6).
	if eg["dropped"]+in["dropped"] != 0 {
		t.Fatalf("IPv6 underlay: egress %v ingress %v: want none dropped", eg, in)
	}
	if seen := eg["hit"] + eg["miss"] + eg["stale"]; eg["hit"] == 0 || eg["hit"]*100 < seen*99 {
		t.Fatalf("IPv6 underlay: egress %v: want >= 99%% of the stream on the fast path", eg)
	}
	if seen := in["hit"] + in["miss"] + in["stale"]; in["hit"] == 0 || in["hit"]*100 < seen*99 {
		t.Fatalf("IPv6 underlay: ingress %v: want >= 99%% of the echoes on the fast path", in)
	}
	u6NeighForgets(t, l, hosts[0])
	eg, in, n = stream("tcp4", c2.AddrOnly(), 63)
	if eg["hit"] == 0 || in["hit"] == 0 || eg["dropped"]+in["dropped"] != 0 {
		t.Fatalf("IPv4 beside it: %d bytes, egress %v ingress %v: want hits both ways, none dropped", n, eg, in)
	}
	// The outer UDP checksum of what tx_u6 sends, checked by a kernel: node B detached (its
	// flannel-v6.1 and UDP receive verify every frame) and node A's eth0 without checksum
	// offload (each outer checksum computed in software before it leaves, none left partial
	// for a veth to skip). A wrong checksum would fail the stream and count in Udp6InCsumErrors.
	if _, err := datapath.Detach(context.Background(), hosts[1], Name); err != nil {
		t.Fatalf("detach %s: %v", hosts[1], err)
	}
	run(t, hosts[0], "ethtool", "-K", "eth0", "tx", "off")
	csumErrs := func() string {
		for _, line := range strings.Split(run(t, hosts[1], "cat", "/proc/net/snmp6"), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == "Udp6InCsumErrors" {
				return f[1]
			}
		}
		t.Fatal("no Udp6InCsumErrors in /proc/net/snmp6")
		return ""
	}
	e0, enc0 := csumErrs(), u6Encapsulated(t, hosts[0])
	eg, in, n = stream("tcp6", c2.Addr6Only(), 64)
	enc = u6Encapsulated(t, hosts[0]) - enc0
	t.Logf("software outer checksums, node B on the normal path: %d bytes; egress %v (%d encapsulated in the program)", n, eg, enc)
	if e := csumErrs(); e != e0 || eg["hit"] == 0 || eg["hit"]*100 < (eg["hit"]+eg["miss"]+eg["stale"])*99 {
		t.Fatalf("software checksums: Udp6InCsumErrors %s -> %s, egress %v: want no errors, >= 99%% hits", e0, e, eg)
	}
	// Among them frames whose outer headers and checksum the program wrote (tx_u6_encap):
	// accepted by node B's plain vxlan driver (the stream is byte-exact, no checksum error).
	if enc == 0 {
		t.Fatalf("software checksums: no packet encapsulated in the program (egress %v)", eg)
	}
	if _, err := datapath.Detach(context.Background(), hosts[0], Name); err != nil {
		t.Fatalf("detach %s: %v", hosts[0], err)
	}
	for _, h := range hosts {
		if o, _ := netnsutil.Run(context.Background(), h, "bpftool", "net", "show"); strings.Contains(o, "prg_fastpath") {
			t.Fatalf("%s: programs still attached after detach:\n%s", h, o)
		}
	}
}

// u6NeighForgets: a neighbour change on flannel-v6.1 (whose MAC tx_u6 sends by) makes node h's
// agent forget the IPv6 flows within a second, as flannel.1's does (TestInvalidation); a
// connection open across the change goes on byte-exact.
func u6NeighForgets(t *testing.T, l *lab.Lab, h string) {
	t.Helper()
	c1, c2 := l.Containers[0], l.Containers[1]
	// The IPv6 flows learned over flannel-v6.1 under the overlay's current generation, and it.
	learned := func() (int, uint32) {
		p, err := openPinned(h)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		var c fpFpCfg
		if err := p.PrgFastpathCfg.Lookup(uint32(0), &c); err != nil {
			t.Fatal(err)
		}
		var k fpFpKey6
		var f fpFpFlow
		n := 0
		for it := p.PrgFastpathFlow6.Iterate(); it.Next(&k, &f); {
			if f.Flags&(fOut|fIn|fU6) == fOut|fIn|fU6 && f.Gen == c.Gen {
				n++
			}
		}
		return n, c.Gen
	}
	target := net.JoinHostPort(c2.Addr6Only(), strconv.Itoa(lab.VerifyPort+1))
	ln, err := netnsutil.Listen(c2.Netns, "tcp6", target)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go lab.ServeTCPEchoFor(ln, c2.Name, 0)
	c, err := netnsutil.DialContext(context.Background(), c1.Netns, &net.Dialer{Timeout: 3 * time.Second}, "tcp6", target)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	if line, err := r.ReadString('\n'); err != nil || strings.TrimSpace(line) != c2.Name {
		t.Fatalf("greeting %q, %v", line, err)
	}
	// One stream across the change (streamEcho half-closes at its end).
	type res struct {
		n   int64
		err error
	}
	done := make(chan res, 1)
	go func() {
		n, err := streamEcho(c, r, 1500*time.Millisecond, 65)
		done <- res{n, err}
	}()
	time.Sleep(300 * time.Millisecond)
	n0, gen0 := learned()
	if n0 == 0 {
		t.Fatal("no IPv6 flow learned over flannel-v6.1 before the change")
	}
	dev, gw := l.Spec.FlannelV6(), l.Spec.FlannelAddr6(2).Addr().String()
	run(t, h, "ip", "-6", "neigh", "replace", gw, "lladdr", "06:00:00:00:00:99", "dev", dev, "nud", "permanent")
	run(t, h, "ip", "-6", "neigh", "replace", gw, "lladdr", l.Spec.VTEPMAC6(2).String(), "dev", dev, "nud", "permanent")
	// The agent forgets by a new generation; the stream's next packets re-learn under it from
	// the normal path (so a count of learned flows alone would race with them).
	deadline := time.Now().Add(time.Second)
	for _, gen := learned(); gen == gen0; _, gen = learned() {
		if time.Now().After(deadline) {
			t.Fatalf("IPv6 flows not forgotten 1 s after a neighbour change on %s", dev)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if x := <-done; x.err != nil {
		t.Fatalf("stream across the change: %v (%d bytes)", x.err, x.n)
	}
}

// u6Encapsulated is prg_fastpath_u6enc of host h: the packets tx_u6 encapsulated itself.
func u6Encapsulated(t *testing.T, h string) uint64 {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(datapath.ModePinDir(h, Name), "prg_fastpath_u6enc"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var per []uint64
	if err := m.Lookup(uint32(0), &per); err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, x := range per {
		n += x
	}
	return n
}

func counters(t *testing.T, h string) (Direction, Direction) {
	t.Helper()
	v, err := Inspect(h)
	if err != nil {
		t.Fatal(err)
	}
	eg, in := Direction{}, Direction{}
	for k, x := range v.Egress {
		eg[k] = x
	}
	for k, x := range v.Ingress {
		in[k] = x
	}
	return eg, in
}
