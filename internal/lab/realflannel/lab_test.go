package realflannel_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/falcon"
	"github.com/peregrine-net/peregrine/internal/datapath/fastpath"
	_ "github.com/peregrine-net/peregrine/internal/datapath/modes" // every mode, for Attach
	"github.com/peregrine-net/peregrine/internal/datapath/prism"
	"github.com/peregrine-net/peregrine/internal/lab/realflannel"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil"
	"github.com/peregrine-net/peregrine/internal/testutil/agenttest"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

// The modes' node agents re-execute this test binary: agentproc runs them instead of the tests.
func TestMain(m *testing.M) { agenttest.Main(m) }

// requireRealFlannel skips when the real flannel binaries are absent and the run is not the
// full suite's (scripts/test.sh runs setup.sh, which builds them, and sets PEREGRINE_TEST_ROOT).
func requireRealFlannel(t *testing.T) {
	t.Helper()
	if m := realflannel.DefaultBinaries().Missing(); len(m) > 0 {
		if os.Getenv(testutil.RootEnv) == "1" {
			t.Fatalf("the real flannel binaries are missing (scripts/setup.sh builds them): %s", strings.Join(m, "; "))
		}
		t.Skipf("the real flannel binaries are absent; run scripts/setup.sh as root: %s", strings.Join(m, "; "))
	}
	testutil.RequireBPF(t)
}

// run runs argv in a namespace and returns its output (labtest.Run).
var run = labtest.Run

// upForTest brings up a lab whose teardown (detach everything, down) runs however the test
// ends, and checks that nothing is left.
func upForTest(t *testing.T, name string, nodes, pods int) *realflannel.Lab {
	t.Helper()
	_, err := os.Stat("/var/lib/cni")
	noCache := errors.Is(err, os.ErrNotExist)
	l, err := realflannel.Up(context.Background(), realflannel.Spec{Name: name, Nodes: nodes, Pods: pods}, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// (checked after Down, below: the lab's cnitool made it, Down removes it)
		defer func() {
			if _, err := os.Stat("/var/lib/cni"); noCache && err == nil {
				t.Errorf("/var/lib/cni (cnitool's cache) left behind; it was not there before the lab")
			}
		}()
		for _, n := range l.NodeNetns() {
			if _, err := datapath.Detach(context.Background(), n, ""); err != nil && !strings.Contains(err.Error(), "nothing") {
				t.Errorf("detach %s: %v", n, err)
			}
		}
		if err := realflannel.Down(name); err != nil {
			t.Errorf("down: %v", err)
		}
		testutil.AssertClean(t, realflannel.Prefix(name))
		if _, err := os.Stat(realflannel.Dir(name)); !os.IsNotExist(err) {
			t.Errorf("state directory %s left behind", realflannel.Dir(name))
		}
		if m, _ := filepath.Glob("/var/lib/cni/results/" + realflannel.NetName(name) + "-*"); len(m) > 0 {
			t.Errorf("CNI results left behind: %v", m)
		}
	})
	return l
}

func inspect(t *testing.T, node string) *fastpath.View {
	t.Helper()
	v, err := fastpath.Inspect(node)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// endpoint is the live endpoint entry of addr in node's fast path (ifindex 0: none).
func endpoint(t *testing.T, node string, addr netip.Addr) (ifindex uint32, mac string) {
	for _, e := range inspect(t, node).Endpoints {
		if e.Addr == addr.String() && !e.Gone {
			return e.Ifindex, e.MAC
		}
	}
	return 0, ""
}

// podVeth is the ifindex (in its node) of the pod's veth peer and the pod's eth0 MAC.
func podVeth(t *testing.T, pod string) (uint32, string) {
	out := run(t, pod, "cat", "/sys/class/net/eth0/iflink", "/sys/class/net/eth0/address")
	f := strings.Fields(out)
	var idx uint32
	if len(f) != 2 {
		t.Fatalf("%s: eth0: %q", pod, out)
	}
	fmt.Sscan(f[0], &idx)
	return idx, f[1]
}

func iperf(t *testing.T, server, client *realflannel.Pod, port int, secs string) string {
	t.Helper()
	p := fmt.Sprint(port)
	run(t, server.Netns, "iperf3", "-s", "-D", "-1", "-p", p)
	labtest.Eventually(t, 5*time.Second, "iperf3 listening in "+server.Netns, func() (bool, string) {
		o, err := netnsutil.Run(context.Background(), server.Netns, "ss", "-Hltn", "sport = :"+p)
		return err == nil && strings.TrimSpace(o) != "", o
	})
	out := run(t, client.Netns, "iperf3", "-c", server.Addr.String(), "-p", p, "-t", secs)
	if !strings.Contains(out, "receiver") {
		t.Fatalf("iperf3 %s -> %s: %s", client.Netns, server.Netns, out)
	}
	return out
}

// TestRealFlannelFastPath attaches the fast path to flannel's own overlay (etcd, flanneld
// VXLAN, pods by CNI ADD) and checks what the issue asks of a real CNI: connectivity and hits,
// pods added and deleted by CNI while traffic runs, flanneld restarted mid-flow, detach clean.
func TestRealFlannelFastPath(t *testing.T) {
	requireRealFlannel(t)
	ctx := context.Background()
	l := upForTest(t, "rft", 2, 2)
	nodes := l.NodeNetns()
	a, b := l.Pods[0], l.Pods[2] // n1-p1, n2-p1
	knobs := map[string]string{}
	for _, n := range nodes {
		st, err := datapath.Attach(ctx, n, fastpath.Name, datapath.Options{})
		if err != nil {
			t.Fatalf("attach fastpath %s: %v", n, err)
		}
		for _, k := range st.Knobs {
			if _, seen := knobs[k.Netns+"\x00"+k.Path]; !seen {
				knobs[k.Netns+"\x00"+k.Path] = k.Old
			}
		}
	}
	// Discovery finds flannel's own devices: flannel.1 on eth0, the routed (cni0) layout, and
	// every pod CNI made before attach.
	for i, n := range nodes {
		v := inspect(t, n)
		if v.Layout != "routed" || v.Underlay != n+"/"+realflannel.UnderlayDev || !strings.HasSuffix(v.VXLAN, "/flannel.1") {
			t.Fatalf("%s: discovery: %s", n, v.Format())
		}
		for _, p := range l.Pods {
			if p.Node == i+1 {
				if idx, _ := endpoint(t, n, p.Addr); idx == 0 {
					t.Fatalf("%s: pod %s (%s) not in status:\n%s", n, p.Netns, p.Addr, v.Format())
				}
			}
		}
	}
	run(t, a.Netns, "ping", "-c", "5", "-i", "0.1", "-w", "5", b.Addr.String())
	iperf(t, &b, &a, 5311, "1")
	for _, n := range nodes {
		v := inspect(t, n)
		if v.Egress["hit"] == 0 || v.Ingress["hit"] == 0 || v.Both == 0 {
			t.Fatalf("%s: no fast-path traffic on the real flannel overlay:\n%s", n, v.Format())
		}
		if v.Egress["dropped"]+v.Ingress["dropped"] > 0 {
			t.Fatalf("%s: the fast path dropped packets:\n%s", n, v.Format())
		}
	}

	// Traffic runs throughout the pod changes: a TCP stream a -> b.
	bg := make(chan error, 1)
	run(t, b.Netns, "iperf3", "-s", "-D", "-1", "-p", "5312")
	labtest.Eventually(t, 5*time.Second, "iperf3 listening", func() (bool, string) {
		o, err := netnsutil.Run(ctx, b.Netns, "ss", "-Hltn", "sport = :5312")
		return err == nil && strings.TrimSpace(o) != "", o
	})
	go func() {
		o, err := netnsutil.Run(ctx, a.Netns, "iperf3", "-c", b.Addr.String(), "-p", "5312", "-t", "8", "-b", "200M")
		if err == nil && !strings.Contains(o, "receiver") {
			err = fmt.Errorf("no receiver summary: %s", o)
		}
		bg <- err
	}()

	// CNI ADD while traffic runs: the new pod is in status and on the fast path within 1 s.
	c, err := l.AddPod(ctx, 2, "p3", netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	added := time.Now()
	labtest.Eventually(t, 1500*time.Millisecond, "the pod added by CNI ADD in status", func() (bool, string) {
		idx, _ := endpoint(t, nodes[1], c.Addr)
		return idx != 0, inspect(t, nodes[1]).Format()
	})
	t.Logf("CNI-added pod %s in status after %v", c.Addr, time.Since(added).Round(time.Millisecond))
	in0 := inspect(t, nodes[1]).Ingress["hit"]
	run(t, a.Netns, "ping", "-c", "10", "-i", "0.05", "-w", "5", c.Addr.String())
	if in1 := inspect(t, nodes[1]).Ingress["hit"]; in1-in0 < 5 {
		t.Fatalf("pings to the CNI-added pod took the fast path %d times in, want >= 5 of 10", in1-in0)
	}

	// CNI DEL mid-flow: a ping flow to d is fast; d goes; its entry must go within 1 s, no other
	// pod may get its packets, and a pod re-created with d's address gets them at its own MAC.
	d, err := l.Pod(realflannel.Prefix("rft") + "n2-p2")
	if err != nil {
		t.Fatal(err)
	}
	dAddr := d.Addr
	pinger := netnsutil.Command(ctx, a.Netns, "ping", "-i", "0.02", "-W", "1", dAddr.String())
	if err := pinger.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pinger.Process.Kill(); _ = pinger.Wait() }()
	labtest.Eventually(t, 2*time.Second, "the ping flow to the pod to delete on the fast path", func() (bool, string) {
		idx, _ := endpoint(t, nodes[1], dAddr)
		return idx != 0 && inspect(t, nodes[1]).Ingress["hit"] > in0+50, inspect(t, nodes[1]).Format()
	})
	if err := l.DelPod(ctx, d.Netns); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	other, err := l.AddPod(ctx, 2, "p8", netip.Addr{}) // a pod that may take the dead veth's slot
	if err != nil {
		t.Fatal(err)
	}
	labtest.Eventually(t, 1500*time.Millisecond, "the deleted pod's entry forgotten", func() (bool, string) {
		idx, _ := endpoint(t, nodes[1], dAddr)
		return idx == 0, inspect(t, nodes[1]).Format()
	})
	t.Logf("deleted pod's entry gone after %v", time.Since(deleted).Round(time.Millisecond))
	// Delivered means addressed to the pod's own MAC: the bridge floods frames for the dead
	// pod's MAC (the node's neighbour entry still names it) to every port, and the pods' kernels
	// drop those as another host's.
	_, otherMAC := podVeth(t, other.Netns)
	if n := captured(t, other.Netns, dAddr, 1500*time.Millisecond, otherMAC); n > 0 {
		t.Fatalf("misdelivery: %d packets for the deleted pod's %s reached %s at its own MAC", n, dAddr, other.Netns)
	}
	e, err := l.AddPod(ctx, 2, "p9", dAddr)
	if err != nil {
		t.Fatal(err)
	}
	eVeth, eMAC := podVeth(t, e.Netns)
	labtest.Eventually(t, 1500*time.Millisecond, "the re-created pod's entry at its own veth", func() (bool, string) {
		idx, mac := endpoint(t, nodes[1], dAddr)
		return idx == eVeth && mac == eMAC, inspect(t, nodes[1]).Format()
	})
	// The running flow's packets reach the re-created pod, its rightful owner now, at its MAC.
	// The node's neighbour entry for the address may still name the dead pod's MAC (the bridge
	// plugin's gratuitous ARP can fall within the entry's locktime while the flow keeps it
	// busy): the normal path then floods to that MAC until the pod's own ARP for its gateway
	// corrects it, as any pod's first packet does.
	neigh := run(t, nodes[1], "ip", "neigh", "show", dAddr.String())
	run(t, e.Netns, "ping", "-c", "1", "-W", "1", nthGateway(dAddr))
	if n := captured(t, e.Netns, dAddr, time.Second, eMAC); n == 0 {
		t.Fatalf("the ping flow to %s does not reach the re-created pod %s at its MAC %s (node's neighbour entry at re-creation: %s; now: %s)",
			dAddr, e.Netns, eMAC, strings.TrimSpace(neigh), strings.TrimSpace(run(t, nodes[1], "ip", "neigh", "show", dAddr.String())))
	}
	in2 := inspect(t, nodes[1]).Ingress["hit"]
	run(t, a.Netns, "ping", "-c", "5", "-i", "0.05", "-w", "5", dAddr.String())
	if in3 := inspect(t, nodes[1]).Ingress["hit"]; in3 <= in2 {
		t.Fatalf("the re-created pod gets no fast-path packets (ingress hits %d -> %d)", in2, in3)
	}
	_ = pinger.Process.Kill()
	_ = pinger.Wait()
	if err := <-bg; err != nil {
		t.Fatalf("the TCP stream across CNI ADD/DEL: %v", err)
	}

	// flanneld restarted mid-flow on both nodes: it programs flannel.1's neighbour and FDB entries
	// anew; the stream survives and the flows are learned again.
	run(t, b.Netns, "iperf3", "-s", "-D", "-1", "-p", "5313")
	labtest.Eventually(t, 5*time.Second, "iperf3 listening", func() (bool, string) {
		o, err := netnsutil.Run(ctx, b.Netns, "ss", "-Hltn", "sport = :5313")
		return err == nil && strings.TrimSpace(o) != "", o
	})
	go func() {
		o, err := netnsutil.Run(ctx, a.Netns, "iperf3", "-c", b.Addr.String(), "-p", "5313", "-t", "5", "-b", "200M")
		if err == nil && !strings.Contains(o, "receiver") {
			err = fmt.Errorf("no receiver summary: %s", o)
		}
		bg <- err
	}()
	time.Sleep(time.Second)
	for i, n := range nodes {
		before := strings.TrimSpace(run(t, n, "cat", "/sys/class/net/flannel.1/ifindex"))
		if err := l.RestartFlanneld(ctx, i+1); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: flanneld restarted; flannel.1 ifindex %s -> %s", n, before, strings.TrimSpace(run(t, n, "cat", "/sys/class/net/flannel.1/ifindex")))
	}
	restarted := map[string]uint64{}
	for _, n := range nodes {
		restarted[n] = inspect(t, n).Egress["hit"]
	}
	if err := <-bg; err != nil {
		t.Fatalf("the TCP stream across flanneld restarts: %v", err)
	}
	run(t, a.Netns, "ping", "-c", "5", "-i", "0.1", "-w", "5", b.Addr.String())
	for _, n := range nodes {
		v := inspect(t, n)
		if v.Egress["hit"] <= restarted[n] || v.Both == 0 {
			t.Fatalf("%s: no fast path after flanneld's restart (egress hits %d -> %d):\n%s", n, restarted[n], v.Egress["hit"], v.Format())
		}
	}

	ids := pinnedMaps(t, l)
	for _, n := range nodes {
		if _, err := datapath.Detach(ctx, n, fastpath.Name); err != nil {
			t.Fatalf("detach %s: %v", n, err)
		}
	}
	assertDetached(t, l, knobs, ids)
}

// nthGateway is the pod's gateway: .1 of its /24 (cni0's address).
func nthGateway(a netip.Addr) string {
	b := a.As4()
	b[3] = 1
	return netip.AddrFrom4(b).String()
}

// captured counts the packets to addr that reach pod's eth0 within d addressed to mac, i.e.
// that the pod's kernel takes as its own (tcpdump's promiscuous capture also sees the frames it
// drops as another host's; the filter leaves those out).
func captured(t *testing.T, pod string, addr netip.Addr, d time.Duration, mac string) int {
	t.Helper()
	filter := "dst host " + addr.String() + " and ether dst " + mac
	ctx, cancel := context.WithTimeout(context.Background(), d+3*time.Second)
	defer cancel()
	out, _ := netnsutil.Command(ctx, pod, "timeout", fmt.Sprintf("%.1f", d.Seconds()), "tcpdump", "-ni", "eth0", "-q", "-l", filter).CombinedOutput()
	n := 0
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, " > "+addr.String()) {
			n++
		}
	}
	if !strings.Contains(string(out), "listening on") {
		t.Fatalf("tcpdump in %s did not run: %s", pod, out)
	}
	return n
}

// pinnedMaps are the IDs of the maps pinned for the lab's nodes (before a detach: they must
// all be gone after it).
func pinnedMaps(t *testing.T, l *realflannel.Lab) []ebpf.MapID {
	t.Helper()
	var ids []ebpf.MapID
	for _, n := range l.NodeNetns() {
		_ = filepath.WalkDir(datapath.PinDir(n), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return nil
			}
			m, err := ebpf.LoadPinnedMap(path, nil)
			if err != nil {
				return nil // a program or link pin
			}
			defer m.Close()
			if info, err := m.Info(); err == nil {
				if id, ok := info.ID(); ok {
					ids = append(ids, id)
				}
			}
			return nil
		})
	}
	if len(ids) == 0 {
		t.Fatal("no pinned maps found for the attached modes")
	}
	return ids
}

// assertDetached checks that no peregrine program is attached in the lab's namespaces, none of
// the maps (ids) the modes had exists any more, no pin or record is left, and every knob the
// modes set is back to its old value.
func assertDetached(t *testing.T, l *realflannel.Lab, knobs map[string]string, ids []ebpf.MapID) {
	t.Helper()
	labtest.MapsGone(t, ids)
	nss, _ := netnsutil.List(realflannel.Prefix(l.Spec.Name))
	for _, ns := range nss {
		if o, _ := netnsutil.Run(context.Background(), ns, "bpftool", "net", "show"); strings.Contains(o, "prg_") {
			t.Errorf("%s: programs still attached after detach:\n%s", ns, o)
		}
	}
	for _, n := range l.NodeNetns() {
		if m, _ := filepath.Glob(filepath.Join(datapath.PinDir(n), "*")); len(m) > 0 {
			t.Errorf("%s: pins left: %v", n, m)
		}
		if st, _ := datapath.LoadState(n, ""); st != nil {
			t.Errorf("%s: record left: %s", n, st.Mode)
		}
	}
	for k, old := range knobs {
		ns, path, _ := strings.Cut(k, "\x00")
		if !netnsutil.Exists(ns) {
			continue
		}
		got, err := netnsutil.ReadFileIn(ns, path)
		if err != nil {
			continue // the device went (a deleted pod's veth)
		}
		if strings.TrimSpace(got) != strings.TrimSpace(old) {
			t.Errorf("%s:%s is %q after detach, was %q", ns, path, strings.TrimSpace(got), old)
		}
	}
}

// TestRealFlannelPrismFalcon attaches prism, then falcon, to the real flannel overlay, one at a
// time, and checks each carries traffic its way and detaches clean.
func TestRealFlannelPrismFalcon(t *testing.T) {
	requireRealFlannel(t)
	ctx := context.Background()
	l := upForTest(t, "rfm", 2, 1)
	nodes := l.NodeNetns()
	a, b := l.Pods[0], l.Pods[1]
	knobs := map[string]string{}
	record := func(st *datapath.State) {
		for _, k := range st.Knobs {
			if _, seen := knobs[k.Netns+"\x00"+k.Path]; !seen {
				knobs[k.Netns+"\x00"+k.Path] = k.Old
			}
		}
	}

	for _, n := range nodes {
		st, err := datapath.Attach(ctx, n, prism.Name, datapath.Options{Extra: map[string]string{prism.OptRules: "proto=tcp dport=5401"}})
		if err != nil {
			t.Fatalf("attach prism %s: %v", n, err)
		}
		record(st)
	}
	iperf(t, &b, &a, 5401, "1")
	run(t, a.Netns, "ping", "-c", "3", "-i", "0.1", "-w", "5", b.Addr.String())
	p, err := prism.Inspect(nodes[1])
	if err != nil {
		t.Fatal(err)
	}
	if p.Stats.Redirected == 0 || p.Stats.HP == 0 {
		t.Fatalf("prism on the real flannel overlay redirected nothing of the HP flow:\n%s", p.Format())
	}
	ids := pinnedMaps(t, l)
	for _, n := range nodes {
		if _, err := datapath.Detach(ctx, n, prism.Name); err != nil {
			t.Fatalf("detach prism %s: %v", n, err)
		}
	}
	assertDetached(t, l, knobs, ids)

	for _, n := range nodes {
		st, err := datapath.Attach(ctx, n, falcon.Name, datapath.Options{CPUs: []int{0, 1}, KeepUnderlay: true,
			Extra: map[string]string{falcon.OptThreshold: "100", falcon.OptStatic: "true"}})
		if err != nil {
			t.Fatalf("attach falcon %s: %v", n, err)
		}
		record(st)
	}
	iperf(t, &b, &a, 5402, "1")
	st, err := datapath.LoadState(nodes[1], falcon.Name)
	if err != nil || st == nil {
		t.Fatalf("falcon's record on %s: %v", nodes[1], err)
	}
	lv, err := falcon.ReadLive(st, 0)
	if err != nil {
		t.Fatal(err)
	}
	var steered uint64
	for _, s := range lv.Stages {
		for _, c := range s.ToCPU {
			steered += c
		}
	}
	if steered == 0 {
		t.Fatalf("falcon on the real flannel overlay steered no packet: %+v", lv.Stages)
	}
	ids = pinnedMaps(t, l)
	for _, n := range nodes {
		if _, err := datapath.Detach(ctx, n, falcon.Name); err != nil {
			t.Fatalf("detach falcon %s: %v", n, err)
		}
	}
	assertDetached(t, l, knobs, ids)
}

// TestDownAll: `lab down --all` (through realflannel.DownAll) removes a real flannel lab with
// its processes, state and CNI cache.
func TestDownAll(t *testing.T) {
	requireRealFlannel(t)
	l := upForTest(t, "rfd", 1, 1)
	pidFile := filepath.Join(realflannel.Dir("rfd"), "n1", "flanneld.pid")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := realflannel.DownAll(t.Logf); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/proc/" + strings.TrimSpace(string(b)) + "/ns/net"); err == nil {
		if st, _ := os.ReadFile("/proc/" + strings.TrimSpace(string(b)) + "/stat"); !strings.Contains(string(st), ") Z") {
			t.Errorf("flanneld (pid %s) survived DownAll", strings.TrimSpace(string(b)))
		}
	}
	if nss, _ := netnsutil.List(realflannel.Prefix(l.Spec.Name)); len(nss) > 0 {
		t.Errorf("namespaces left: %v", nss)
	}
}
