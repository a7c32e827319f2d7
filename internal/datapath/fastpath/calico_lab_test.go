package fastpath

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

// calicoLab builds scripts/handbuilt-calico.sh's layout with pods pods per node.
func calicoLab(t *testing.T, name string, pods int) []string {
	t.Helper()
	_, hosts, _ := labtest.ScriptLab(t, "../../../scripts/handbuilt-calico.sh", name, 2, nil, strconv.Itoa(pods))
	return hosts
}

// TestCalicoLike: Calico's routed /32 pods (cali* veths with MAC ee:ee:ee:ee:ee:ee and proxy
// ARP, no bridge, vxlan.calico VNI 4096) take the fast path: attach finds the pods by their /32
// routes, an established TCP stream across the nodes is echoed byte-exact with at least 99 % of
// its packets on the fast path both ways after learning, pods of one node take it too (one routed
// hop's TTL), identity is the host's route (calicoIdentity), a pod added later is served
// (calicoNewPod), and detach leaves no program, pin or record, the overlay working as before.
func TestCalicoLike(t *testing.T) {
	hosts := calicoLab(t, "fca", 2)
	run(t, "prg-fca-n1-p1", "ping", "-c", "1", "-W", "1", "10.65.2.2")
	serveNamedEcho(t, lab.Node{Name: "n2-p1", Netns: "prg-fca-n2-p1", Addr: "10.65.2.2/32"})
	attachAll(t, hosts)
	for _, h := range hosts {
		v, err := Inspect(h)
		if err != nil {
			t.Fatal(err)
		}
		if v.Layout != LayoutRouted || v.VXLAN != h+"/vxlan.calico" || v.Underlay != h+"/eth0" || len(v.Overlays) != 1 || len(v.Overlays[0].Pods) != 2 {
			t.Fatalf("%s: attached, but not to the Calico layout's two pods: %s\n%+v", h, v.Format(), v.Overlays)
		}
		for _, p := range v.Overlays[0].Pods {
			if !strings.HasPrefix(p.Veth, "cali") {
				t.Fatalf("%s: pod %s on %s, want a cali* veth", h, p.Addr, p.Veth)
			}
		}
	}
	both := func() (Direction, Direction) {
		v, err := Inspect(hosts[0])
		if err != nil {
			t.Fatal(err)
		}
		return v.Egress, v.Ingress
	}
	c, r, name := labtest.DialNamed(t, "prg-fca-n1-p1", "10.65.2.2:"+strconv.Itoa(lab.VerifyPort), 20*time.Second)
	if name != "n2-p1" {
		t.Fatalf("greeted by %q, want n2-p1", name)
	}
	type snapshot struct{ eg, in Direction }
	snap := make(chan snapshot, 1)
	go func() { time.Sleep(time.Second); e, i := both(); snap <- snapshot{e, i} }()
	n, err := streamEcho(c, r, 3*time.Second, 29)
	c.Close()
	if err != nil {
		t.Fatalf("stream across the Calico overlay: %v (%d bytes echoed)", err, n)
	}
	before := <-snap
	eg, in := both()
	sOut, allOut := fastShare(before.eg, eg)
	sIn, allIn := fastShare(before.in, in)
	t.Logf("%d bytes echoed byte-exact; after learning egress %.2f%% of %d, ingress %.2f%% of %d packets fast", n, 100*sOut, allOut, 100*sIn, allIn)
	if sOut < 0.99 || sIn < 0.99 || allOut == 0 || allIn == 0 {
		t.Fatalf("established stream on the fast path: egress %.2f%% of %d, ingress %.2f%% of %d (want >= 99%%)\negress %v\ningress %v",
			100*sOut, allOut, 100*sIn, allIn, eg, in)
	}
	if eg["dropped"]+in["dropped"] > 0 {
		t.Fatalf("fast path dropped packets: egress %v ingress %v", eg, in)
	}
	// ICMP both ways, and pods of one node (routed through the node, TTL lowered once).
	run(t, "prg-fca-n2-p1", "ping", "-c", "5", "-i", "0.1", "-w", "5", "10.65.1.2")
	l0, _ := both()
	out := run(t, "prg-fca-n1-p1", "ping", "-c", "5", "-i", "0.1", "-w", "5", "10.65.1.3")
	if strings.Count(out, "ttl=63") != 5 {
		t.Fatalf("same-node ping: want 5 replies at ttl=63 (one routed hop):\n%s", out)
	}
	if l1, _ := both(); l1["local"] <= l0["local"] {
		t.Fatalf("same-node pods never took the fast path: egress %v -> %v", l0, l1)
	}

	calicoIdentity(t, hosts[0])
	calicoNewPod(t, hosts[0])

	// Detach leaves nothing: no program on any device, no pin, no record.
	detachLeavesNothing(t, hosts...)
	run(t, "prg-fca-n1-p1", "ping", "-c", "2", "-w", "5", "10.65.2.2")
}

// TestNoPodsWarns: an overlay with no pod at all attaches (pods may come later) but says so,
// naming what it looked for.
func TestNoPodsWarns(t *testing.T) {
	hosts := calicoLab(t, "fcz", 0)
	st, err := datapath.Attach(context.Background(), hosts[0], Name, datapath.Options{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, n := range st.Topology.Notes {
		if strings.Contains(n, "vxlan.calico") && strings.Contains(n, "no pods found") && strings.Contains(n, "looked for veths on a bridge in "+hosts[0]) {
			found = true
		}
	}
	if !found {
		t.Fatalf("attach with no pods gave no warning naming what it looked for: %q", st.Topology.Notes)
	}
}

// calicoPods is host's pods as status shows them: address -> veth.
func calicoPods(t *testing.T, host string) map[string]string {
	t.Helper()
	v, err := Inspect(host)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, p := range v.Overlays[0].Pods {
		m[p.Addr] = p.Veth
	}
	return m
}

// calicoIdentity checks who a pod is on node host of TestCalicoLike's lab: the host's /32 route,
// not the pod's word. A pod that puts its neighbour's address (10.65.1.2) on its own eth0 changes
// nothing; a second /32 route to another veth for that address (a higher metric: the normal path
// still delivers by the first) makes it doubly claimed, so it is refused and its traffic is left to
// the normal path (counted no-pod), which still delivers it.
func calicoIdentity(t *testing.T, host string) {
	t.Helper()
	pods := func() map[string]string { return calicoPods(t, host) }
	in := func() Direction {
		v, err := Inspect(host)
		if err != nil {
			t.Fatal(err)
		}
		return v.Ingress
	}
	before := pods()
	victim, other := before["10.65.1.2"], before["10.65.1.3"]
	if victim == "" || other == "" || victim == other {
		t.Fatalf("pods of %s: %v", host, before)
	}
	run(t, "prg-fca-n1-p2", "ip", "addr", "add", "10.65.1.2/32", "dev", "eth0")
	time.Sleep(1500 * time.Millisecond) // the agent re-reads every second
	if now := pods(); now["10.65.1.2"] != victim {
		t.Fatalf("a pod claiming its neighbour's address on its eth0 moved it: %v -> %v", before, now)
	}
	i0 := in()
	run(t, "prg-fca-n2-p1", "ping", "-c", "5", "-i", "0.1", "-w", "5", "10.65.1.2")
	if i1 := in(); i1["hit"] <= i0["hit"] {
		t.Fatalf("10.65.1.2 lost the fast path after a pod's false claim: ingress %v -> %v", i0, i1)
	}
	run(t, host, "ip", "route", "add", "10.65.1.2/32", "dev", other, "scope", "link", "metric", "100")
	labtest.Eventually(t, 2500*time.Millisecond, "the doubly routed address refused", func() (bool, string) {
		now := pods()
		_, held := now["10.65.1.2"]
		return !held && now["10.65.1.3"] == other, fmt.Sprint(now)
	})
	// Refused: no delivery (no-pod), and its replies, from an address no pod holds now, neither
	// make nor change a flow (no-src, src_refused): the flow is not even learned.
	out := func() Direction {
		v, err := Inspect(host)
		if err != nil {
			t.Fatal(err)
		}
		return v.Egress
	}
	i0, e0 := in(), out()
	run(t, "prg-fca-n2-p1", "ping", "-c", "5", "-i", "0.1", "-w", "5", "10.65.1.2")
	if i1, e1 := in(), out(); i1["hit"] != i0["hit"] || (i1["no-pod"] <= i0["no-pod"] && e1["no-src"] <= e0["no-src"]) {
		t.Fatalf("a doubly routed address still delivered by the fast path: ingress %v -> %v, egress %v -> %v", i0, i1, e0, e1)
	}
	run(t, host, "ip", "route", "del", "10.65.1.2/32", "dev", other, "metric", "100")
}

// calicoNewPod adds a pod to node host after attach, as the Calico CNI plugin does (a cali veth
// with the gateway MAC and proxy ARP, a /32 route), and removes it: the agent serves it within
// its resync, with the fast path, and forgets it when its veth goes.
func calicoNewPod(t *testing.T, host string) {
	t.Helper()
	const ns, veth, addr = "prg-fca-n1-p9", "caliprgnew9", "10.65.1.10"
	pods := func() map[string]string { return calicoPods(t, host) }
	run(t, "", "ip", "netns", "add", ns)
	t.Cleanup(func() { _ = netnsutil.Delete(ns) })
	for _, c := range [][]string{
		{host, "ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{host, "ip", "link", "set", veth, "address", "ee:ee:ee:ee:ee:ee", "mtu", "1450", "up"},
		{host, "sysctl", "-qw", "net.ipv4.conf." + veth + ".proxy_arp=1", "net.ipv4.neigh." + veth + ".proxy_delay=0"},
		{host, "ip", "route", "add", addr + "/32", "dev", veth, "scope", "link"},
		{ns, "ip", "addr", "add", addr + "/32", "dev", "eth0"},
		{ns, "ip", "link", "set", "eth0", "mtu", "1450", "up"},
		{ns, "ip", "route", "add", "169.254.1.1", "dev", "eth0", "scope", "link"},
		{ns, "ip", "route", "add", "default", "via", "169.254.1.1", "dev", "eth0"},
	} {
		run(t, c[0], c[1:]...)
	}
	// Served: in the pod table and its veth's programs attached. The agent fills the table
	// first, then attaches; a ping in between (a loaded machine) is learned by neither link.
	labtest.Eventually(t, 2500*time.Millisecond, "the new pod served", func() (bool, string) {
		now := pods()
		links, _ := filepath.Glob(filepath.Join(datapath.ModePinDir(host, Name), linksSub, "*_"+veth+"_*"))
		return now[addr] == veth && len(links) == 2, fmt.Sprintf("pods %v, links of %s %v", now, veth, links)
	})
	v0, err := Inspect(host)
	if err != nil {
		t.Fatal(err)
	}
	run(t, "prg-fca-n2-p1", "ping", "-c", "5", "-i", "0.1", "-w", "5", addr)
	v1, err := Inspect(host)
	if err != nil {
		t.Fatal(err)
	}
	if v1.Ingress["hit"] <= v0.Ingress["hit"] || v1.Egress["hit"] <= v0.Egress["hit"] {
		t.Fatalf("a pod added after attach took no fast path: egress %v -> %v, ingress %v -> %v", v0.Egress, v1.Egress, v0.Ingress, v1.Ingress)
	}
	if err := netnsutil.Delete(ns); err != nil {
		t.Fatal(err)
	}
	labtest.Eventually(t, 5*time.Second, "the removed pod forgotten", func() (bool, string) {
		now := pods()
		_, held := now[addr]
		return !held, fmt.Sprint(now)
	})
}
