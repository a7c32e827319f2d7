package fastpath

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/metrics"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil"
	"github.com/peregrine-net/peregrine/internal/testutil/agenttest"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

// The tests attach modes whose agents are started as this test binary.
func TestMain(m *testing.M) { agenttest.Main(m) }

// labForTest brings spec's lab up for the test: at its end everything attached to h1 and h2
// is detached, the lab goes down and nothing of it is left.
func labForTest(t *testing.T, spec lab.Spec) *lab.Lab {
	t.Helper()
	l := labtest.Up(t, spec)
	labtest.DetachAtEnd(t, labtest.NS(l, "h1"), labtest.NS(l, "h2"))
	return l
}

// run runs argv in a namespace and returns its output (labtest.Run).
var run = labtest.Run

func attachAll(t *testing.T, hosts []string) {
	t.Helper()
	for _, h := range hosts {
		if _, err := datapath.Attach(context.Background(), h, Name, datapath.Options{}); err != nil {
			t.Fatalf("attach %s: %v", h, err)
		}
	}
}

func hits(t *testing.T, host string) (uint64, uint64) {
	t.Helper()
	v, err := Inspect(host)
	if err != nil {
		t.Fatal(err)
	}
	return v.Egress["hit"], v.Ingress["hit"]
}

// TestLabFastPath runs the integration checks on both layouts, 2 hosts x 2 containers.
func TestLabFastPath(t *testing.T) {
	for _, style := range []string{lab.StyleFlannel, lab.StyleDocker} {
		t.Run(style, func(t *testing.T) {
			spec := lab.Spec{Name: "fpt" + style[:1], Style: style, Containers: 2}
			l := labForTest(t, spec)
			hosts := []string{l.Hosts[0].Netns, l.Hosts[1].Netns}
			c11, c21 := l.Containers[0], l.Containers[2]
			dst := strings.Split(c21.Addr, "/")[0]

			// A TCP transfer that spans attach and detach completes.
			run(t, c21.Netns, "iperf3", "-s", "-D", "-1", "-p", "5301")
			waitListening(t, c21.Netns, 5301)
			done := make(chan error, 1)
			var out string
			go func() {
				o, err := netnsutil.Run(context.Background(), c11.Netns, "iperf3", "-c", dst, "-p", "5301", "-t", "4")
				out = o
				done <- err
			}()
			// Attach while the transfer runs: once its data connection is up.
			labtest.Eventually(t, 3*time.Second, "iperf3's control and data connections", func() (bool, string) {
				o, err := netnsutil.Run(context.Background(), c11.Netns, "ss", "-Htn", "state", "established", "dport = :5301")
				return err == nil && strings.Count(strings.TrimSpace(o), "\n") >= 1, o
			})
			attachAll(t, hosts)
			var eg, in uint64
			labtest.Eventually(t, 2500*time.Millisecond, "the running transfer takes the fast path", func() (bool, string) {
				eg, in = hits(t, hosts[0])
				return eg > 0 && in > 0, fmt.Sprintf("egress hits %d, ingress hits %d", eg, in)
			})
			for _, h := range hosts {
				if _, err := datapath.Detach(context.Background(), h, Name); err != nil {
					t.Fatalf("detach %s: %v", h, err)
				}
			}
			if err := <-done; err != nil || !strings.Contains(out, "receiver") {
				t.Fatalf("transfer across attach/detach failed: %v\n%s", err, out)
			}
			if eg == 0 || in == 0 {
				t.Fatalf("the transfer never took the fast path while attached (egress hits %d, ingress hits %d)", eg, in)
			}

			// TCP, UDP and ICMP with the fast path on both hosts.
			attachAll(t, hosts)
			run(t, c11.Netns, "ping", "-c", "5", "-i", "0.1", "-w", "5", dst)
			run(t, c21.Netns, "iperf3", "-s", "-D", "-1", "-p", "5302")
			waitListening(t, c21.Netns, 5302)
			run(t, c11.Netns, "iperf3", "-c", dst, "-p", "5302", "-t", "1")
			run(t, c21.Netns, "iperf3", "-s", "-D", "-1", "-p", "5303")
			waitListening(t, c21.Netns, 5303)
			o := run(t, c11.Netns, "iperf3", "-u", "-b", "50M", "-c", dst, "-p", "5303", "-t", "1")
			if !strings.Contains(o, "receiver") {
				t.Fatalf("udp: %s", o)
			}
			for _, h := range hosts {
				v, err := Inspect(h)
				if err != nil {
					t.Fatal(err)
				}
				if v.Egress["hit"] == 0 || v.Ingress["hit"] == 0 || v.Both == 0 {
					t.Fatalf("%s: no fast path traffic: %s", h, v.Format())
				}
				if v.Egress["dropped"]+v.Ingress["dropped"] > 0 {
					t.Fatalf("%s: fast path dropped packets: %s", h, v.Format())
				}
			}

			{
				// flannel: a new MAC (routed: only the node sees it); docker derives the MAC from
				// the address, so a re-created container has the same MAC on a new veth.
				recreatePod(t, l, spec)
				// The agent has a second to notice; the next packets must reach the new pod.
				before, _ := hitsIn(t, hosts[1])
				run(t, c11.Netns, "ping", "-c", "10", "-i", "0.2", "-w", "5", dst)
				after, _ := hitsIn(t, hosts[1])
				if after <= before {
					t.Fatalf("re-created pod never got fast-path packets (ingress hits %d -> %d)", before, after)
				}
			}

			// Detach leaves no program, map or pin.
			ids := pinnedMapIDs(t, hosts[0])
			detachLeavesNothing(t, hosts...)
			labtest.MapsGone(t, ids)
		})
	}
}

func hitsIn(t *testing.T, host string) (uint64, uint64) {
	eg, in := hits(t, host)
	return in, eg
}

// recreatePod deletes h2-c1's veth (the pod's network goes) and makes a new one with the same
// address, as a CNI re-creating the pod would: a new MAC in the flannel style, Docker's
// address-derived MAC in the docker style.
func recreatePod(t *testing.T, l *lab.Lab, spec lab.Spec) {
	t.Helper()
	h2, c := l.Hosts[1].Netns, l.Containers[2]
	addr := strings.Split(c.Addr, "/")[0]
	oldIdx := endpointIfindex(t, h2, addr)
	brNs, br, mac := h2, "cni0", "02:42:c6:13:02:99"
	if spec.Style == lab.StyleDocker {
		brNs, br, mac = h2+"-ov", "br0", l.Spec.ContainerMAC(2, 1).String()
	}
	mtu := fmt.Sprint(l.Spec.MTU - 50)
	run(t, brNs, "ip", "link", "del", "veth1")
	run(t, brNs, "ip", "link", "add", "veth1", "type", "veth", "peer", "name", "eth0", "netns", c.Netns)
	run(t, c.Netns, "ip", "link", "set", "eth0", "address", mac, "mtu", mtu)
	run(t, brNs, "ip", "link", "set", "veth1", "master", br, "mtu", mtu, "up")
	run(t, c.Netns, "ip", "addr", "add", c.Addr, "dev", "eth0")
	run(t, c.Netns, "ip", "link", "set", "eth0", "up")
	if spec.Style == lab.StyleFlannel {
		gw := l.Spec.GatewayAddr(2).Addr().String()
		run(t, c.Netns, "ip", "route", "add", "default", "via", gw)
		// Announce the new MAC as a CNI does (the bridge plugin sends a gratuitous ARP): the
		// node's neighbour entry for the address still holds the old pod's MAC, and the normal
		// path would send there until it expires — seconds in which nothing, fast path or not,
		// reaches the new pod. The pod's ARP request for its gateway updates that entry.
		run(t, c.Netns, "ping", "-c", "1", "-W", "1", gw)
	}
	// The agent's bound is 1 s (with a margin for a busy machine): the pod's entry moves to its
	// new veth.
	labtest.Eventually(t, 1500*time.Millisecond, "the agent follows the re-created pod", func() (bool, string) {
		idx := endpointIfindex(t, h2, addr)
		return idx != 0 && idx != oldIdx, fmt.Sprintf("endpoint %s: ifindex %d (was %d)", addr, idx, oldIdx)
	})
}

// endpointIfindex is the device the host's fast path delivers addr to (0: none, or gone).
func endpointIfindex(t *testing.T, host, addr string) uint32 {
	t.Helper()
	v, err := Inspect(host)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range v.Endpoints {
		if e.Addr == addr && !e.Gone {
			return e.Ifindex
		}
	}
	return 0
}

// waitListening waits until a TCP server listens on port in ns (after starting one in the
// background), instead of sleeping a while.
func waitListening(t *testing.T, ns string, port int) {
	t.Helper()
	labtest.Eventually(t, 5*time.Second, fmt.Sprintf("a server listening on %s port %d", ns, port), func() (bool, string) {
		o, err := netnsutil.Run(context.Background(), ns, "ss", "-Hltn", fmt.Sprintf("sport = :%d", port))
		return err == nil && strings.TrimSpace(o) != "", o
	})
}

// TestHandBuiltOverlay attaches to a Flannel-like overlay that peregrine's lab did not build
// (scripts/handbuilt-flannel.sh: ip(8) commands, an underlay named ens5, CNI-like veth names,
// port 8472, onlink routes, static neighbour and FDB entries) and checks TCP and ICMP take the
// fast path both ways, and that detach leaves nothing.
func TestHandBuiltOverlay(t *testing.T) {
	testutil.RequireRoot(t)
	_, hosts, _ := labtest.ScriptLab(t, "../../../scripts/handbuilt-flannel.sh", "fph", 2, nil)
	attachAll(t, hosts)
	run(t, "prg-fph-n1-p1", "ping", "-c", "5", "-i", "0.1", "-w", "5", "10.244.2.2")
	run(t, "prg-fph-n2-p1", "iperf3", "-s", "-D", "-1", "-p", "5304")
	waitListening(t, "prg-fph-n2-p1", 5304)
	run(t, "prg-fph-n1-p1", "iperf3", "-c", "10.244.2.2", "-p", "5304", "-t", "1")
	for _, h := range hosts {
		v, err := Inspect(h)
		if err != nil {
			t.Fatal(err)
		}
		if v.Layout != LayoutRouted || v.Underlay != h+"/ens5" || v.Egress["hit"] == 0 || v.Ingress["hit"] == 0 {
			t.Fatalf("%s: %s", h, v.Format())
		}
	}
	// The same counters as Prometheus metrics.
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.New(nil))
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, f := range fams {
		if f.GetName() != "peregrine_mode_packets_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l["mode"] == Name && l["target"] == hosts[0] && l["direction"] == "egress" && l["result"] == "hit" && m.GetCounter().GetValue() > 0 {
				found = true
			}
		}
	}
	if !found {
		t.Fatalf("no peregrine_mode_packets_total{mode=fastpath,direction=egress,result=hit} > 0 for %s", hosts[0])
	}
	labtest.DetachGone(t, Name, hosts...)
}

// TestInvalidation changes what a cached flow depends on, one thing at a time, and checks the
// agent forgets the flow within a second (and that traffic still flows after).
func TestInvalidation(t *testing.T) {
	spec := lab.Spec{Name: "fpi", Style: lab.StyleFlannel, Containers: 1}
	l := labForTest(t, spec)
	hosts := []string{l.Hosts[0].Netns, l.Hosts[1].Netns}
	h1, c1 := hosts[0], l.Containers[0]
	dst := strings.Split(l.Containers[1].Addr, "/")[0]
	attachAll(t, hosts)
	gw := l.Spec.FlannelAddr(2).Addr().String()
	vtep2 := l.Spec.VTEPMAC(2).String()
	learned := func() int {
		v, err := Inspect(h1)
		if err != nil {
			t.Fatal(err)
		}
		return v.Both
	}
	for _, c := range []struct {
		name   string
		change [][]string
	}{
		{"neighbour", [][]string{{"ip", "neigh", "replace", gw, "lladdr", "06:00:00:00:00:99", "dev", "flannel.1", "nud", "permanent"},
			{"ip", "neigh", "replace", gw, "lladdr", vtep2, "dev", "flannel.1", "nud", "permanent"}}},
		{"fdb", [][]string{{"bridge", "fdb", "replace", vtep2, "dev", "flannel.1", "dst", "198.18.0.9", "self", "permanent"},
			{"bridge", "fdb", "replace", vtep2, "dev", "flannel.1", "dst", l.Spec.HostAddr(2).Addr().String(), "self", "permanent"}}},
		{"route", [][]string{{"ip", "route", "add", "203.0.113.0/24", "dev", "cni0"}}},
		{"mtu", [][]string{{"ip", "link", "set", "eth0", "mtu", "1400"}, {"ip", "link", "set", "eth0", "mtu", fmt.Sprint(l.Spec.MTU)}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			run(t, c1.Netns, "ping", "-c", "3", "-i", "0.1", "-w", "5", dst)
			if learned() == 0 {
				t.Fatalf("no flow learned before the change")
			}
			for _, cmd := range c.change {
				run(t, h1, cmd...)
			}
			deadline := time.Now().Add(time.Second)
			for learned() > 0 {
				if time.Now().After(deadline) {
					t.Fatalf("flows still cached 1 s after the %s change", c.name)
				}
				time.Sleep(20 * time.Millisecond)
			}
			run(t, c1.Netns, "ping", "-c", "3", "-i", "0.1", "-w", "5", dst)
		})
	}
}

// pinnedMapIDs is the kernel IDs of the fast path's maps pinned in host: after a detach,
// labtest.MapsGone checks that none of them is still alive.
func pinnedMapIDs(t *testing.T, host string) []ebpf.MapID {
	t.Helper()
	p, err := openPinned(host)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var ids []ebpf.MapID
	for _, m := range mapsOf(&p.fpMaps) {
		info, _ := (*m).Info()
		if id, ok := info.ID(); ok {
			ids = append(ids, id)
		}
	}
	return ids
}

// detachLeavesNothing detaches the fast path from every host and fails the test unless it
// left nothing behind: no pin directory (labtest.DetachGone), no prg_fastpath program on a
// device of the host or of its overlay namespace (host-ov, where the lab has one), no record.
func detachLeavesNothing(t *testing.T, hosts ...string) {
	t.Helper()
	labtest.DetachGone(t, Name, hosts...)
	for _, h := range hosts {
		for _, ns := range []string{h, h + "-ov"} {
			if !netnsutil.Exists(ns) {
				continue
			}
			if o, _ := netnsutil.Run(context.Background(), ns, "bpftool", "net", "show"); strings.Contains(o, "prg_fastpath") {
				t.Fatalf("%s: programs still attached after detach:\n%s", ns, o)
			}
		}
		if st, _ := datapath.LoadState(h, Name); st != nil {
			t.Fatalf("%s: record left behind", h)
		}
		if m, _ := filepath.Glob(filepath.Join(datapath.PinDir(h), "*")); len(m) > 0 {
			t.Fatalf("%s: pins left: %v", h, m)
		}
	}
}
