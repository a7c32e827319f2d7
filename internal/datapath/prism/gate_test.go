package prism

import (
	"bytes"
	"context"
	"math/bits"
	"net"
	"net/netip"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/datapath/ctnl"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// The firewall gate in test runs: conntrack entries are inserted with conntrack(8) into the
// env's own namespace (the table bpf_skb_ct_lookup reads there), and the normal path's delivery
// (prg_prism_dlv's record) either comes from a test run of its body or is written into
// prg_prism_acc directly.

// ctInsert adds a conntrack entry for f's flow; reply: TCP established with the reply seen,
// otherwise (TCP) SYN_SENT, or (UDP) an unreplied entry. Each insert is confirmed, as
// ctnetlink's are.
func (e *progEnv) ctInsert(f frame, reply bool) {
	e.t.Helper()
	args := e.ctArgs(f, reply)
	// The same flow again (another case's frame) is an entry that exists: delete it first.
	del := append([]string{"conntrack", "-D"}, args[2:12]...)
	_, _ = netnsutil.Run(context.Background(), e.ns.Name(), del...)
	e.ctRun(args)
}

// ctInsertNew is ctInsert(f, true) for a flow known to have no entry (one process less),
// marked liberal as the agent does for a TCP flow the gate asks about.
func (e *progEnv) ctInsertNew(f frame) { e.t.Helper(); e.ctRun(e.ctArgs(f, true)); e.liberal(f) }

// liberal does what the agent does when the gate asks about a TCP flow (ctliberal.go): it
// marks f's conntrack entry liberal both ways. A no-op for UDP.
func (e *progEnv) liberal(f frame) {
	e.t.Helper()
	if f.proto != 6 {
		return
	}
	s, err := ctnl.Open(e.ns.Name())
	if err != nil {
		e.t.Fatal(err)
	}
	defer s.Close()
	if missing, err := s.Send(ctnl.AppendLiberal(nil, e.tuple(f), 1)); err != nil || missing != 0 {
		e.t.Fatalf("mark %v liberal: %d missing, %v", e.tuple(f), missing, err)
	}
}

// strict clears the liberal flag of f's TCP entry both ways: an entry conntrack(8) inserts is
// liberal already (the kernel cannot know its window), one a real handshake made is not.
func (e *progEnv) strict(f frame) {
	e.t.Helper()
	s, err := ctnl.Open(e.ns.Name())
	if err != nil {
		e.t.Fatal(err)
	}
	defer s.Close()
	var tcp, info []byte
	clear := []byte{0, ctnl.TCPFlagBeLiberal} // struct nf_ct_tcp_flags {flags, mask}
	tcp = ctnl.Attr(tcp, nl.CTA_PROTOINFO_TCP_FLAGS_ORIGINAL, clear)
	tcp = ctnl.Attr(tcp, nl.CTA_PROTOINFO_TCP_FLAGS_REPLY, clear)
	info = ctnl.Attr(info, nl.CTA_PROTOINFO_TCP|unix.NLA_F_NESTED, tcp)
	attrs := ctnl.Attr(ctnl.TupleAttr(e.tuple(f)), nl.CTA_PROTOINFO|unix.NLA_F_NESTED, info)
	if missing, err := s.Send(ctnl.AppendMsg(nil, ctnl.MsgNew, unix.AF_INET, 1, attrs)); err != nil || missing != 0 {
		e.t.Fatalf("make %v strict: %d missing, %v", e.tuple(f), missing, err)
	}
}

// tuple is f's conntrack tuple.
func (e *progEnv) tuple(f frame) ctnl.Tuple {
	return ctnl.Tuple{Src: netip.MustParseAddr(f.saddr), Dst: netip.MustParseAddr(f.daddr), Sport: f.sport, Dport: f.dport, Proto: f.proto}
}

func (e *progEnv) ctArgs(f frame, reply bool) []string {
	e.t.Helper()
	requireTools(e.t, "conntrack")
	args := []string{"conntrack", "-I", "-p", map[byte]string{6: "tcp", 17: "udp"}[f.proto], "-s", f.saddr, "-d", f.daddr,
		"--sport", strconv.Itoa(int(f.sport)), "--dport", strconv.Itoa(int(f.dport)), "-t", "120"}
	if f.proto == 6 {
		if reply {
			args = append(args, "--state", "ESTABLISHED", "-u", "SEEN_REPLY,ASSURED")
		} else {
			args = append(args, "--state", "SYN_SENT")
		}
	}
	return args
}

func (e *progEnv) ctRun(args []string) {
	e.t.Helper()
	if out, err := netnsutil.Run(context.Background(), e.ns.Name(), args...); err != nil {
		e.t.Fatalf("%v\n%s", err, out)
	}
}

func (e *progEnv) ctFlush() {
	e.t.Helper()
	if out, err := netnsutil.Run(context.Background(), e.ns.Name(), "conntrack", "-F"); err != nil {
		e.t.Fatalf("%v\n%s", err, out)
	}
}

// requireTools skips the test where a command it needs is not installed (scripts/setup.sh
// installs them).
func requireTools(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			t.Skipf("%s is not installed (scripts/setup.sh installs it)", n)
		}
	}
}

// flowKey is prg_prism_acc's key for f in this env.
func (e *progEnv) flowKey(f frame) prsPrismFlowKey {
	k := prsPrismFlowKey{Netns: e.inode, Family: 4}
	if f.v6 {
		k.Family = 6
	}
	k.Flow.Saddr = addrWords(netip.MustParseAddr(f.saddr))
	k.Flow.Daddr = addrWords(netip.MustParseAddr(f.daddr))
	k.Flow.Sport, k.Flow.Dport = bits.ReverseBytes16(f.sport), bits.ReverseBytes16(f.dport)
	k.Flow.Proto = f.proto
	return k
}

func monoNow(t *testing.T) uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	return uint64(ts.Nano())
}

// forwarded records that the normal path delivered f's flow to the endpoint's veth (loopback,
// with the container's MAC) ago (and re-verified it probeAgo).
func (e *progEnv) forwarded(f frame, ago, probeAgo time.Duration) {
	e.t.Helper()
	e.deliveredTo(f, ago, probeAgo, loIfindex, ctrMAC)
}

// deliveredTo records that the normal path delivered f's flow through veth ifindex with dst MAC
// mac, ago.
func (e *progEnv) deliveredTo(f frame, ago, probeAgo time.Duration, ifindex uint32, mac net.HardwareAddr) {
	e.t.Helper()
	now := monoNow(e.t)
	v := prsPrismAcc{SeenNs: now - uint64(ago), ProbeNs: now - uint64(probeAgo), Ifindex: ifindex}
	copy(v.Mac[:], mac)
	if err := e.o.PrgPrismAcc.Put(e.flowKey(f), v); err != nil {
		e.t.Fatal(err)
	}
}

// allow makes f's flow one the normal path accepted: an established conntrack entry, seen past
// FORWARD just now.
func (e *progEnv) allow(f frame) {
	e.t.Helper()
	e.ctInsert(f, true)
	e.liberal(f)
	e.forwarded(f, 0, 0)
}

// asks returns a reader of the asks the gate sent the agent since this call (prg_prism_ask).
func (e *progEnv) asks() func() []ctnl.Tuple {
	e.t.Helper()
	rd, err := ringbuf.NewReader(e.o.PrgPrismAsk)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { rd.Close() })
	drain := func() []ctnl.Tuple {
		var out []ctnl.Tuple
		for {
			rd.SetDeadline(time.Now())
			r, err := rd.Read()
			if err != nil {
				return out
			}
			dom, tu, ok := parseAsk(r.RawSample)
			if !ok || dom != e.inode {
				e.t.Fatalf("ask % x: domain %d (env %d), ok %v", r.RawSample, dom, e.inode, ok)
			}
			out = append(out, tu)
		}
	}
	drain()
	return drain
}

func TestGate(t *testing.T) {
	e := newProgEnv(t, false, "proto=tcp dport=11111; proto=udp dport=11111; proto=icmp")
	step := func(name string, f frame, want uint32, counter func(Stats) uint64) {
		t.Helper()
		before := e.stats()
		ret, out := e.run(f.bytes())
		after := e.stats()
		if ret != want {
			t.Fatalf("%s: verdict %d, want %d (%+v)", name, ret, want, after)
		}
		if !bytes.Equal(out, f.bytes()) {
			t.Errorf("%s: the frame changed", name)
		}
		if counter != nil && counter(after) != counter(before)+1 {
			t.Errorf("%s: its counter did not move: %+v -> %+v", name, before, after)
		}
		if want != tcRedirect && after.Redirected != before.Redirected {
			t.Errorf("%s: redirected", name)
		}
	}
	tcp := l2(6, 11111)
	step("tcp, no conntrack entry", tcp, tcxNext, func(s Stats) uint64 { return s.NoCT })
	e.ctInsert(tcp, false)
	e.forwarded(tcp, 0, 0)
	step("tcp, handshake not through (no reply seen)", tcp, tcxNext, func(s Stats) uint64 { return s.CTNew })
	e.ctFlush()
	e.ctInsert(tcp, true)
	e.forwarded(tcp, time.Second, 0)
	step("tcp established, delivery stale", tcp, tcxNext, func(s Stats) uint64 { return s.Unseen })
	e.forwarded(tcp, 950*time.Millisecond, 0)
	step("tcp established, delivered 950 ms ago (window 300 ms)", tcp, tcxNext, func(s Stats) uint64 { return s.Unseen })
	e.deliveredTo(tcp, 0, 0, loIfindex+41, ctrMAC)
	step("tcp established, delivered through another veth", tcp, tcxNext, func(s Stats) uint64 { return s.Elsewhere })
	e.deliveredTo(tcp, 0, 0, loIfindex, srcCtrMAC)
	step("tcp established, delivered with another MAC", tcp, tcxNext, func(s Stats) uint64 { return s.Elsewhere })
	e.forwarded(tcp, 0, 0)
	e.strict(tcp)
	asks := e.asks()
	step("tcp established and forwarded, entry tracked strictly", tcp, tcxNext, func(s Stats) uint64 { return s.Strict })
	if got := asks(); len(got) != 1 || got[0] != e.tuple(tcp) {
		t.Fatalf("asks to the agent %v, want [%v]", got, e.tuple(tcp))
	}
	step("asked within the last 20 ms: not again", tcp, tcxNext, func(s Stats) uint64 { return s.Strict })
	if got := asks(); len(got) != 0 {
		t.Fatalf("asked again at once: %v", got)
	}
	e.liberal(tcp)
	step("tcp established and forwarded, entry liberal", tcp, tcRedirect, func(s Stats) uint64 { return s.Redirected })
	e.forwarded(tcp, 50*time.Millisecond, 2*defaultVerify)
	step("re-verification due", tcp, tcxNext, func(s Stats) uint64 { return s.Probe })
	step("re-verification sent: redirected again", tcp, tcRedirect, nil)
	e.ctFlush()
	step("conntrack flushed", tcp, tcxNext, func(s Stats) uint64 { return s.NoCT })

	udp := l2(17, 11111)
	step("udp, no entry", udp, tcxNext, func(s Stats) uint64 { return s.NoCT })
	e.ctInsert(udp, false) // unreplied but confirmed: the first datagram went through
	step("udp confirmed, never seen past FORWARD", udp, tcxNext, func(s Stats) uint64 { return s.Unseen })
	e.forwarded(udp, 0, 0)
	step("udp confirmed and forwarded", udp, tcRedirect, nil)

	step("icmp", frame{dst: ctrMAC, src: srcCtrMAC, saddr: peerIP, daddr: ctrIP, proto: 1, payload: 8}, tcxNext, func(s Stats) uint64 { return s.NoTCPUDP })
	// Fragments: TestClassification ("ipv4 later fragment, addr rule").
}

// runDlv runs the body of prg_prism_dlv on f as the pod's device receives it (the test entry
// prg_prism_dlvt takes every frame as tagged: a test run cannot set tc_index); tagged false runs
// prg_prism_dlv itself, which sees an untagged frame.
func (e *progEnv) runDlv(f frame, tagged bool) {
	e.t.Helper()
	prog := e.o.PrgPrismDlv
	if tagged {
		prog = e.o.PrgPrismDlvt
	}
	var ret uint32
	err := e.ns.Do(func() error {
		var err error
		ret, err = prog.Run(&ebpf.RunOptions{Data: f.bytes()})
		return err
	})
	if err != nil {
		e.t.Fatalf("test run: %v", err)
	}
	if ret != tcxNext {
		e.t.Fatalf("prg_prism_dlv returned %d, want TCX_NEXT (it never changes a verdict)", ret)
	}
}

// podDevice describes the env's loopback as a pod's eth0 whose bridge-side veth is hostIfindex.
func (e *progEnv) podDevice(hostIfindex uint32) {
	e.t.Helper()
	if err := e.o.PrgPrismPod.Put(prsPrgDevKey{Netns: e.inode, Ifindex: loIfindex}, prsPrismPod{Domain: e.inode, Ifindex: hostIfindex}); err != nil {
		e.t.Fatal(err)
	}
}

// prg_prism_dlv records a tagged frame the normal path delivered to a pod device prism knows, with
// the bridge-side veth and the MAC; an untagged frame (a redirect, LP, anything the pod injects)
// and a device prism does not know are never recorded; what it records opens the gate.
func TestDeliveryRecorded(t *testing.T) {
	e := newProgEnv(t, false, "proto=tcp dport=11111")
	hp, hp6 := l2(6, 11111), l2(6, 11111)
	hp6.v6, hp6.saddr, hp6.daddr = true, peerIP6, ctrIP6
	var v prsPrismAcc
	e.ctInsert(hp, true) // first: conntrack(8) takes longer than the re-verification interval

	e.runDlv(hp, true)
	if err := e.o.PrgPrismAcc.Lookup(e.flowKey(hp), &v); err == nil {
		t.Fatal("recorded at a device no pod record names")
	}
	if s := e.stats(); s.DlvNoPod != 1 {
		t.Errorf("unknown pod counter %d, want 1", s.DlvNoPod)
	}
	e.podDevice(loIfindex)
	e.runDlv(hp, false)
	if err := e.o.PrgPrismAcc.Lookup(e.flowKey(hp), &v); err == nil {
		t.Fatal("an untagged frame (not handed to the normal path by prism) was recorded")
	}
	e.runDlv(hp, true)
	e.runDlv(hp6, true)
	if err := e.o.PrgPrismAcc.Lookup(e.flowKey(hp6), &v); err != nil {
		t.Errorf("IPv6 HP flow not recorded: %v", err)
	}
	if err := e.o.PrgPrismAcc.Lookup(e.flowKey(hp), &v); err != nil {
		t.Fatalf("HP flow not recorded: %v", err)
	}
	if now := monoNow(t); v.SeenNs > now || now-v.SeenNs > uint64(5*time.Second) {
		t.Errorf("seen %d, now %d", v.SeenNs, now)
	}
	if v.Ifindex != loIfindex || !bytes.Equal(v.Mac[:], ctrMAC) {
		t.Errorf("recorded veth %d MAC %s, want %d %s", v.Ifindex, net.HardwareAddr(v.Mac[:]), loIfindex, ctrMAC)
	}
	if s := e.stats(); s.Delivered != 2 {
		t.Errorf("delivered counter %d, want 2 (the IPv4 and IPv6 HP frames)", s.Delivered)
	}
	if ret, _ := e.run(hp.bytes()); ret != tcRedirect {
		t.Errorf("delivered and established flow: verdict %d", ret)
	}

	// The same flow delivered to another pod's device (the normal path's routing, neighbour and
	// FDB say the address lives there): the endpoint table's veth is not used.
	e.podDevice(loIfindex + 41)
	e.runDlv(hp, true)
	b := e.stats()
	if ret, _ := e.run(hp.bytes()); ret != tcxNext {
		t.Errorf("flow the normal path delivers through another veth: verdict %d, want the normal path", ret)
	}
	if s := e.stats(); s.Elsewhere != b.Elsewhere+1 || s.Redirected != b.Redirected {
		t.Errorf("elsewhere %d -> %d, redirected %d -> %d", b.Elsewhere, s.Elsewhere, b.Redirected, s.Redirected)
	}
}

// The window never exceeds 1 s, whatever the re-verification interval.
func TestGateWindowBound(t *testing.T) {
	for _, c := range []struct{ verify, want time.Duration }{
		{10 * time.Millisecond, 30 * time.Millisecond}, {100 * time.Millisecond, 300 * time.Millisecond},
		{333 * time.Millisecond, 999 * time.Millisecond}, {time.Second, time.Second}, {10 * time.Second, time.Second}} {
		if got := gateWindow(c.verify); got != c.want {
			t.Errorf("reverify %v: window %v, want %v", c.verify, got, c.want)
		}
	}
}
