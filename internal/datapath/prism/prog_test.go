package prism

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil"
)

// The program runs through BPF_PROG_TEST_RUN: the kernel builds an skb on the loopback device of
// the calling thread's namespace, so each test env has a namespace of its own (its conntrack
// table is the one the firewall gate reads) and configures its loopback (ifindex 1) as the VXLAN
// device and as the endpoints' veth (a devmap entry needs a real device).

const (
	tcShot     = 2
	tcRedirect = 7
	loIfindex  = 1
)

var (
	vtepMAC   = net.HardwareAddr{0x06, 0x42, 198, 18, 0, 2} // the VXLAN device (flannel.1)
	remoteMAC = net.HardwareAddr{0x06, 0x42, 198, 18, 0, 1} // the remote VTEP
	ctrMAC    = net.HardwareAddr{0x02, 0x42, 198, 19, 2, 2} // the container's eth0
	brMAC     = net.HardwareAddr{0x0e, 0x42, 198, 19, 2, 1} // cni0
	srcCtrMAC = net.HardwareAddr{0x02, 0x42, 198, 19, 1, 2} // the sending container
)

const (
	ctrIP   = "198.19.2.2"
	peerIP  = "198.19.1.2"
	ctrIP6  = "fd00:19:2::2"
	peerIP6 = "fd00:19:1::2"
)

type progEnv struct {
	t     *testing.T
	o     *objects
	ns    *netnsutil.NS
	inode uint32
}

var progEnvs atomic.Int32

func newProgEnv(t *testing.T, routed bool, rules string) *progEnv {
	t.Helper()
	// Tests pin the thread to a CPU (pinThread) and read per-CPU results: keep the thread.
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	o := testutil.LoadObjects(t, loadObjects)
	name := fmt.Sprintf("prg-prt%d-%d", os.Getpid(), progEnvs.Add(1))
	testutil.TempNetns(t, name)
	ns, err := netnsutil.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	ino, err := netnsutil.Inode(netnsutil.Path(name))
	if err != nil {
		t.Fatal(err)
	}
	e := &progEnv{t: t, o: o, ns: ns, inode: uint32(ino)}
	if err := o.writeGate(defaultVerify); err != nil {
		t.Fatal(err)
	}
	dev := prsPrismDev{}
	copy(dev.Mac[:], vtepMAC)
	if routed {
		dev.Routed = 1
	}
	if err := o.PrgPrismDev.Put(prsPrgDevKey{Netns: e.inode, Ifindex: loIfindex}, dev); err != nil {
		t.Fatal(err)
	}
	e.setRules(rules)
	e.endpoint(ctrIP, 7, loIfindex, 0)
	e.endpoint(ctrIP6, 8, loIfindex, 0)
	return e
}

func (e *progEnv) setRules(text string) {
	e.t.Helper()
	rs, err := ParseRules(text)
	if err != nil {
		e.t.Fatal(err)
	}
	rs, err = mergeRules(nil, rs)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, r := range rs {
		if err := e.o.resetCounters(r.ID); err != nil {
			e.t.Fatal(err)
		}
	}
	if err := e.o.writeRules(rs); err != nil {
		e.t.Fatal(err)
	}
}

// endpoint installs an endpoint for addr whose veth is devIfindex in devmap slot (the entry
// itself says epIfindex), with the given flags.
func (e *progEnv) endpoint(addr string, slot uint32, epIfindex int, flags uint32) {
	e.t.Helper()
	a := netip.MustParseAddr(addr)
	k := prsPrismEpKey{Netns: e.inode, Family: 4, Addr: addrWords(a)}
	if a.Is6() {
		k.Family = 6
	}
	v := prsPrismEp{Slot: slot, Ifindex: uint32(epIfindex), Flags: flags}
	copy(v.CtrMac[:], ctrMAC)
	copy(v.BrMac[:], brMAC)
	if err := e.o.PrgPrismPort.Put(slot, prsBpfDevmapVal{Ifindex: loIfindex}); err != nil {
		e.t.Fatalf("devmap put: %v", err)
	}
	if err := e.o.PrgPrismEp.Put(k, v); err != nil {
		e.t.Fatal(err)
	}
}

func (e *progEnv) run(data []byte) (uint32, []byte) {
	e.t.Helper()
	out := make([]byte, len(data)+256)
	opts := &ebpf.RunOptions{Data: data, DataOut: out}
	var ret uint32
	err := e.ns.Do(func() error {
		var err error
		ret, err = e.o.PrgPrismVx.Run(opts)
		return err
	})
	if err != nil {
		e.t.Fatalf("test run: %v", err)
	}
	return ret, opts.DataOut
}

func (e *progEnv) stats() Stats {
	e.t.Helper()
	s, err := e.o.stats()
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

// docker-style frame to the local container: dst MAC is the container's.
func l2(proto byte, dport uint16) frame {
	return frame{dst: ctrMAC, src: srcCtrMAC, saddr: peerIP, daddr: ctrIP, proto: proto, sport: 40000, dport: dport, payload: 32}
}

func TestClassification(t *testing.T) {
	e := newProgEnv(t, false, `
		proto=tcp dport=11111
		proto=udp sport=5000-5999
		dscp=ef
		src=198.19.3.0/24
		proto=tcp dport=7000 family=ipv6
		proto=udp dst=198.19.2.2`)
	v6 := func(f frame) frame { f.v6, f.saddr, f.daddr = true, peerIP6, ctrIP6; return f }
	cases := []struct {
		name string
		f    frame
		raw  []byte
		want uint32
		rule int // -1: no rule matched
		stat func(Stats) uint64
	}{
		{"tcp dport match", l2(6, 11111), nil, tcRedirect, 0, func(s Stats) uint64 { return s.Redirected }},
		{"tcp other port", l2(6, 80), nil, tcxNext, -1, func(s Stats) uint64 { return s.LP }},
		{"udp sport in range", func() frame { f := l2(17, 9); f.sport = 5500; return f }(), nil, tcRedirect, 1, nil},
		{"udp sport past range", func() frame { f := l2(17, 9); f.sport = 6000; return f }(), nil, tcRedirect, 5, nil},
		{"dscp ef", func() frame { f := l2(6, 80); f.tos = 46 << 2; return f }(), nil, tcRedirect, 2, nil},
		{"dscp af41 only", func() frame { f := l2(6, 80); f.tos = 34 << 2; return f }(), nil, tcxNext, -1, nil},
		{"src cidr", func() frame { f := l2(6, 80); f.saddr = "198.19.3.9"; return f }(), nil, tcRedirect, 3, nil},
		{"ipv4 fragment, port rule", func() frame { f := l2(6, 11111); f.fragOff = 0x2000; return f }(), nil, tcxNext, -1,
			func(s Stats) uint64 { return s.Frag }},
		// Conntrack cannot be asked about a fragment (no ports): the normal path decides.
		{"ipv4 later fragment, addr rule", func() frame { f := l2(17, 1); f.fragOff = 100; return f }(), nil, tcxNext, 5,
			func(s Stats) uint64 { return s.NoTCPUDP }},
		{"ipv6 tcp match", v6(l2(6, 7000)), nil, tcRedirect, 4, nil},
		{"ipv6 rule ignores ipv4", l2(6, 7000), nil, tcxNext, -1, nil},
		{"ipv6 hop-by-hop then tcp", func() frame { f := v6(l2(6, 7000)); f.hbh = true; return f }(), nil, tcRedirect, 4, nil},
		{"ipv6 fragment", func() frame { f := v6(l2(6, 7000)); f.fragOff = 1; return f }(), nil, tcxNext, -1, func(s Stats) uint64 { return s.Frag }},
		{"ipv6 dscp ef", func() frame { f := v6(l2(17, 1)); f.tos = 46 << 2; return f }(), nil, tcRedirect, 2, nil},
		{"vlan tagged", func() frame { f := l2(6, 11111); f.vlan = true; return f }(), nil, tcxNext, -1, func(s Stats) uint64 { return s.Unparsed }},
		{"short: options past the end", frame{}, func() []byte { b := l2(6, 11111).bytes()[:14+20]; b[14] = 0x4f; return b }(), tcxNext, -1,
			func(s Stats) uint64 { return s.Unparsed }},
		{"truncated tcp header", frame{}, l2(6, 11111).bytes()[:14+20+2], tcxNext, -1, func(s Stats) uint64 { return s.Unparsed }},
		{"garbage: ip version 5", frame{}, func() []byte { b := l2(6, 11111).bytes(); b[14] = 0x55; return b }(), tcxNext, -1,
			func(s Stats) uint64 { return s.Unparsed }},
		{"garbage: ihl 3", frame{}, func() []byte { b := l2(6, 11111).bytes(); b[14] = 0x43; return b }(), tcxNext, -1,
			func(s Stats) uint64 { return s.Unparsed }},
		{"arp", frame{}, append(append(append(append([]byte{}, ctrMAC...), srcCtrMAC...), 0x08, 0x06), make([]byte, 28)...), tcxNext, -1,
			func(s Stats) uint64 { return s.Unparsed }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			data := c.raw
			if data == nil {
				data = c.f.bytes()
			}
			if c.want == tcRedirect {
				e.allow(c.f)
			}
			before := e.stats()
			var rc RuleCount
			if c.rule >= 0 {
				rc, _ = e.o.ruleCount(c.rule)
			}
			ret, out := e.run(data)
			if ret != c.want {
				t.Fatalf("verdict %d, want %d", ret, c.want)
			}
			if !bytes.Equal(out, data) {
				t.Errorf("docker style must not change the frame:\n got %x\nwant %x", out, data)
			}
			after := e.stats()
			if after.Seen != before.Seen+1 {
				t.Errorf("seen counter %d -> %d", before.Seen, after.Seen)
			}
			if c.stat != nil && c.stat(after) != c.stat(before)+1 {
				t.Errorf("expected counter did not move: %+v -> %+v", before, after)
			}
			if c.rule >= 0 {
				rc2, _ := e.o.ruleCount(c.rule)
				if rc2.Packets != rc.Packets+1 || rc2.Bytes != rc.Bytes+uint64(len(data)) {
					t.Errorf("rule %d counter %+v -> %+v (frame %d bytes)", c.rule, rc, rc2, len(data))
				}
			} else if after.HP != before.HP {
				t.Errorf("no rule should match, HP counter moved %d -> %d", before.HP, after.HP)
			}
		})
	}
}

func TestDockerL2Checks(t *testing.T) {
	e := newProgEnv(t, false, "proto=tcp dport=11111")
	f := l2(6, 11111)
	f.dst = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	before := e.stats()
	if ret, out := e.run(f.bytes()); ret != tcxNext || !bytes.Equal(out, f.bytes()) {
		t.Fatalf("a frame the bridge would not forward to the container must take the normal path: %d", ret)
	}
	if e.stats().L2 != before.L2+1 {
		t.Error("L2 counter did not move")
	}
}

func TestRoutedRewriteEqualsForwarding(t *testing.T) {
	e := newProgEnv(t, true, "proto=tcp dport=11111; proto=udp dport=11111")
	for _, c := range []struct {
		name string
		f    frame
	}{
		{"ipv4 tcp", frame{dst: vtepMAC, src: remoteMAC, saddr: peerIP, daddr: ctrIP, proto: 6, sport: 40000, dport: 11111, payload: 64}},
		{"ipv4 udp tos", frame{dst: vtepMAC, src: remoteMAC, saddr: peerIP, daddr: ctrIP, proto: 17, sport: 40000, dport: 11111, tos: 0xb8, ttl: 2}},
		{"ipv4 ttl 255", frame{dst: vtepMAC, src: remoteMAC, saddr: peerIP, daddr: ctrIP, proto: 6, sport: 1, dport: 11111, ttl: 255}},
		{"ipv6 tcp", frame{dst: vtepMAC, src: remoteMAC, v6: true, saddr: peerIP6, daddr: ctrIP6, proto: 6, sport: 40000, dport: 11111, payload: 10}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e.allow(c.f)
			ret, out := e.run(c.f.bytes())
			if ret != tcRedirect {
				t.Fatalf("verdict %d, want redirect", ret)
			}
			want := c.f.routed(ctrMAC, brMAC)
			if !bytes.Equal(out, want) {
				t.Fatalf("headers differ from the forwarded frame:\n got %x\nwant %x", out, want)
			}
		})
	}
	t.Run("ttl 1 takes the normal path", func(t *testing.T) {
		f := frame{dst: vtepMAC, src: remoteMAC, saddr: peerIP, daddr: ctrIP, proto: 6, sport: 1, dport: 11111, ttl: 1}
		before := e.stats()
		if ret, out := e.run(f.bytes()); ret != tcxNext || !bytes.Equal(out, f.bytes()) {
			t.Fatalf("verdict %d, frame changed: %v", ret, !bytes.Equal(out, f.bytes()))
		}
		if e.stats().TTL != before.TTL+1 {
			t.Error("TTL counter did not move")
		}
	})
	t.Run("not addressed to the vtep", func(t *testing.T) {
		f := frame{dst: ctrMAC, src: remoteMAC, saddr: peerIP, daddr: ctrIP, proto: 6, sport: 1, dport: 11111}
		if ret, out := e.run(f.bytes()); ret != tcxNext || !bytes.Equal(out, f.bytes()) {
			t.Fatalf("verdict %d", ret)
		}
	})
	t.Run("lp untouched", func(t *testing.T) {
		f := frame{dst: vtepMAC, src: remoteMAC, saddr: peerIP, daddr: ctrIP, proto: 6, sport: 1, dport: 80}
		if ret, out := e.run(f.bytes()); ret != tcxNext || !bytes.Equal(out, f.bytes()) {
			t.Fatalf("verdict %d", ret)
		}
	})
}

func TestVanishedEndpointsAreDroppedNeverRedirected(t *testing.T) {
	e := newProgEnv(t, false, "proto=tcp dport=11111")
	send := func(daddr string) (uint32, Stats, Stats) {
		f := l2(6, 11111)
		f.daddr = daddr
		before := e.stats()
		ret, _ := e.run(f.bytes())
		return ret, before, e.stats()
	}
	// No endpoint at all (a container the agent has not seen yet): the normal path decides.
	if ret, b, a := send("198.19.2.77"); ret != tcxNext || a.Miss != b.Miss+1 {
		t.Errorf("unknown endpoint: verdict %d, miss %d -> %d", ret, b.Miss, a.Miss)
	}
	// The veth was unregistered: the kernel removed its devmap slot.
	e.endpoint("198.19.2.10", 20, loIfindex, 0)
	if err := e.o.PrgPrismPort.Delete(uint32(20)); err != nil {
		t.Fatal(err)
	}
	if ret, b, a := send("198.19.2.10"); ret != tcShot || a.Stale != b.Stale+1 || a.Redirected != b.Redirected {
		t.Errorf("vanished veth: verdict %d, stale %d -> %d", ret, b.Stale, a.Stale)
	}
	// The ifindex now belongs to another device than the one recorded.
	e.endpoint("198.19.2.11", 21, 4242, 0)
	if ret, b, a := send("198.19.2.11"); ret != tcShot || a.Stale != b.Stale+1 {
		t.Errorf("reused ifindex: verdict %d, stale %d -> %d", ret, b.Stale, a.Stale)
	}
	// Userspace saw the container go and left a tombstone.
	e.endpoint("198.19.2.12", 22, loIfindex, epGone)
	if ret, b, a := send("198.19.2.12"); ret != tcShot || a.Gone != b.Gone+1 {
		t.Errorf("tombstone: verdict %d, gone %d -> %d", ret, b.Gone, a.Gone)
	}
}

func TestRulesChangeLive(t *testing.T) {
	e := newProgEnv(t, false, "proto=tcp dport=11111")
	e.allow(l2(6, 11111))
	e.allow(l2(6, 80))
	if ret, _ := e.run(l2(6, 11111).bytes()); ret != tcRedirect {
		t.Fatalf("before: %d", ret)
	}
	e.setRules("proto=tcp dport=80")
	if ret, _ := e.run(l2(6, 11111).bytes()); ret != tcxNext {
		t.Errorf("old rule still matches after the change: %d", ret)
	}
	if ret, _ := e.run(l2(6, 80).bytes()); ret != tcRedirect {
		t.Errorf("new rule does not match: %d", ret)
	}
	e.setRules("")
	if ret, _ := e.run(l2(6, 80).bytes()); ret != tcxNext {
		t.Errorf("no rules must mean no HP: %d", ret)
	}
}

func TestUnconfiguredDevicePasses(t *testing.T) {
	e := newProgEnv(t, false, "all")
	if err := e.o.PrgPrismDev.Delete(prsPrgDevKey{Netns: e.inode, Ifindex: loIfindex}); err != nil {
		t.Fatal(err)
	}
	before := e.stats()
	if ret, _ := e.run(l2(6, 1).bytes()); ret != tcxNext || e.stats().NoDev != before.NoDev+1 {
		t.Fatalf("verdict %d", ret)
	}
}
