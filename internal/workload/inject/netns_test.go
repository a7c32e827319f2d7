package inject_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil"
	"github.com/peregrine-net/peregrine/internal/workload/inject"
	"github.com/peregrine-net/peregrine/internal/workload/udpsink"
)

// Two "hosts": prg-tinj-a (the emulated remote sender) and prg-tinj-b (the receiver), joined by
// a veth pair eth0<->eth0. b has vxlan0 (VNI 42, port 4789, no learning) holding the overlay
// address the sink listens on, the flannel arrangement (overlay address on the VXLAN device).
const (
	nsA, nsB  = "prg-tinj-a", "prg-tinj-b"
	sinkPort  = 5001
	vni       = 42
	vxlanPort = 4789
)

var (
	underA   = netip.MustParsePrefix("198.18.252.1/24")
	underB   = netip.MustParsePrefix("198.18.252.2/24")
	overlay  = netip.MustParsePrefix("198.19.252.2/24")
	innerSrc = netip.MustParseAddr("198.19.252.1")
)

type testNet struct {
	macA, macB, vxMAC inject.MAC // a's eth0, b's eth0, b's vxlan0
}

// setupNet builds the two namespaces with b's vxlan0.
func setupNet(t *testing.T) testNet {
	t.Helper()
	tn, hb, eb := setupPair(t, "prg-tinj-", nsA, nsB, underA, underB)
	vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "vxlan0", MTU: 1450}, VxlanId: vni,
		VtepDevIndex: eb.Attrs().Index, SrcAddr: net.IP(underB.Addr().AsSlice()), Port: vxlanPort, Learning: false}
	must(t, "add vxlan0", hb.LinkAdd(vx))
	v := linkUp(t, hb, "vxlan0", overlay)
	copy(tn.vxMAC[:], v.Attrs().HardwareAddr)
	return tn
}

// setupPair builds namespaces a and b joined by a veth eth0<->eth0 carrying addrA and addrB, and
// returns their MACs, b's netlink handle and b's eth0. Cleanup (deleting both namespaces, then
// checking nothing named prefix* is left) is registered before anything is created, so a failure
// halfway still leaves nothing behind; leftovers of a crashed earlier run are removed first.
func setupPair(t *testing.T, prefix, a, b string, addrA, addrB netip.Prefix) (testNet, *netlink.Handle, netlink.Link) {
	t.Helper()
	testutil.RequireRoot(t)
	cleanup := func() {
		for _, n := range []string{a, b} {
			if err := netnsutil.Delete(n); err != nil {
				t.Logf("delete %s: %v", n, err)
			}
		}
	}
	cleanup()
	t.Cleanup(func() {
		cleanup()
		testutil.AssertClean(t, prefix)
	})
	for _, n := range []string{a, b} {
		if err := netnsutil.Create(n); err != nil {
			t.Fatal(err)
		}
	}
	ha, hb := handle(t, a), handle(t, b)
	bfd, err := netnsutil.Handle(b)
	if err != nil {
		t.Fatal(err)
	}
	defer bfd.Close()

	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0", MTU: 1500}, PeerName: "eth0",
		PeerNamespace: netlink.NsFd(int(bfd))}
	must(t, "add veth", ha.LinkAdd(veth))
	var tn testNet
	ea := linkUp(t, ha, "eth0", addrA)
	eb := linkUp(t, hb, "eth0", addrB)
	linkUp(t, ha, "lo", netip.Prefix{})
	linkUp(t, hb, "lo", netip.Prefix{})
	copy(tn.macA[:], ea.Attrs().HardwareAddr)
	copy(tn.macB[:], eb.Attrs().HardwareAddr)
	return tn, hb, eb
}

func handle(t *testing.T, ns string) *netlink.Handle {
	t.Helper()
	nh, err := netnsutil.Handle(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	h, err := netlink.NewHandleAt(nh)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

func linkUp(t *testing.T, h *netlink.Handle, name string, addr netip.Prefix) netlink.Link {
	t.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if addr.IsValid() {
		a := &netlink.Addr{IPNet: &net.IPNet{IP: addr.Addr().AsSlice(), Mask: net.CIDRMask(addr.Bits(), 32)}}
		must(t, "addr "+name, h.AddrAdd(l, a))
	}
	must(t, "up "+name, h.LinkSetUp(l))
	return l
}

func must(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func (tn testNet) config() inject.Config {
	return inject.Config{
		Netns: nsA, Device: "eth0",
		DstMAC: tn.macB, SrcIP: underA.Addr(), DstIP: underB.Addr(), DstPort: vxlanPort, VNI: vni,
		InnerDstMAC: tn.vxMAC, InnerSrcIP: innerSrc, InnerDstIP: overlay.Addr(), InnerDstPort: sinkPort,
		Method: inject.MethodPacket, // the AF_PACKET fallback; xdp_test.go covers the default
	}
}

func listen(t *testing.T, cfg udpsink.Config) *udpsink.Sink {
	t.Helper()
	if cfg.Netns == "" {
		cfg.Netns = nsB
	}
	cfg.Port = sinkPort
	s, err := udpsink.Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// runBoth runs the sink and the injector concurrently and returns both results.
func runBoth(t *testing.T, sink *udpsink.Sink, cfg inject.Config) (inject.Stats, udpsink.Stats, time.Duration) {
	t.Helper()
	type sres struct {
		st  udpsink.Stats
		err error
	}
	sc := make(chan sres, 1)
	go func() {
		st, err := sink.Run(context.Background())
		sc <- sres{st, err}
	}()
	start := time.Now()
	ist, err := inject.Run(context.Background(), cfg)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("inject: %v (stats %+v)", err, ist)
	}
	r := <-sc
	if r.err != nil {
		t.Fatalf("sink: %v", r.err)
	}
	t.Logf("inject: sent %d refused %d backoffs %d syscalls %d pps %.0f in %v (max call %v, max gap %v)", ist.Sent, ist.Refused, ist.Backoffs, ist.Syscalls, ist.PPS, ist.Duration.Round(time.Millisecond), ist.MaxCall, ist.MaxGap)
	t.Logf("sink:   received %d pps %.0f expected %d lost %d reordered %d dup %d flows %d foreign %d socket_drops %d rcvbuf_errors %d in_errors %d",
		r.st.Received, r.st.PPS, r.st.Expected, r.st.Lost, r.st.Reordered, r.st.Duplicates, r.st.Flows, r.st.Foreign, r.st.SocketDrops, r.st.RcvbufErrors, r.st.InErrors)
	return ist, r.st, took
}

func TestInjectExactCount(t *testing.T) {
	tn := setupNet(t)
	sink := listen(t, udpsink.Config{Duration: 20 * time.Second, IdleTimeout: 500 * time.Millisecond})
	const n = 10000
	cfg := tn.config()
	cfg.Count, cfg.Flows, cfg.PayloadSize, cfg.Rate = n, 4, 64, 50000
	ist, sst, _ := runBoth(t, sink, cfg)
	if ist.Sent != n || ist.Unsent != 0 {
		t.Fatalf("injector sent %d (unsent %d), want %d", ist.Sent, ist.Unsent, n)
	}
	if sst.Received != n || sst.Lost != 0 || sst.Duplicates != 0 || sst.Reordered != 0 || sst.Flows != 4 || sst.Foreign != 0 {
		t.Fatalf("sink: %+v, want exactly %d in order over 4 flows", sst, n)
	}
	if sst.Bytes != n*64 {
		t.Fatalf("sink bytes %d, want %d", sst.Bytes, n*64)
	}
}

// TestInjectPlainExactCount is the native baseline: plain datagrams from a's underlay address to a
// sink bound to b's underlay address, no overlay anywhere.
func TestInjectPlainExactCount(t *testing.T) {
	const plainA, plainB = "prg-tinjp-a", "prg-tinjp-b"
	addrA, addrB := netip.MustParsePrefix("198.18.253.1/24"), netip.MustParsePrefix("198.18.253.2/24")
	tn, _, _ := setupPair(t, "prg-tinjp-", plainA, plainB, addrA, addrB)
	sink := listen(t, udpsink.Config{Netns: plainB, Addr: addrB.Addr(), Duration: 20 * time.Second, IdleTimeout: 500 * time.Millisecond})
	const n = 10000
	cfg := inject.Config{
		Netns: plainA, Device: "eth0", Plain: true,
		DstMAC: tn.macB, SrcIP: addrA.Addr(), DstIP: addrB.Addr(), InnerDstPort: sinkPort,
		Count: n, Flows: 4, PayloadSize: 64, Rate: 50000, Method: inject.MethodPacket,
	}
	ist, sst, _ := runBoth(t, sink, cfg)
	if ist.Sent != n || ist.Unsent != 0 || ist.FrameLen != 14+20+8+64 {
		t.Fatalf("injector sent %d (unsent %d) frames of %d bytes, want %d of %d", ist.Sent, ist.Unsent, ist.FrameLen, n, 14+20+8+64)
	}
	if sst.Received != n || sst.Lost != 0 || sst.Duplicates != 0 || sst.Reordered != 0 || sst.Flows != 4 || sst.Foreign != 0 {
		t.Fatalf("sink: %+v, want exactly %d in order over 4 flows", sst, n)
	}
	if sst.Bytes != n*64 { // the same application payload as the VXLAN test's
		t.Fatalf("sink bytes %d, want %d", sst.Bytes, n*64)
	}
}

func TestInjectModestRate(t *testing.T) {
	tn := setupNet(t)
	sink := listen(t, udpsink.Config{Duration: 10 * time.Second, IdleTimeout: 500 * time.Millisecond})
	cfg := tn.config()
	cfg.Duration, cfg.Rate, cfg.Flows, cfg.PayloadSize, cfg.DstPort = time.Second, 20000, 8, 256, vxlanPort
	ist, sst, _ := runBoth(t, sink, cfg)
	if ist.Sent < 15000 || ist.Sent > 21000 {
		t.Errorf("sent %d in 1 s at 20 kpps", ist.Sent)
	}
	if float64(sst.Received) < 0.9*float64(ist.Sent) {
		t.Errorf("sink received %d of %d sent (< 90 %%)", sst.Received, ist.Sent)
	}
	if sst.Reordered != 0 || sst.Duplicates != 0 {
		t.Errorf("reordered %d duplicates %d, want 0", sst.Reordered, sst.Duplicates)
	}
	if sst.Flows != 8 {
		t.Errorf("flows %d, want 8", sst.Flows)
	}
}

// TestInjectSaturated drives the receiver past what it can take with receive processing steered
// to one CPU, the arrangement where a TX-ring generator once stalled. The injector must keep going
// and end on time.
func TestInjectSaturated(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("needs 2 CPUs")
	}
	variants := []struct {
		name  string
		setup func(t *testing.T)
	}{
		{"rps", func(t *testing.T) {}},
		// veth NAPI mode (GRO on the receiver) plus a real qdisc on the sender: the peer's ring
		// fills, veth stops the queue and backpressure reaches the qdisc.
		{"napi-qdisc", func(t *testing.T) {
			if _, err := netnsutil.Run(context.Background(), nsB, "ethtool", "-K", "eth0", "gro", "on"); err != nil {
				t.Skipf("ethtool: %v", err)
			}
			if _, err := netnsutil.Run(context.Background(), nsA, "tc", "qdisc", "replace", "dev", "eth0", "root", "pfifo", "limit", "1000"); err != nil {
				t.Skipf("tc: %v", err)
			}
		}},
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			tn := setupNet(t)
			v.setup(t)
			// The NIC stage of b's eth0 on CPU 1, the sender on CPU 0 (remote-sender arrangement).
			must(t, "rps", netnsutil.WriteFileIn(nsB, "/sys/class/net/eth0/queues/rx-0/rps_cpus", "2"))
			one, zero := 1, 0
			sink := listen(t, udpsink.Config{Duration: 5 * time.Second, IdleTimeout: 300 * time.Millisecond, CPU: &one})
			cfg := tn.config()
			const d = 2 * time.Second
			cfg.Duration, cfg.Flows, cfg.CPU = d, 16, &zero
			ist, sst, took := runBoth(t, sink, cfg)
			if took > d+time.Second {
				t.Fatalf("injector took %v for a %v run", took, d)
			}
			if ist.Sent == 0 || sst.Received == 0 {
				t.Fatalf("nothing moved: sent %d received %d", ist.Sent, sst.Received)
			}
			if ist.Attempted != ist.Sent+ist.Refused {
				t.Fatalf("attempted %d != sent %d + refused %d", ist.Attempted, ist.Sent, ist.Refused)
			}
			if sst.Duplicates != 0 {
				t.Fatalf("duplicates %d", sst.Duplicates)
			}
		})
	}
}

// TestInjectWatchdog makes the kernel refuse every frame (a pfifo qdisc of length 0 drops each
// one with NET_XMIT_DROP, which AF_PACKET returns as ENOBUFS): Run must fail with ErrStalled
// after StallTimeout instead of spinning until the duration ends. (Taking the peer down does not
// work for this: the sender's queue is then deactivated to noop, which drops with NET_XMIT_CN,
// and AF_PACKET reports that as success.)
func TestInjectWatchdog(t *testing.T) {
	tn := setupNet(t)
	if _, err := netnsutil.Run(context.Background(), nsA, "tc", "qdisc", "replace", "dev", "eth0", "root", "pfifo", "limit", "0"); err != nil {
		t.Skipf("tc: %v", err)
	}
	cfg := tn.config()
	cfg.Duration, cfg.StallTimeout = 10*time.Second, 300*time.Millisecond
	start := time.Now()
	st, err := inject.Run(context.Background(), cfg)
	took := time.Since(start)
	t.Logf("took %v, stats %+v, err %v", took, st, err)
	if !errors.Is(err, inject.ErrStalled) {
		t.Fatalf("err = %v, want ErrStalled", err)
	}
	if st.Sent != 0 || st.Refused == 0 || st.Attempted != st.Refused {
		t.Fatalf("stats %+v: want only refusals", st)
	}
	if took > 2*time.Second {
		t.Fatalf("watchdog fired after %v", took)
	}
}

func TestInjectCancel(t *testing.T) {
	tn := setupNet(t)
	cfg := tn.config()
	cfg.Duration, cfg.Rate = time.Minute, 1000
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	st, err := inject.Run(ctx, cfg)
	if err != nil || st.Duration > time.Second || st.Sent == 0 {
		t.Fatalf("cancel: err %v stats %+v", err, st)
	}
}
