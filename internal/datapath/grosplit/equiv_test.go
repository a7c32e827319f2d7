package grosplit

import (
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/bpfequiv"
)

// beforePath is prg_grosplit as it was before the cost cut of issue 12 (PRG_COSTCUT_BEFORE
// overrides it with a variant while tuning).
func beforePath() string {
	if p := os.Getenv("PRG_COSTCUT_BEFORE"); p != "" {
		return p
	}
	return "testdata/grosplit_before.o"
}

func pinThread(tb testing.TB) {
	tb.Helper()
	runtime.LockOSThread()
	var set unix.CPUSet
	set.Set(0)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		tb.Fatal(err)
	}
}

// loadBefore loads the old object with the same cpumap entries and config as l.
func (l *loaded) loadBefore(t *testing.T) *bpfequiv.Before {
	t.Helper()
	possible, _ := ebpf.PossibleCPU()
	old := bpfequiv.LoadBefore(t, beforePath(), func(s *ebpf.CollectionSpec) { s.Maps[gsMapPrgGsCpus].MaxEntries = uint32(possible) })
	old.CopyMaps(t, map[string]*ebpf.Map{"prg_gs_cfg": l.objs.PrgGsCfg})
	for cpu := 0; cpu < possible; cpu++ {
		v := gsBpfCpumapVal{Qsize: 64}
		if err := old.Coll.Maps["prg_gs_cpus"].Update(uint32(cpu), &v, ebpf.UpdateAny); err != nil {
			t.Fatalf("old cpumap entry %d: %v", cpu, err)
		}
	}
	return old
}

// The cost-cut program decides exactly as before: same action and the same stats (counters,
// last slot/CPU/hash) from the same starting bytes, plain and batch modes and MFLOW
// micro-flows over many packets of several flows.
func TestCostCutDecidesAsBefore(t *testing.T) {
	pinThread(t)
	defer runtime.UnlockOSThread()
	frames := [][]byte{
		vxlan4(51000, 4789, innerTCP4(40000, 5201)), vxlan4(51001, 4789, innerTCP4(40001, 5201)),
		vxlan4(51002, 8472, innerTCP4(40002, 80)), vxlan4(51003, 4789, innerTCP4(40003, 443)),
	}
	for name, m := range map[string]*MFlow{
		"plain": nil,
		"mflow": {Batch: 4, Window: time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			l := load(t)
			if m != nil {
				l.configureMFlow(t, 3, *m)
			} else {
				l.configure(t, 3, 0, DefaultVXLANPorts)
			}
			old := l.loadBefore(t)
			for p := 0; p < 40; p++ {
				f := frames[p%len(frames)]
				before := bpfequiv.Run(t, old.Coll.Programs["prg_grosplit"], old.Coll.Maps["prg_gs_stats"], f)
				after := bpfequiv.Run(t, l.objs.PrgGrosplit, l.objs.PrgGsStats, f)
				bpfequiv.Same(t, name, before, after)
			}
		})
	}
}

// BenchmarkCostCut times prg_grosplit before and after on the same MFLOW elephant packets,
// side by side (BPF_PROG_TEST_RUN's per-run time). go test -run XXX -bench CostCut.
func BenchmarkCostCut(b *testing.B) {
	pinThread(b)
	frame := vxlan4(51000, 4789, innerTCP4(40000, 5201))
	l := loadForBench(b)
	c := gsGsCfg{N_cpus: 2}
	copy(c.VxlanPorts[:], DefaultVXLANPorts)
	(&MFlow{Batch: 64, Window: 20 * time.Millisecond}).fill(&c)
	if err := l.objs.PrgGsCfg.Update(uint32(0), &c, ebpf.UpdateAny); err != nil {
		b.Fatal(err)
	}
	old := bpfequiv.LoadBefore(b, beforePath())
	old.CopyMaps(b, map[string]*ebpf.Map{"prg_gs_cfg": l.objs.PrgGsCfg})
	b.Run("mflow", func(b *testing.B) {
		bpfequiv.Alternate(b, old.Coll.Programs["prg_grosplit"], l.objs.PrgGrosplit, frame, 100000)
	})
}

func loadForBench(b *testing.B) *loaded {
	spec, err := loadGs()
	if err != nil {
		b.Fatal(err)
	}
	l := &loaded{}
	if err := spec.LoadAndAssign(&l.objs, nil); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.objs.Close() })
	return l
}
