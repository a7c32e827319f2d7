package inject_test

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/workload/inject"
	"github.com/peregrine-net/peregrine/internal/workload/udpsink"
)

// groOn gives b's eth0 the NAPI that XDP frames need on a veth (GRO on, as the lab's underlay).
func groOn(t *testing.T, ns string) {
	t.Helper()
	if _, err := netnsutil.Run(context.Background(), ns, "ethtool", "-K", "eth0", "gro", "on"); err != nil {
		t.Fatalf("ethtool -K eth0 gro on in %s: %v", ns, err)
	}
}

// The XDP injector delivers exactly Count VXLAN frames, every flow's sequence numbers dense and
// in order (the program stamps them), to a sink behind vxlan0.
func TestXDPInjectExactCountVXLAN(t *testing.T) {
	tn := setupNet(t)
	groOn(t, nsB)
	sink := listen(t, udpsink.Config{Duration: 20 * time.Second, IdleTimeout: 500 * time.Millisecond})
	const n = 20000
	cfg := tn.config()
	cfg.Method = inject.MethodXDP
	cfg.Count, cfg.Flows, cfg.PayloadSize, cfg.Rate = n, 4, 64, 50000
	ist, sst, _ := runBoth(t, sink, cfg)
	if ist.Method != inject.MethodXDP || ist.Sent != n {
		t.Fatalf("injector (%s) sent %d, want %d", ist.Method, ist.Sent, n)
	}
	if sst.Received != n || sst.Lost != 0 || sst.Duplicates != 0 || sst.Reordered != 0 || sst.Flows != 4 || sst.Foreign != 0 {
		t.Fatalf("sink: %+v, want exactly %d in order over 4 flows", sst, n)
	}
	if ist.SenderCPUNs == 0 {
		t.Errorf("sender CPU time not measured")
	}
}

func TestXDPInjectPlainExactCount(t *testing.T) {
	const plainA, plainB = "prg-tinjx-a", "prg-tinjx-b"
	addrA, addrB := netip.MustParsePrefix("198.18.254.1/24"), netip.MustParsePrefix("198.18.254.2/24")
	tn, _, _ := setupPair(t, "prg-tinjx-", plainA, plainB, addrA, addrB)
	groOn(t, plainB)
	sink := listen(t, udpsink.Config{Netns: plainB, Addr: addrB.Addr(), Duration: 20 * time.Second, IdleTimeout: 500 * time.Millisecond})
	const n = 10000
	cfg := inject.Config{
		Netns: plainA, Device: "eth0", Plain: true, Method: inject.MethodXDP,
		DstMAC: tn.macB, SrcIP: addrA.Addr(), DstIP: addrB.Addr(), InnerDstPort: sinkPort,
		Count: n, Flows: 3, PayloadSize: 100, Rate: 40000,
	}
	ist, sst, _ := runBoth(t, sink, cfg)
	if ist.Sent != n || sst.Received != n || sst.Lost != 0 || sst.Reordered != 0 || sst.Flows != 3 || sst.Bytes != n*100 {
		t.Fatalf("sent %d; sink %+v: want exactly %d datagrams of 100 B over 3 flows", ist.Sent, sst, n)
	}
}

// Without NAPI on the peer (GRO off, no XDP program there), a veth cannot take XDP frames: the
// frames are dropped at transmit and the injector says so (tx_dropped), rather than claiming a
// rate nobody received.
func TestXDPInjectNeedsPeerNAPI(t *testing.T) {
	tn := setupNet(t)
	if _, err := netnsutil.Run(context.Background(), nsB, "ethtool", "-K", "eth0", "gro", "off"); err != nil {
		t.Fatal(err)
	}
	cfg := tn.config()
	cfg.Method = inject.MethodXDP
	cfg.Count, cfg.Rate = 1000, 100000
	st, err := inject.Run(context.Background(), cfg)
	if !errors.Is(err, inject.ErrPeerNoXDP) || st.Sent == 0 || st.XmitDropped != st.Sent {
		t.Fatalf("GRO off on the peer: err %v, sent %d, not taken %d; want ErrPeerNoXDP with every frame counted as not taken", err, st.Sent, st.XmitDropped)
	}
}

// Unpaced, the XDP sender costs far less CPU per frame than the AF_PACKET one, measured on the
// same pair back to back (each sender's own thread CPU time per frame it sent).
func TestXDPSenderCheaperThanPacket(t *testing.T) {
	tn := setupNet(t)
	groOn(t, nsB)
	per := map[string]float64{}
	for _, m := range []string{inject.MethodPacket, inject.MethodXDP} {
		cfg := tn.config()
		cfg.Method, cfg.Duration = m, time.Second
		st, err := inject.Run(context.Background(), cfg)
		if err != nil || st.Sent == 0 {
			t.Fatalf("%s: sent %d, %v", m, st.Sent, err)
		}
		per[m] = float64(st.SenderCPUNs) / float64(st.Sent)
		t.Logf("%s: %d frames, %.0f kpps, sender %.0f ns/frame", m, st.Sent, st.PPS/1e3, per[m])
	}
	if per[inject.MethodXDP] >= per[inject.MethodPacket] {
		t.Errorf("xdp sender %.0f ns/frame, not below AF_PACKET's %.0f", per[inject.MethodXDP], per[inject.MethodPacket])
	}
}

// The program itself, through plain BPF_PROG_RUN: it stamps flow f's next number and returns
// XDP_TX; a frame too short for a payload header is aborted.
func TestXDPProgramStampsSequence(t *testing.T) {
	prog, seq, closeFn := inject.LoadProgramForTest(t, inject.Config{Plain: true})
	defer closeFn()
	c, _ := inject.Config{Plain: true, Device: "x", DstMAC: inject.MAC{2}, SrcIP: netip.MustParseAddr("10.0.0.1"),
		DstIP: netip.MustParseAddr("10.0.0.2"), InnerDstPort: 9, Flows: 3, Count: 1}.WithDefaults()
	frame := inject.BuildFrame(c, 2)
	out := make([]byte, len(frame))
	for want := uint64(0); want < 3; want++ {
		ret, err := prog.Run(&ebpf.RunOptions{Data: frame, DataOut: out})
		if err != nil || ret != 3 { // XDP_TX
			t.Fatalf("run: ret %d err %v, want XDP_TX", ret, err)
		}
		s, f, ok := inject.ParsePayload(out[c.Headroom():])
		if !ok || f != 2 || s != want {
			t.Fatalf("stamped seq %d flow %d (ok %v), want seq %d flow 2", s, f, ok, want)
		}
	}
	var vals []uint64
	if err := seq.Lookup(uint32(2), &vals); err != nil {
		t.Fatal(err)
	}
	var total uint64
	for _, v := range vals {
		total += v
	}
	if total != 3 {
		t.Fatalf("flow 2 counter %d, want 3", total)
	}
	if ret, err := prog.Run(&ebpf.RunOptions{Data: frame[:c.Headroom()+8]}); err != nil || ret != 0 { // XDP_ABORTED
		t.Fatalf("short frame: ret %d err %v, want XDP_ABORTED", ret, err)
	}
}
