package falcon

import (
	"bytes"
	"net/netip"
	"runtime"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil"
	"github.com/peregrine-net/peregrine/internal/testutil/agenttest"
)

// The tests attach modes whose agents are started as this test binary.
func TestMain(m *testing.M) { agenttest.Main(m) }

const (
	tcxNext  = 0xffffffff // TCX_NEXT (-1) as the run's return value
	testSalt = 0x1234567
	testVNI  = 4096
)

// harness is a freshly loaded (unpinned) program set whose device map knows the loopback
// device BPF_PROG_TEST_RUN hands the programs.
type harness struct {
	t    *testing.T
	o    *objects
	cpus []int
}

func newHarness(t *testing.T, cpus []int, twoChoice bool, gateOpen bool) *harness {
	t.Helper()
	o := testutil.LoadObjects(t, loadObjects)
	cfg := Config{CPUs: cpus, Threshold: 80, TwoChoice: twoChoice, Repick: DefaultRepick}
	if err := o.writeConfig(cfg, []uint16{4789, 8472}); err != nil {
		t.Fatal(err)
	}
	if err := o.writeGate(Gate{Open: gateOpen, Epoch: 1}); err != nil {
		t.Fatal(err)
	}
	// The test run's skb->dev is the loopback device (ifindex 1) of our namespace.
	ino, err := netnsutil.Inode("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	if err := o.setDev(ino, 1, testSalt, StageIDVeth); err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, o: o, cpus: cpus}
}

func (h *harness) setLoad(cpu int, pct uint32) {
	h.t.Helper()
	if err := h.o.PrgFalconLoad.Put(uint32(cpu), pct); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) params(gateOpen, twoChoice bool) Params {
	p := Params{CPUs: h.cpus, Threshold: 80, TwoChoice: twoChoice, GateOpen: gateOpen, Load: map[int]uint32{}}
	for _, c := range h.cpus {
		var v uint32
		_ = h.o.PrgFalconLoad.Lookup(uint32(c), &v)
		p.Load[c] = v
	}
	return p
}

// run runs prog on frame and returns the decision it recorded. It checks the program let the
// frame through unchanged (tcx "next").
func (h *harness) run(prog *ebpf.Program, frame []byte) falFalconLast {
	h.t.Helper()
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		h.t.Fatal(err)
	}
	// Mark every CPU's slot, to find the one the run wrote (the run stays on one CPU).
	mark := make([]falFalconLast, ncpu)
	for i := range mark {
		mark[i].Kind = 0xff
	}
	if err := h.o.PrgFalconLast.Put(uint32(0), mark); err != nil {
		h.t.Fatal(err)
	}
	out := make([]byte, len(frame)+256)
	ret, err := prog.Run(&ebpf.RunOptions{Data: frame, DataOut: out})
	if err != nil {
		h.t.Fatalf("test run: %v", err)
	}
	if ret != tcxNext {
		h.t.Errorf("program returned %#x, want TCX_NEXT", ret)
	}
	if !bytes.Equal(out[:len(frame)], frame) {
		h.t.Errorf("program changed the frame")
	}
	var per []falFalconLast
	if err := h.o.PrgFalconLast.Lookup(uint32(0), &per); err != nil {
		h.t.Fatal(err)
	}
	for _, l := range per {
		if l.Kind != 0xff {
			return l
		}
	}
	h.t.Fatal("the program recorded no decision")
	return falFalconLast{}
}

// expect checks a recorded decision against the Go model.
func (h *harness) expect(got falFalconLast, want Decision, fh uint32) {
	h.t.Helper()
	if got.Kind != want.Kind {
		h.t.Fatalf("kind %s, want %s", KindName(got.Kind), KindName(want.Kind))
	}
	if got.FlowHash != fh {
		h.t.Errorf("flow hash %#x, model %#x", got.FlowHash, fh)
	}
	if want.Kind == KindGate {
		if got.Hash != 0 {
			h.t.Errorf("gate closed: hash %#x, want 0 (RPS then keeps the current CPU)", got.Hash)
		}
		if int(got.Cpu) >= runtime.NumCPU() {
			h.t.Errorf("gate closed: recorded CPU %d is not a current CPU", got.Cpu)
		}
		return
	}
	if got.Idx != want.Idx || int(got.Cpu) != want.CPU || got.Hash != want.Hash {
		h.t.Errorf("chose idx %d cpu %d hash %#x, model idx %d cpu %d hash %#x", got.Idx, got.Cpu, got.Hash, want.Idx, want.CPU, want.Hash)
	}
	n := uint32(len(h.cpus))
	if got.Hash == 0 || ReciprocalScale(got.Hash, n) != want.Idx {
		h.t.Errorf("RPS maps hash %#x to index %d of %d, want %d", got.Hash, ReciprocalScale(got.Hash, n), n, want.Idx)
	}
}

// firstBusyFlow finds a flow whose first choice is cpu's index and whose second choice differs.
func firstChoiceOn(cpus []int, salt uint32, idx uint32) Flow {
	n := uint32(len(cpus))
	for i := 0; ; i++ {
		f := testFlow(i)
		h := Fmix32(f.Hash() + salt)
		if h%n == idx && Fmix32(h)%n != idx {
			return f
		}
	}
}

func TestPortProgramFirstSecondStickyGate(t *testing.T) {
	cpus := []int{0, 1, 2, 3, 4, 5, 6, 7}
	h := newHarness(t, cpus, true, true)
	f := firstChoiceOn(cpus, testSalt, 3)
	fh := f.Hash()

	// First choice: CPU 3 is idle.
	h.expect(h.run(h.o.PrgFalconPort, innerFrame(f)), Choose(h.params(true, true), fh, testSalt), fh)

	// The same flow again, now that CPU 3 is busy: sticky, no re-pick (no reordering).
	h.setLoad(3, 95)
	got := h.run(h.o.PrgFalconPort, innerFrame(f))
	if got.Kind != KindSticky || got.Idx != 3 {
		t.Fatalf("second packet: %s idx %d, want sticky idx 3", KindName(got.Kind), got.Idx)
	}

	// A deliberate re-pick (the agent bumps the epoch when the gate re-opens): CPU 3 is busy,
	// so the second choice, kept even though it is not checked.
	if err := h.o.writeGate(Gate{Open: true, Epoch: 2}); err != nil {
		t.Fatal(err)
	}
	want := Choose(h.params(true, true), fh, testSalt)
	if want.Kind != KindSecond {
		t.Fatalf("model: %s, want second", KindName(want.Kind))
	}
	h.expect(h.run(h.o.PrgFalconPort, innerFrame(f)), want, fh)

	// Gate closed: hash 0, the stage stays on the current CPU.
	if err := h.o.writeGate(Gate{Open: false, Epoch: 2}); err != nil {
		t.Fatal(err)
	}
	h.expect(h.run(h.o.PrgFalconPort, innerFrame(f)), Choose(h.params(false, true), fh, testSalt), fh)
}

func TestStaticIgnoresLoad(t *testing.T) {
	cpus := []int{0, 1, 2, 3}
	h := newHarness(t, cpus, false, true)
	f := firstChoiceOn(cpus, testSalt, 2)
	h.setLoad(2, 100)
	want := Choose(h.params(true, false), f.Hash(), testSalt)
	if want.Kind != KindFirst || want.Idx != 2 {
		t.Fatalf("model: %+v, want first choice idx 2", want)
	}
	h.expect(h.run(h.o.PrgFalconPort, innerFrame(f)), want, f.Hash())
}

func TestNICProgramDecidesVXLANStage(t *testing.T) {
	cpus := []int{0, 2, 5}
	h := newHarness(t, cpus, true, true)
	h.setLoad(2, 90)
	salt := VNISalt(testSalt, testVNI)
	for i := 0; i < 64; i++ {
		f := testFlow(i)
		if i%2 == 1 {
			f.Proto = 6
		}
		want := Choose(h.params(true, true), f.Hash(), salt)
		h.expect(h.run(h.o.PrgFalconNic, vxlanFrame(innerFrame(f), testVNI, 4789)), want, f.Hash())
	}
	// flannel's port, IPv6 inside
	f := Flow{Src: netip.MustParseAddr("fd00::1"), Dst: netip.MustParseAddr("fd00::2"), Sport: 1, Dport: 2, Proto: 17}
	h.expect(h.run(h.o.PrgFalconNic, vxlanFrame(innerFrame(f), testVNI, 8472)), Choose(h.params(true, true), f.Hash(), salt), f.Hash())
}

// The hash written must make RPS pick exactly the chosen CPU for every set size.
func TestRPSIndexExactForSetSizes(t *testing.T) {
	for n := 1; n <= 8; n++ {
		var cpus []int
		for c := 0; c < n; c++ {
			cpus = append(cpus, c*2) // ids need not be dense: RPS indexes the set, not CPU ids
		}
		h := newHarness(t, cpus, true, true)
		seen := map[uint32]bool{}
		for i := 0; i < 40*n; i++ {
			f := testFlow(i)
			want := Choose(h.params(true, true), f.Hash(), testSalt)
			got := h.run(h.o.PrgFalconPort, innerFrame(f))
			h.expect(got, want, f.Hash())
			seen[got.Idx] = true
		}
		if len(seen) != n {
			t.Errorf("n=%d: flows used %d of the %d CPUs", n, len(seen), n)
		}
	}
}

func TestMalformedPassUntouched(t *testing.T) {
	h := newHarness(t, []int{0, 1}, true, true)
	good := innerFrame(testFlow(1))
	a, b := netip.MustParseAddr("198.19.1.1"), netip.MustParseAddr("198.19.1.2")
	a6, b6 := netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
	// BPF_PROG_TEST_RUN itself refuses an IPv4/IPv6 frame shorter than the IP header, so the
	// shortest IP frames here are a bare header.
	cases := map[string][]byte{
		"arp":                 ether(0x0806, make([]byte, 28)),
		"ethernet only":       ether(0x88b5, nil),
		"ipv4 header only":    ether(0x0800, ipv4(a, b, 17, nil)),
		"ipv4 ihl 4":          append(ether(0x0800, []byte{0x44}), make([]byte, 40)...),
		"ipv4 version 6":      append(ether(0x0800, []byte{0x65}), make([]byte, 40)...),
		"udp ports cut":       good[:14+20+2],
		"ipv6 header only":    ether(0x86dd, ipv6(a6, b6, 17, nil)),
		"vlan (not parsed)":   ether(0x8100, make([]byte, 60)),
		"ipv6 with ports cut": innerFrame(Flow{Src: netip.MustParseAddr("fd00::1"), Dst: netip.MustParseAddr("fd00::2"), Proto: 17})[:14+40+1],
	}
	for name, frame := range cases {
		t.Run("port/"+name, func(t *testing.T) {
			h.t = t
			if got := h.run(h.o.PrgFalconPort, frame); got.Kind != KindPass {
				t.Errorf("kind %s, want pass", KindName(got.Kind))
			}
		})
	}
	nic := map[string][]byte{
		"not vxlan port":  vxlanFrame(good, testVNI, 53),
		"no I flag":       func() []byte { b := vxlanFrame(good, testVNI, 4789); b[14+20+8] = 0; return b }(),
		"inner arp":       vxlanFrame(ether(0x0806, make([]byte, 28)), testVNI, 4789),
		"inner cut":       vxlanFrame(good, testVNI, 4789)[:14+20+8+8+20],
		"outer tcp":       ether(0x0800, ipv4(netip.MustParseAddr("198.18.0.2"), netip.MustParseAddr("198.18.0.1"), 6, l4(1, 4789, make([]byte, 80)))),
		"outer fragment":  func() []byte { b := vxlanFrame(good, testVNI, 4789); b[14+6] = 0x20; return b }(),
		"plain ethernet":  ether(0x88b5, nil),
		"udp, no vxlan":   ether(0x0800, ipv4(a, b, 17, l4(1, 4789, nil))),
		"arp on underlay": ether(0x0806, make([]byte, 28)),
	}
	for name, frame := range nic {
		t.Run("nic/"+name, func(t *testing.T) {
			h.t = t
			if got := h.run(h.o.PrgFalconNic, frame); got.Kind != KindPass {
				t.Errorf("kind %s, want pass", KindName(got.Kind))
			}
		})
	}
}
