package falcon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/cpuset"
	"github.com/peregrine-net/peregrine/internal/datapath"
	_ "github.com/peregrine-net/peregrine/internal/datapath/rps" // the baseline the tests stack on
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/probe"
	"github.com/peregrine-net/peregrine/internal/probe/stage"
	"github.com/peregrine-net/peregrine/internal/testutil"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

// Integration tests on lab topologies. The underlay's receive is pinned to CPU0 (--rx-cpus 0, a
// NIC's IRQ core), so vanilla runs every stage of a flow on CPU0; falcon must move the VXLAN and
// veth stages to the CPUs the model predicts. With 2 CPUs three stages cannot all differ, so
// flows are picked whose stages alternate: NIC 0 -> VXLAN 1 -> veth 0, and NIC 0 -> VXLAN 0 ->
// veth 1. The first proves that a hash set at the underlay's ingress survives decapsulation and
// decides vxlan0's RPS; the second that the bridge port's hash decides the container veth's.

func labUp(t *testing.T, spec lab.Spec) *lab.Lab {
	t.Helper()
	testutil.RequireCheck(t, "stage probe", stage.Check)
	return labtest.Up(t, spec)
}

// stageDevs are the receive stages of container h1-c1 on host h1.
type stageDevs struct {
	nic, vxlan, veth datapath.Dev
	nicIno, vethIno  uint64 // namespace inodes, for the model's device salts
}

func findStages(t *testing.T, l *lab.Lab) stageDevs {
	t.Helper()
	host := l.Hosts[0].Netns
	topo, err := datapath.Discover(host, "")
	if err != nil {
		t.Fatal(err)
	}
	c1, err := l.Node("h1-c1")
	if err != nil {
		t.Fatal(err)
	}
	var s stageDevs
	s.nic, s.vxlan = topo.ByStage(datapath.StageNIC)[0], topo.ByStage(datapath.StageVXLAN)[0]
	for _, d := range topo.ByStage(datapath.StageVeth) {
		if d.Netns == c1.Netns {
			s.veth = d
		}
	}
	if s.nicIno, err = inodeOf(s.nic.Netns); err == nil {
		s.vethIno, err = inodeOf(s.veth.Netns)
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// pickFlow finds a UDP source port from h2-c1 to h1-c1 whose VXLAN stage lands on vxCPU and
// veth stage on vethCPU, by the model, with falcon on CPUs 0-1.
func pickFlow(l *lab.Lab, s stageDevs, vxCPU, vethCPU int) Flow {
	p := Params{CPUs: []int{0, 1}, Threshold: 100, GateOpen: true}
	vxSalt := VNISalt(DeviceSalt(s.nicIno, s.nic.Ifindex), uint32(l.Spec.VNI))
	vethSalt := DeviceSalt(s.vethIno, s.veth.Ifindex)
	for port := 20000; ; port++ {
		f := Flow{Src: l.Spec.ContainerAddr(2, 1).Addr(), Dst: l.Spec.ContainerAddr(1, 1).Addr(),
			Sport: uint16(port), Dport: 9999, Proto: 17}
		if Choose(p, f.Hash(), vxSalt).CPU == vxCPU && Choose(p, f.Hash(), vethSalt).CPU == vethCPU {
			return f
		}
	}
}

// sendFlow sends n small UDP datagrams of flow f at a modest rate (the load gate must stay open)
// and returns the stage probe's per-CPU packet counts of the three stageDevs.
func sendFlow(t *testing.T, l *lab.Lab, s stageDevs, f Flow, n int) map[string]map[int]uint64 {
	t.Helper()
	recv := labtest.ListenUDP(t, labtest.NS(l, "h1-c1"), &net.UDPAddr{IP: f.Dst.AsSlice(), Port: int(f.Dport)})
	defer recv.Close() // now: the next flow may use the port
	var got atomic.Int64
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, err := recv.Read(buf); err != nil {
				return
			}
			got.Add(1)
		}
	}()
	var send *net.UDPConn
	if err := netnsutil.Do(labtest.NS(l, "h2-c1"), func() error {
		var err error
		send, err = net.DialUDP("udp4", &net.UDPAddr{IP: f.Src.AsSlice(), Port: int(f.Sport)},
			&net.UDPAddr{IP: f.Dst.AsSlice(), Port: int(f.Dport)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer send.Close()
	devs := []labtest.StageDev{{Netns: s.nic.Netns, Ifindex: s.nic.Ifindex}, {Netns: s.vxlan.Netns, Ifindex: s.vxlan.Ifindex},
		{Netns: s.veth.Netns, Ifindex: s.veth.Ifindex}}
	c := labtest.StageCPUs(t, devs, func() {
		payload := make([]byte, 64)
		for i := 0; i < n; i++ {
			if _, err := send.Write(payload); err != nil {
				t.Fatal(err)
			}
			if i%20 == 19 {
				time.Sleep(time.Millisecond)
			}
		}
		// Every stage is done with a datagram once the receiver has it.
		labtest.Eventually(t, 5*time.Second, "datagrams delivered", func() (bool, string) {
			return got.Load() >= int64(n)*95/100, fmt.Sprintf("%d of %d received", got.Load(), n)
		})
	})
	return map[string]map[int]uint64{"nic": c[0], "vxlan": c[1], "veth": c[2]}
}

func falconOpts() datapath.Options {
	// threshold 100 and static: the test checks the pipelining, not the balancing (the unit
	// tests check that), and must not depend on what else loads this machine.
	return datapath.Options{CPUs: []int{0, 1}, KeepUnderlay: true,
		Extra: map[string]string{OptThreshold: "100", OptStatic: "true"}}
}

func TestPipeliningOnLabs(t *testing.T) {
	if n := numOnline(); n < 2 {
		t.Skipf("needs 2 CPUs, have %d", n)
	}
	for _, style := range []string{lab.StyleDocker, lab.StyleFlannel} {
		t.Run(style, func(t *testing.T) {
			l := labUp(t, lab.Spec{Name: "tfalp" + style[:2], Style: style, Containers: 1, RxCPUs: []int{0}})
			s := findStages(t, l)
			before := labtest.RxKnobs(t, l)
			host := l.Hosts[0].Netns

			f := pickFlow(l, s, 1, 0)
			vanilla := sendFlow(t, l, s, f, 3000)
			for _, st := range []string{"nic", "vxlan", "veth"} {
				labtest.MostlyOn(t, "vanilla "+st, vanilla[st], 0, 100)
			}

			st, err := datapath.Attach(context.Background(), host, "falcon", falconOpts())
			if err != nil {
				t.Fatal(err)
			}
			labtest.DetachAtEnd(t, host)
			if st.AgentPID == 0 || !agentKit.Running(st) {
				t.Fatalf("agent %d is not running", st.AgentPID)
			}

			got := sendFlow(t, l, s, f, 3000)
			t.Logf("vanilla: %v; falcon flow 1: %v", vanilla, got)
			labtest.MostlyOn(t, "falcon nic", got["nic"], 0, 100)
			labtest.MostlyOn(t, "falcon vxlan (hash set at the underlay's ingress)", got["vxlan"], 1, 100)
			labtest.MostlyOn(t, "falcon veth (hash set at the bridge port's egress)", got["veth"], 0, 100)

			f2 := pickFlow(l, s, 0, 1)
			got = sendFlow(t, l, s, f2, 3000)
			labtest.MostlyOn(t, "falcon flow 2 vxlan", got["vxlan"], 0, 100)
			labtest.MostlyOn(t, "falcon flow 2 veth", got["veth"], 1, 100)

			// status can read the live state
			text, err := mode{}.Report(st)
			if err != nil || !strings.Contains(text, "gate      open") {
				t.Errorf("report: %v\n%s", err, text)
			}

			if _, err := datapath.Detach(context.Background(), host, ""); err != nil {
				t.Fatal(err)
			}
			labtest.SameKnobs(t, l, before, "after detach")
			if agentKit.Running(st) {
				t.Errorf("agent %d still runs after detach", st.AgentPID)
			}
			if _, err := os.Stat(datapath.ModePinDir(host, Name)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("pins remain at %s", datapath.ModePinDir(host, Name))
			}
			assertNoFalconProgs(t, s.nic, ebpf.AttachTCXIngress)
			vanilla = sendFlow(t, l, s, f, 3000)
			labtest.MostlyOn(t, "after detach vxlan", vanilla["vxlan"], 0, 100)
			labtest.MostlyOn(t, "after detach veth", vanilla["veth"], 0, 100)
		})
	}
}

func assertNoFalconProgs(t *testing.T, d datapath.Dev, at ebpf.AttachType) {
	t.Helper()
	_ = netnsutil.Do(d.Netns, func() error {
		res, err := link.QueryPrograms(link.QueryOptions{Target: d.Ifindex, Attach: at})
		if err != nil {
			return nil // the device is gone
		}
		if len(res.Programs) > 0 {
			t.Errorf("%s still runs %d tcx programs", d, len(res.Programs))
		}
		return nil
	})
}

func numOnline() int {
	n := 0
	for c := 0; c < 64; c++ {
		if cpuset.CheckOnline([]int{c}) == nil {
			n++
		}
	}
	return n
}

// Containers that come after attach are picked up within a second; ones that go are forgotten.
func TestAgentFollowsContainers(t *testing.T) {
	l := labUp(t, lab.Spec{Name: "tfalhp", Style: lab.StyleDocker, Containers: 1})
	host := l.Hosts[0].Netns
	if _, err := datapath.Attach(context.Background(), host, "falcon", falconOpts()); err != nil {
		t.Fatal(err)
	}
	labtest.DetachAtEnd(t, host)

	ov := labtest.NS(l, "h1-ov")
	newNs := labtest.NS(l, "h1-c9") // the lab prefix: lab down removes it whatever happens
	if err := netnsutil.Create(newNs); err != nil {
		t.Fatal(err)
	}
	hn, err := netnsutil.Handle(newNs)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = netnsutil.Do(ov, func() error {
		br, err := netlink.LinkByName("br0")
		if err != nil {
			return err
		}
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "veth9", MasterIndex: br.Attrs().Index},
			PeerName: "eth0", PeerNamespace: netlink.NsFd(int(hn))}
		if err := netlink.LinkAdd(v); err != nil {
			return err
		}
		l, err := netlink.LinkByName("veth9")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	hn.Close() // our handle would keep the namespace (and the veth) alive after Delete
	if err != nil {
		t.Fatal(err)
	}
	newVeth := datapath.Dev{Netns: newNs, Name: "eth0"}
	labtest.Eventually(t, time.Second-time.Since(start), "new container's veth steered", func() (bool, string) {
		v, err := netnsutil.ReadFileIn(newNs, "/sys/class/net/eth0/queues/rx-0/rps_cpus")
		return err == nil && datapath.SameValue(v, "3") && hasPiece(t, host, newVeth), fmt.Sprintf("rps_cpus %q (%v)", v, err)
	})

	var pin string
	if ms, _ := readModeStateOf(host); len(ms.Pieces) > 0 {
		pin = ms.Pieces[len(ms.Pieces)-1].LinkPin
	}
	if _, err := os.Stat(pin); err != nil {
		t.Errorf("link of the new port is not pinned: %v", err)
	}
	if err := netnsutil.Delete(newNs); err != nil { // the container goes, and its veth pair
		t.Fatal(err)
	}
	labtest.Eventually(t, time.Second, "gone container forgotten", func() (bool, string) { return !hasPiece(t, host, newVeth), "still recorded" })
	if _, err := os.Stat(pin); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("link pin of the gone port remains: %v", err)
	}
	st, _ := datapath.LoadState(host, "falcon")
	for _, k := range st.Knobs {
		if k.Netns == newNs {
			t.Errorf("knob of the gone container still recorded: %s", k)
		}
	}
	if _, err := datapath.Detach(context.Background(), host, ""); err != nil {
		t.Fatalf("detach after a container left: %v", err)
	}
}

func hasPiece(t *testing.T, host string, next datapath.Dev) bool {
	st, err := datapath.LoadState(host, "falcon")
	if err != nil || st == nil {
		return false
	}
	ms, err := datapath.LoadModeState[modeState](st)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ms.Pieces {
		if p.Next.Netns == next.Netns && p.Next.Name == next.Name {
			return true
		}
	}
	return false
}

// Bad input changes nothing and says why; falcon does not stack with itself or with rps.
func TestRefusals(t *testing.T) {
	l := labUp(t, lab.Spec{Name: "tfalbad", Style: lab.StyleDocker, Containers: 1})
	host := l.Hosts[0].Netns
	before := labtest.RxKnobs(t, l)
	unchanged := func(what string) {
		t.Helper()
		if st, _ := datapath.LoadState(host, "falcon"); st != nil {
			t.Errorf("%s: a record was left", what)
		}
		labtest.SameKnobs(t, l, before, what)
	}
	for name, o := range map[string]datapath.Options{
		"absent CPU":    {CPUs: []int{0, 1000}},
		"threshold 101": {Extra: map[string]string{OptThreshold: "101"}},
		"threshold -5":  {Extra: map[string]string{OptThreshold: "-5"}},
	} {
		_, err := datapath.Attach(context.Background(), host, "falcon", o)
		if err == nil {
			t.Fatalf("%s accepted", name)
		}
		t.Logf("%s: %v", name, err)
		unchanged(name)
	}

	// Another process's pins in the way.
	dir := datapath.ModePinDir(host, Name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "prg_falcon_gate"), nil, 0o600); err == nil {
		t.Fatal("bpffs accepted a plain file") // bpffs holds only BPF objects: use a map pin instead
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Pin(filepath.Join(dir, "prg_falcon_gate")); err != nil {
		t.Fatal(err)
	}
	m.Close()
	_, err = datapath.Attach(context.Background(), host, "falcon", datapath.Options{})
	if err == nil || !strings.Contains(err.Error(), "already exist") {
		t.Fatalf("attach over foreign pins: %v", err)
	}
	t.Logf("foreign pins: %v", err)
	unchanged("foreign pins")
	if err := os.RemoveAll(datapath.PinDir(host)); err != nil {
		t.Fatal(err)
	}

	// rps first: falcon refuses to stack on it; once rps is detached, falcon attaches.
	if _, err := datapath.Attach(context.Background(), host, "rps", datapath.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := datapath.Attach(context.Background(), host, "falcon", datapath.Options{}); err == nil {
		t.Fatal("falcon stacked on rps")
	}
	if _, err := datapath.Detach(context.Background(), host, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := datapath.Attach(context.Background(), host, "falcon", datapath.Options{}); err != nil {
		t.Fatal(err)
	}
	labtest.DetachAtEnd(t, host)
	if _, err := datapath.Attach(context.Background(), host, "falcon", datapath.Options{}); err == nil {
		t.Fatal("falcon stacked on itself")
	}
	if _, err := datapath.Detach(context.Background(), host, ""); err != nil {
		t.Fatal(err)
	}
	unchanged("after detach")
}

// A TCP connection carries on across attach and detach, every byte arrives, and moving its
// stages to other CPUs costs at most a handful of retransmitted segments.
func TestTCPSurvivesAttachDetach(t *testing.T) {
	l := labUp(t, lab.Spec{Name: "tfaltcp", Style: lab.StyleDocker, Containers: 1})
	host, src := l.Hosts[0].Netns, labtest.NS(l, "h2-c1")
	before, err := probe.ReadNstat(src)
	if err != nil {
		t.Fatal(err)
	}
	// Paced, so the CPUs have room and falcon's gate stays open.
	tcp := labtest.StartTCP(t, src, labtest.NS(l, "h1-c1"), netip.AddrPortFrom(l.Spec.ContainerAddr(1, 1).Addr(), 5201), 200*time.Microsecond)
	tcp.WaitFlowing(t, 1<<20, 5*time.Second)
	if _, err := datapath.Attach(context.Background(), host, Name, datapath.Options{CPUs: []int{0, 1}}); err != nil {
		t.Fatal(err)
	}
	tcp.WaitFlowing(t, 4<<20, 10*time.Second) // carried while attached
	if _, err := datapath.Detach(context.Background(), host, ""); err != nil {
		t.Fatal(err)
	}
	tcp.WaitFlowing(t, 1<<20, 5*time.Second) // and after
	n := tcp.Finish(t)
	after, err := probe.ReadNstat(src)
	if err != nil {
		t.Fatal(err)
	}
	d, err := probe.CounterDeltas(before, after, []string{"Tcp.RetransSegs", "Tcp.OutSegs"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d bytes carried across attach and detach, %d of %d segments retransmitted", n, d["Tcp.RetransSegs"], d["Tcp.OutSegs"])
	// A veth underlay loses nothing: retransmits come only from reordering at the two CPU
	// moves (attach, detach), a few segments each, never a steady share of the stream.
	if limit := max(20, d["Tcp.OutSegs"]/100); d["Tcp.RetransSegs"] > limit {
		t.Errorf("%d segments retransmitted, want at most %d", d["Tcp.RetransSegs"], limit)
	}
}

// lab down with falcon attached stops the agent and removes the pins (the cleanup hook calls
// Mode.Unload for namespaces being removed).
func TestLabDownStopsAgent(t *testing.T) {
	l := labUp(t, lab.Spec{Name: "tfaldn", Style: lab.StyleFlannel, Containers: 1})
	host := l.Hosts[0].Netns
	st, err := datapath.Attach(context.Background(), host, "falcon", falconOpts())
	if err != nil {
		t.Fatal(err)
	}
	if err := lab.Down(l.Spec.Name, nil, datapath.ForgetNamespaces); err != nil {
		t.Fatal(err)
	}
	if agentKit.Running(st) {
		t.Errorf("agent %d survived lab down", st.AgentPID)
	}
	if _, err := os.Stat(datapath.ModePinDir(host, Name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pins survived lab down")
	}
	if st, _ := datapath.LoadState(host, "falcon"); st != nil {
		t.Errorf("record survived lab down")
	}
}

func readModeStateOf(host string) (modeState, error) {
	st, err := datapath.LoadState(host, "falcon")
	if err != nil || st == nil {
		return modeState{}, err
	}
	return datapath.LoadModeState[modeState](st)
}
