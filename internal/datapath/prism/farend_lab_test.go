package prism

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

// The gate's far end (issue 28, item 1): a rule that drops an HP flow anywhere on the normal path
// (a later FORWARD chain, POSTROUTING, a bridge-family chain, tc on the pod's veth) stops prism's
// redirect of it within the gate's window, as the rule stops the normal path at once; the bound
// asserted is rule (a)'s 1 s.

// farPort is the HP port of the far-end test; bound is rule (a)'s limit.
const (
	farPort  = 5403
	farBound = time.Second
)

// udpSink counts the datagrams that reach addr:port in ns and keeps the last one's arrival.
type udpSink struct {
	n    atomic.Int64
	last atomic.Int64 // unix ns
}

func startSink(t *testing.T, ns, addr string, port int) *udpSink {
	t.Helper()
	c := labtest.ListenUDP(t, ns, &net.UDPAddr{IP: net.ParseIP(addr), Port: port})
	s := &udpSink{}
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
			s.n.Add(1)
			s.last.Store(time.Now().UnixNano())
		}
	}()
	return s
}

// startSource sends a 64-byte datagram from ns (source port sport) to addr:port every ms until
// the returned stop is called (also at cleanup).
func startSource(t *testing.T, ns, addr string, port, sport int) func() {
	t.Helper()
	var c *net.UDPConn
	if err := netnsutil.Do(ns, func() error {
		var err error
		c, err = net.DialUDP("udp4", &net.UDPAddr{Port: sport}, &net.UDPAddr{IP: net.ParseIP(addr), Port: port})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		defer c.Close()
		buf := make([]byte, 64)
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			_, _ = c.Write(buf) // a refused datagram (ICMP from a drop) is not the end
		}
	}()
	once := false
	f := func() {
		if !once {
			once = true
			close(stop)
			<-done
		}
	}
	t.Cleanup(f)
	return f
}

// dropRule is one way of dropping the flow to dst:farPort on the normal path; add returns the
// removal.
type dropRule struct {
	name string
	add  func(t *testing.T) func()
}

func nftRule(t *testing.T, ns, script, del string) func() {
	t.Helper()
	cmd := netnsutil.Command(context.Background(), ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v\n%s\n%s", err, script, out)
	}
	removed := false
	rm := func() {
		if !removed {
			removed = true
			if out, err := netnsutil.Run(context.Background(), ns, strings.Fields(del)...); err != nil {
				t.Errorf("%s: %v\n%s", del, err, out)
			}
		}
	}
	t.Cleanup(rm)
	return rm
}

func farRules(ns, dst, veth string) []dropRule {
	match := fmt.Sprintf("ip daddr %s udp dport %d drop", dst, farPort)
	nft := func(name, family, hook string) dropRule {
		return dropRule{name, func(t *testing.T) func() {
			return nftRule(t, ns, fmt.Sprintf("table %s prg_t {\n chain c {\n  type filter hook %s priority 0;\n  %s\n }\n}\n", family, hook, match),
				"nft delete table "+family+" prg_t")
		}}
	}
	return []dropRule{
		nft("nft postrouting", "inet", "postrouting"),
		nft("nft forward priority 0", "inet", "forward"),
		nft("nft bridge postrouting", "bridge", "postrouting"),
		{"tc (cls_bpf) drop on the pod's veth", func(t *testing.T) func() { return tcDrop(t, ns, veth) }},
	}
}

// podVeth is the bridge-side veth of the pod in ctrNS, as discovery sees it from host.
func podVeth(t *testing.T, host, ctrNS string) string {
	t.Helper()
	topo, err := datapath.Discover(host, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range topo.ByStage(datapath.StageVethHost) {
		if strings.HasPrefix(d.Peer, ctrNS+"/") {
			return d.Name
		}
	}
	t.Fatalf("no veth of %s in %s: %+v", ctrNS, host, topo.Devs)
	return ""
}

// dropAfter runs a UDP flow (source port sport) to the sink, adds rule once the flow runs (and,
// with prism, is redirected), and says how many datagrams arrived after the rule and how late
// the last one came.
func dropAfter(t *testing.T, h2, src, dst string, sport int, sink *udpSink, r dropRule, prism bool) (int64, time.Duration) {
	t.Helper()
	stop := startSource(t, src, dst, farPort, sport)
	n0 := sink.n.Load()
	var b Stats
	if prism {
		b = inspect(t, h2).Stats
	}
	labtest.Eventually(t, 3*time.Second, "flow running", func() (bool, string) {
		if sink.n.Load()-n0 < 200 {
			return false, fmt.Sprint(sink.n.Load() - n0)
		}
		if !prism {
			return true, ""
		}
		s := inspect(t, h2).Stats
		return s.Redirected-b.Redirected > 100, fmt.Sprintf("%+v", s)
	})
	rm := r.add(t)
	added := time.Now()
	n1 := sink.n.Load()
	time.Sleep(farBound + 500*time.Millisecond)
	stop()
	after := sink.n.Load() - n1
	last := time.Unix(0, sink.last.Load()).Sub(added)
	rm()
	return after, last
}

// TestLabGateFarEnd: issue 28's reproduction, for each place a drop can sit on the normal path.
func TestLabGateFarEnd(t *testing.T) {
	requireTools(t, "nft", "tc", "conntrack")
	l := labtest.Up(t, lab.Spec{Name: "tprfe", Style: lab.StyleFlannel, Containers: 1})
	h2 := l.Hosts[1].Netns
	c11, _ := l.Node("h1-c1")
	c21, _ := l.Node("h2-c1")
	dst := c21.AddrOnly()
	sink := startSink(t, c21.Netns, dst, farPort)
	rules := farRules(h2, dst, podVeth(t, h2, c21.Netns))

	vanilla := map[string]time.Duration{}
	for i, r := range rules {
		n, last := dropAfter(t, h2, c11.Netns, dst, 41000+i, sink, r, false)
		vanilla[r.name] = last
		t.Logf("vanilla, %s: %d datagrams after the rule, the last %v after it", r.name, n, last.Round(time.Millisecond))
		if last > farBound {
			t.Fatalf("vanilla, %s: the rule does not stop the flow (last datagram %v after it): the test proves nothing", r.name, last)
		}
	}
	if _, err := datapath.Attach(context.Background(), h2, Name, datapath.Options{Extra: map[string]string{OptRules: fmt.Sprintf("proto=udp dport=%d", farPort)}}); err != nil {
		t.Fatal(err)
	}
	labtest.DetachAtEnd(t, h2)
	for i, r := range rules {
		n, last := dropAfter(t, h2, c11.Netns, dst, 42000+i, sink, r, true)
		t.Logf("prism, %s: %d datagrams after the rule, the last %v after it (vanilla %v)", r.name, n, last.Round(time.Millisecond), vanilla[r.name].Round(time.Millisecond))
		if last > farBound {
			t.Errorf("prism, %s: datagrams still delivered %v after the rule (%d in all); rule (a) bounds it at %v", r.name, last, n, farBound)
		}
	}
	if s := inspect(t, h2).Stats; s.Delivered == 0 || s.Redirected == 0 {
		t.Errorf("gate never vouched for a flow: %+v", s)
	}
}

// tcDrop puts a classic tc filter (cls_bpf, direct action, on clsact egress) on veth in ns that
// drops every IPv4 frame toward the pod: it runs after every tcx program of the device (the
// kernel has no gact action here, so the drop is a two-instruction BPF program).
func tcDrop(t *testing.T, ns, veth string) func() {
	t.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL", Instructions: asm.Instructions{
		asm.LoadMem(asm.R2, asm.R1, 16, asm.Word), // __sk_buff.protocol, network order
		asm.JNE.Imm(asm.R2, 0x0008, "pass"),       // htons(ETH_P_IP) on a little-endian machine
		asm.Mov.Imm(asm.R0, 2),                    // TC_ACT_SHOT
		asm.Return(),
		asm.Mov.Imm(asm.R0, -1).WithSymbol("pass"), // TC_ACT_UNSPEC: the next filter, or the qdisc
		asm.Return(),
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	if out, err := netnsutil.Run(context.Background(), ns, "tc", "qdisc", "add", "dev", veth, "clsact"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	removed := false
	rm := func() {
		if !removed {
			removed = true
			_, _ = netnsutil.Run(context.Background(), ns, "tc", "qdisc", "del", "dev", veth, "clsact")
		}
	}
	t.Cleanup(rm)
	if err := netnsutil.Do(ns, func() error {
		l, err := netlink.LinkByName(veth)
		if err != nil {
			return err
		}
		return netlink.FilterAdd(&netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: l.Attrs().Index, Parent: netlink.HANDLE_MIN_EGRESS,
			Handle: 1, Protocol: unix.ETH_P_ALL, Priority: 1}, Fd: prog.FD(), Name: "prg-drop", DirectAction: true})
	}); err != nil {
		t.Fatalf("tc filter: %v", err)
	}
	return rm
}
