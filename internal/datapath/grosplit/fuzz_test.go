package grosplit

import (
	"bytes"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/peregrine-net/peregrine/internal/datapath/flow"
	"github.com/peregrine-net/peregrine/internal/testutil"
	"github.com/peregrine-net/peregrine/internal/testutil/frames"
)

// Fuzzing prg_grosplit and its cpumap program prg_gs_deq against the Go model (modelFlow, the
// slot math, the micro-flow numbering): generated frames (VXLAN of the configured ports with
// inner IPv4/IPv6 TCP/UDP flows that repeat, VLAN tags, random, damaged, and truncated at every
// offset down to the Ethernet header) in flow-affinity, batch and MFLOW modes, with one split
// CPU's cpumap entry missing. A frame the model cannot read passes untouched; any other is
// redirected to the model's slot and its CPU (the CPU the config names for that slot, and only
// if it has a cpumap entry: else it passes, counted as a miss), never dropped or changed.

type fzMode struct {
	name  string
	batch int    // plain micro-flows (cfg.batch)
	mflow *MFlow // MFLOW (elephants from packet one)
}

// fzRun is l.run with the frame checked unchanged.
func (l *loaded) fzRun(t *testing.T, frame []byte) result {
	in := append([]byte{}, frame...)
	before, err := readStats(l.objs.PrgGsStats)
	if err != nil {
		t.Fatal(err)
	}
	opts := &ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+64)}
	ret, err := l.objs.PrgGrosplit.Run(opts)
	if err != nil {
		t.Fatalf("test run: %v (% x)", err, in)
	}
	if !bytes.Equal(opts.DataOut, in) {
		t.Errorf("frame changed: % x", in)
	}
	after, err := readStats(l.objs.PrgGsStats)
	if err != nil {
		t.Fatal(err)
	}
	r := result{action: ret}
	a, b := after.PerCPU[0], before.PerCPU[0] // the thread is pinned to CPU 0
	r.redirected, r.passed = a.Redirected-b.Redirected, a.Passed-b.Passed
	r.missed, r.vxlan = a.Missed-b.Missed, a.VXLAN-b.VXLAN
	r.slot, r.cpu, r.hash = a.LastSlot, a.LastCPU, a.LastHash
	return r
}

// fzFrame is a frame for the XDP split: the underlay's VXLAN traffic of a few inner flows,
// outer traffic, random frames; some VLAN-tagged, a third damaged.
func fzFrame(rng *rand.Rand, ports []uint16) []byte {
	if rng.IntN(8) == 0 {
		return frames.Random(rng, ports)
	}
	i := rng.IntN(16)
	proto := []byte{6, 17}[i%2]
	l4 := frames.L4(proto, uint16(40000+i), 5201, rng.IntN(100))
	var inner []byte
	switch i % 4 {
	case 0:
		h := frames.IPv6{Src: frames.Addr("fd00:19::2"), Dst: frames.Addr("fd00:19::3"), Next: proto}
		if i%8 == 0 {
			h.Ext, h.Next = append(frames.Ext(60), frames.Ext(proto)...), 0
		}
		inner = frames.Eth(0x86dd, h.Wrap(l4))
	case 1:
		inner = frames.Eth(0x0806, make([]byte, 28))
	default:
		h := frames.IPv4{Src: frames.Addr("198.19.0.2"), Dst: frames.Addr("198.19.0.3"), Proto: proto}
		if rng.IntN(16) == 0 {
			h.FragOff = uint16(rng.IntN(2)) << 13
		}
		var vlans []uint16
		if rng.IntN(8) == 0 {
			vlans = make([]uint16, 1+rng.IntN(3))
		}
		inner = frames.Eth(0x0800, h.Wrap(l4), vlans...)
	}
	var f []byte
	if rng.IntN(6) == 0 { // not VXLAN: hashed on its own tuple
		f = inner
	} else {
		port := ports[rng.IntN(len(ports))]
		if rng.IntN(10) == 0 {
			port = 4790
		}
		f = frames.Encap(uint16(30000+rng.IntN(4)), port, 42, inner)
		if rng.IntN(8) == 0 { // outer VLAN tags
			f = append(append(append([]byte{}, f[:12]...), 0x81, 0, 0, byte(rng.IntN(4096))), f[12:]...)
		}
	}
	if rng.IntN(3) == 0 {
		f = frames.Mutate(rng, f, 14+20+8+8+14+48+20)
	}
	return f
}

func TestFuzzXDP(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	pinThread(t)
	possible, _ := ebpf.PossibleCPU()
	ports := DefaultVXLANPorts
	for _, m := range []fzMode{{name: "affinity"}, {name: "batch", batch: 3}, {name: "mflow", mflow: &MFlow{Batch: 4, Window: time.Second}}} {
		l := load(t)
		const n = 5
		c := gsGsCfg{N_cpus: n, Batch: uint32(m.batch)}
		copy(c.VxlanPorts[:], ports)
		for i := range n {
			c.Cpus[i] = uint32(i % possible)
		}
		// The last slot names a CPU without a cpumap entry (a CPU-set change in flight).
		c.Cpus[n-1] = uint32(possible + 3)
		hasEntry := func(cpu uint32) bool { return cpu < uint32(possible) }
		if m.mflow != nil {
			m.mflow.fill(&c)
		}
		if err := l.objs.PrgGsCfg.Update(uint32(0), &c, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
		seq := map[flow.Key]uint64{}
		rng := rand.New(rand.NewPCG(61, 62))
		runs, redirected, missed := 0, 0, 0
		check := func(b []byte) {
			if t.Failed() {
				return
			}
			runs++
			if len(seq) > 8000 { // the flow tables are LRUs of 16384: start over before they evict
				for _, m := range []*ebpf.Map{l.objs.PrgGsFlows, l.objs.PrgGsMflows} {
					var keys []gsPrgFlow
					var k gsPrgFlow
					for err := m.NextKey(nil, &k); err == nil; err = m.NextKey(k, &k) {
						keys = append(keys, k)
					}
					for _, k := range keys {
						if err := m.Delete(k); err != nil {
							t.Fatal(err)
						}
					}
				}
				clear(seq)
			}
			in := append([]byte{}, b...)
			got := l.fzRun(t, b)
			k, vx, ok := modelFlow(in, ports)
			if !ok {
				if got.action != xdpPass || got.passed != 1 || got.redirected != 0 {
					t.Errorf("%s: model passes it, program: action %d redirected %d: % x", m.name, got.action, got.redirected, in)
				}
				return
			}
			h := k.Hash()
			slot := slotOf(h, n)
			if m.batch > 0 || m.mflow != nil {
				b := m.batch
				if m.mflow != nil {
					b = m.mflow.Batch
				}
				s := seq[k]
				seq[k]++
				slot = int((uint64(slot) + s/uint64(b)) % n)
			}
			cpu := c.Cpus[slot]
			if !hasEntry(cpu) {
				missed++
				if got.action != xdpPass || got.passed != 1 || got.missed != 1 {
					t.Errorf("%s: slot %d's CPU %d has no cpumap entry: want a pass counted as a miss, got %+v: % x", m.name, slot, cpu, got, in)
				}
				return
			}
			redirected++
			want := result{action: xdpRedirect, redirected: 1, slot: slot, cpu: int(cpu), hash: h}
			if vx {
				want.vxlan = 1
			}
			if got != want {
				t.Errorf("%s: program %+v, model %+v: % x", m.name, got, want, in)
			}
		}
		for i, nf := 0, frames.FuzzCount(20000)/3; i < nf && !t.Failed(); i++ {
			f := fzFrame(rng, ports)
			if i%2048 == 0 { // every cut an XDP program can get: down to the Ethernet header
				for c := 14; c <= len(f); c++ {
					check(f[:c:c])
				}
				continue
			}
			check(f)
		}
		t.Logf("%s: %d frames, %d redirected, %d to the CPU without an entry", m.name, runs, redirected, missed)
		if redirected == 0 || missed == 0 || redirected+missed == runs {
			t.Fatalf("%s: the generator misses a path", m.name)
		}
	}
}

// prg_gs_deq (the cpumap entries' program) passes every frame untouched and counts it off the
// ring of the CPU it runs on. The kernel refuses to test-run a program of the cpumap attach
// type, so the same code is loaded as a plain XDP program (the attach type only says where it
// may be attached).
func TestFuzzCpumapDeq(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	pinThread(t)
	testutil.RequireBPF(t)
	spec, err := loadGs()
	if err != nil {
		t.Fatal(err)
	}
	possible, _ := ebpf.PossibleCPU()
	spec.Maps[gsMapPrgGsCpus].MaxEntries = uint32(possible)
	spec.Programs[gsProgPrgGsDeq].AttachType = ebpf.AttachNone
	l := &loaded{}
	if err := spec.LoadAndAssign(&l.objs, nil); err != nil {
		t.Fatalf("load: %+v", err)
	}
	defer l.objs.Close()
	rng := rand.New(rand.NewPCG(71, 72))
	var before gsGsRing
	if err := l.objs.PrgGsRings.Lookup(uint32(0), &before); err != nil {
		t.Fatal(err)
	}
	runs := 0
	for i, n := 0, frames.FuzzCount(2000); i < n && !t.Failed(); i++ {
		f := fzFrame(rng, DefaultVXLANPorts)
		in := append([]byte{}, f...)
		opts := &ebpf.RunOptions{Data: f, DataOut: make([]byte, len(f)+64)}
		ret, err := l.objs.PrgGsDeq.Run(opts)
		if err != nil {
			t.Fatalf("test run: %v", err)
		}
		runs++
		if ret != xdpPass || !bytes.Equal(opts.DataOut, in) {
			t.Fatalf("action %d, frame changed %v: % x", ret, !bytes.Equal(opts.DataOut, in), in)
		}
	}
	var after gsGsRing
	if err := l.objs.PrgGsRings.Lookup(uint32(0), &after); err != nil {
		t.Fatal(err)
	}
	if after.Deq-before.Deq != uint64(runs) || after.Enq != before.Enq {
		t.Fatalf("ring of CPU 0: deq +%d, enq +%d after %d frames", after.Deq-before.Deq, after.Enq-before.Enq, runs)
	}
}
