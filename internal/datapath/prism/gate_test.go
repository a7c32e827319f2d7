package prism

import (
	"bytes"
	"context"
	"fmt"
	"math/bits"
	"net/netip"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// The firewall gate in test runs: conntrack entries are inserted with conntrack(8) into the
// env's own namespace (the table bpf_skb_ct_lookup reads there), and prg_prism_fwd's verdict
// either comes from its own test run or is written into prg_prism_acc directly.

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

// ctInsertNew is ctInsert(f, true) for a flow known to have no entry (one process less).
func (e *progEnv) ctInsertNew(f frame) { e.t.Helper(); e.ctRun(e.ctArgs(f, true)) }

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

// forwarded records that the normal path forwarded f's flow ago (and re-verified it probeAgo).
func (e *progEnv) forwarded(f frame, ago, probeAgo time.Duration) {
	e.t.Helper()
	now := monoNow(e.t)
	if err := e.o.PrgPrismAcc.Put(e.flowKey(f), prsPrismAcc{SeenNs: now - uint64(ago), ProbeNs: now - uint64(probeAgo)}); err != nil {
		e.t.Fatal(err)
	}
}

// allow makes f's flow one the normal path accepted: an established conntrack entry, seen past
// FORWARD just now.
func (e *progEnv) allow(f frame) {
	e.t.Helper()
	e.ctInsert(f, true)
	e.forwarded(f, 0, 0)
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
	step("tcp established, FORWARD verdict stale", tcp, tcxNext, func(s Stats) uint64 { return s.Unseen })
	e.forwarded(tcp, 0, 0)
	step("tcp established and forwarded", tcp, tcRedirect, func(s Stats) uint64 { return s.Redirected })
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

// nfHookState is the part of struct nf_hook_state a netfilter test run reads (hook, pf).
type nfHookState struct {
	Hook, PF uint8
	_        [46]byte
}

// runFwd runs prg_prism_fwd on f's IP packet as FORWARD would hand it.
func (e *progEnv) runFwd(f frame) error {
	pf := uint8(unix.NFPROTO_IPV4)
	if f.v6 {
		pf = unix.NFPROTO_IPV6
	}
	ctx := nfHookState{Hook: unix.NF_INET_FORWARD, PF: pf}
	var ret uint32
	err := e.ns.Do(func() error {
		var err error
		ret, err = e.o.PrgPrismFwd.Run(&ebpf.RunOptions{Data: f.bytes(), Context: ctx}) // the kernel pulls the Ethernet header
		return err
	})
	if err == nil && ret != 1 {
		err = fmt.Errorf("prg_prism_fwd returned %d, want NF_ACCEPT", ret)
	}
	return err
}

// prg_prism_fwd records HP flows toward a local endpoint, and nothing else; what it records
// opens the gate.
func TestForwardVerdictRecorded(t *testing.T) {
	e := newProgEnv(t, false, "proto=tcp dport=11111")
	hp, lp, elsewhere, hp6 := l2(6, 11111), l2(6, 80), l2(6, 11111), l2(6, 11111)
	elsewhere.daddr = "198.19.9.9"
	hp6.v6, hp6.saddr, hp6.daddr = true, peerIP6, ctrIP6
	for _, f := range []frame{hp, lp, elsewhere, hp6} {
		if err := e.runFwd(f); err != nil {
			t.Skipf("netfilter test run: %v", err)
		}
	}
	var v prsPrismAcc
	if err := e.o.PrgPrismAcc.Lookup(e.flowKey(hp6), &v); err != nil {
		t.Errorf("IPv6 HP flow not recorded: %v", err)
	}
	if err := e.o.PrgPrismAcc.Lookup(e.flowKey(hp), &v); err != nil {
		t.Fatalf("HP flow not recorded: %v", err)
	}
	if now := monoNow(t); v.SeenNs > now || now-v.SeenNs > uint64(5*time.Second) {
		t.Errorf("seen %d, now %d", v.SeenNs, now)
	}
	for _, f := range []frame{lp, elsewhere} {
		if err := e.o.PrgPrismAcc.Lookup(e.flowKey(f), &v); err == nil {
			t.Errorf("flow to %s:%d recorded", f.daddr, f.dport)
		}
	}
	if s := e.stats(); s.Fwd != 2 {
		t.Errorf("fwd counter %d, want 2 (the IPv4 and IPv6 HP flows)", s.Fwd)
	}
	e.ctInsert(hp, true)
	if ret, _ := e.run(hp.bytes()); ret != tcRedirect {
		t.Errorf("forwarded and established flow: verdict %d", ret)
	}
}
