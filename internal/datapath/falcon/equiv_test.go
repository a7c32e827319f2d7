package falcon

import (
	"net/netip"
	"os"
	"runtime"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/bpfequiv"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// pinTestThread keeps the test on one CPU, so a decision that records the current CPU (gate
// closed) is the same for both programs.
func pinTestThread(t *testing.T) {
	t.Helper()
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	var orig, set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &orig); err != nil {
		t.Fatal(err)
	}
	set.Set(0)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.SchedSetaffinity(0, &orig) })
}

// The cost-cut programs (issue 12: 8-byte flow key, coarse clock, writes only on change) decide
// exactly as the programs they replaced (testdata/falcon_before.o) on the same crafted packets:
// first and second choices, sticky reuse, an epoch re-pick, the closed gate, IPv6, both VXLAN
// ports, and malformed frames.
func TestCostCutProgramsDecideAsBefore(t *testing.T) {
	pinTestThread(t)
	cpus := []int{0, 2, 5, 7}
	h := newHarness(t, cpus, true, true)
	old := bpfequiv.LoadBefore(t, "testdata/falcon_before.o")
	settings := func() map[string]*ebpf.Map {
		return map[string]*ebpf.Map{"prg_falcon_cfg": h.o.PrgFalconCfg, "prg_falcon_gate": h.o.PrgFalconGate,
			"prg_falcon_dev": h.o.PrgFalconDev, "prg_falcon_load": h.o.PrgFalconLoad}
	}
	old.CopyMaps(t, settings())
	both := func(what, prog string, frame []byte) {
		t.Helper()
		before := bpfequiv.Run(t, old.Coll.Programs[prog], old.Coll.Maps["prg_falcon_last"], frame)
		after := bpfequiv.Run(t, map[string]*ebpf.Program{"prg_falcon_nic": h.o.PrgFalconNic, "prg_falcon_port": h.o.PrgFalconPort}[prog], h.o.PrgFalconLast, frame)
		if after.Record == nil {
			t.Fatalf("%s: no decision recorded", what)
		}
		bpfequiv.Same(t, what, before, after)
	}
	flows := []Flow{testFlow(1), testFlow(2), testFlow(3),
		{Src: netip.MustParseAddr("fd00::1"), Dst: netip.MustParseAddr("fd00::2"), Sport: 1, Dport: 2, Proto: 17}}
	for i := 0; i < 24; i++ {
		f := testFlow(100 + i)
		if i%3 == 0 {
			f.Proto = 6
		}
		flows = append(flows, f)
	}
	round := func(tag string) {
		for i, f := range flows {
			both(tag+" port", "prg_falcon_port", innerFrame(f))
			port := uint16(4789)
			if i%2 == 1 {
				port = 8472
			}
			both(tag+" nic", "prg_falcon_nic", vxlanFrame(innerFrame(f), testVNI, port))
		}
	}
	round("first")
	h.setLoad(2, 95)
	h.setLoad(5, 90)
	old.CopyMaps(t, settings())
	round("sticky")
	if err := h.o.writeGate(Gate{Open: true, Epoch: 2}); err != nil {
		t.Fatal(err)
	}
	old.CopyMaps(t, settings())
	round("repick with busy CPUs")
	round("sticky again")
	if err := h.o.writeGate(Gate{Open: false, Epoch: 2}); err != nil {
		t.Fatal(err)
	}
	old.CopyMaps(t, settings())
	round("gate closed")
	good := innerFrame(testFlow(1))
	for name, frame := range map[string][]byte{
		"arp": ether(0x0806, make([]byte, 28)), "udp ports cut": good[:14+20+2],
		"not vxlan": vxlanFrame(innerFrame(testFlow(1)), testVNI, 9999),
	} {
		both(name+" port", "prg_falcon_port", frame)
		both(name+" nic", "prg_falcon_nic", frame)
	}
}

// BenchmarkCostCut times the programs before and after the cost cut on the same packets,
// side by side (BPF_PROG_TEST_RUN's own per-run time, repeat 100000): a sticky flow at the NIC
// (VXLAN frame) and at a bridge port (inner frame). go test -run XXX -bench CostCut.
func BenchmarkCostCut(b *testing.B) {
	pinBench(b)
	cpus := []int{0, 1}
	o, err := loadObjects()
	if err != nil {
		b.Fatal(err)
	}
	defer o.Close()
	if err := o.writeConfig(Config{CPUs: cpus, Threshold: 80, TwoChoice: true, Repick: DefaultRepick}, []uint16{4789, 8472}); err != nil {
		b.Fatal(err)
	}
	if err := o.writeGate(Gate{Open: true, Epoch: 1}); err != nil {
		b.Fatal(err)
	}
	ino, err := netnsutil.Inode("/proc/self/ns/net")
	if err != nil {
		b.Fatal(err)
	}
	if err := o.setDev(ino, 1, testSalt, StageIDVeth); err != nil {
		b.Fatal(err)
	}
	beforePath := "testdata/falcon_before.o"
	if p := os.Getenv("PRG_COSTCUT_BEFORE"); p != "" {
		beforePath = p // a variant to compare with, while tuning
	}
	old := bpfequiv.LoadBefore(b, beforePath)
	old.CopyMaps(b, map[string]*ebpf.Map{"prg_falcon_cfg": o.PrgFalconCfg, "prg_falcon_gate": o.PrgFalconGate,
		"prg_falcon_dev": o.PrgFalconDev, "prg_falcon_load": o.PrgFalconLoad})
	f := testFlow(7)
	cases := []struct {
		name  string
		frame []byte
		prog  string
	}{{"nic", vxlanFrame(innerFrame(f), testVNI, 4789), "prg_falcon_nic"}, {"port", innerFrame(f), "prg_falcon_port"}}
	for _, c := range cases {
		after := map[string]*ebpf.Program{"prg_falcon_nic": o.PrgFalconNic, "prg_falcon_port": o.PrgFalconPort}[c.prog]
		b.Run(c.name, func(b *testing.B) { bpfequiv.Alternate(b, old.Coll.Programs[c.prog], after, c.frame, 100000) })
	}
}

func pinBench(b *testing.B) {
	runtime.LockOSThread()
	var set unix.CPUSet
	set.Set(0)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		b.Fatal(err)
	}
}
