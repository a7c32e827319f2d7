package grosplit

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// MFLOW mode of prg_grosplit (bpf/mflow.h): batch boundaries, round-robin CPU choice, elephant
// threshold, mice untouched. Runs are BPF_PROG_TEST_RUN (no real redirect): the slot comes from
// the debug stats, the batch counters from the per-CPU stats.

func (l *loaded) configureMFlow(t *testing.T, n int, m MFlow) {
	t.Helper()
	possible, _ := ebpf.PossibleCPU()
	c := gsGsCfg{N_cpus: uint32(n)}
	copy(c.VxlanPorts[:], DefaultVXLANPorts)
	for i := 0; i < n; i++ {
		c.Cpus[i] = uint32(i % possible)
	}
	m.fill(&c)
	if err := l.objs.PrgGsCfg.Update(uint32(0), &c, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	l.n = n
}

func (l *loaded) flowOf(t *testing.T, frame []byte) (gsMfFlowState, bool) {
	t.Helper()
	f, _, ok := modelFlow(frame, DefaultVXLANPorts)
	if !ok {
		t.Fatal("model cannot parse the frame")
	}
	k := gsPrgFlow{Saddr: f.Src, Daddr: f.Dst, Proto: f.Proto}
	k.Sport, k.Dport = f.WirePorts()
	var v gsMfFlowState
	err := l.objs.PrgGsMflows.Lookup(&k, &v)
	return v, err == nil
}

func (l *loaded) batchCounters(t *testing.T) (total uint64, bySlotCPU map[int]uint64, mice uint64) {
	t.Helper()
	s, err := readStats(l.objs.PrgGsStats)
	if err != nil {
		t.Fatal(err)
	}
	sum := s.Sum()
	return sum.Batches, sum.BatchToCPU, sum.Mice
}

func TestMFlowBatchesRotateRoundRobin(t *testing.T) {
	l := load(t)
	const n, batch, batches = 3, 4, 7
	l.configureMFlow(t, n, MFlow{Batch: batch, Window: time.Second}) // no thresholds: every flow splits
	frame := vxlan4(51000, 4789, innerTCP4(40000, 5201))
	base, _, _, ok := modelChoice(frame, n, DefaultVXLANPorts)
	if !ok {
		t.Fatal("model passes the frame")
	}
	for p := 0; p < batch*batches; p++ {
		r := l.run(t, frame)
		if r.action != xdpRedirect {
			t.Fatalf("packet %d: action %d, want redirect", p, r.action)
		}
		// Packet p belongs to batch p/B; batches rotate over the slots from the flow's slot.
		if want := (base + p/batch) % n; r.slot != want {
			t.Errorf("packet %d (batch %d): slot %d, want %d", p, p/batch, r.slot, want)
		}
	}
	total, byCPU, mice := l.batchCounters(t)
	if total != batches || mice != 0 {
		t.Errorf("batches %d (want %d), mice %d (want 0)", total, batches, mice)
	}
	var sum uint64
	for _, v := range byCPU {
		sum += v
	}
	if sum != batches {
		t.Errorf("batches by CPU %v add up to %d, want %d", byCPU, sum, batches)
	}
	st, ok := l.flowOf(t, frame)
	if !ok {
		t.Fatal("no flow state")
	}
	if st.Elephant != 1 || st.Seq != batch*batches || st.Batches != batches || st.Pkts != batch*batches {
		t.Errorf("flow state %+v: want elephant, seq=pkts=%d, batches %d", st, batch*batches, batches)
	}

	// A second flow keeps its own numbering: its first packet opens its own first batch on its
	// own hashed slot, whatever the first flow's position.
	other := vxlan4(51000, 4789, innerTCP4(40001, 5201))
	obase, _, _, _ := modelChoice(other, n, DefaultVXLANPorts)
	if r := l.run(t, other); r.slot != obase {
		t.Errorf("second flow's first packet: slot %d, want its hashed slot %d", r.slot, obase)
	}
	if total, _, _ := l.batchCounters(t); total != batches+1 {
		t.Errorf("a new flow's first packet should open a batch: %d batches", total)
	}
}

func TestMFlowBatchOfOneAlternates(t *testing.T) {
	l := load(t)
	l.configureMFlow(t, 2, MFlow{Batch: 1, Window: time.Second})
	frame := plain4("198.18.0.1", "198.18.0.2", 17, 1000, 2000)
	prev := -1
	for p := 0; p < 6; p++ {
		r := l.run(t, frame)
		if r.slot == prev {
			t.Errorf("packet %d stayed on slot %d with batch 1", p, r.slot)
		}
		prev = r.slot
	}
}

func TestMFlowMiceUntouched(t *testing.T) {
	l := load(t)
	// 1 G packets/s: nothing a test run sends is an elephant.
	l.configureMFlow(t, 2, MFlow{Batch: 4, ElephantPPS: 1e9, Window: time.Millisecond})
	frame := vxlan4(51000, 4789, innerTCP4(40000, 5201))
	for p := 0; p < 20; p++ {
		r := l.run(t, frame)
		if r.action != xdpPass || r.redirected != 0 {
			t.Fatalf("mouse packet %d: action %d redirected %d, want a pass", p, r.action, r.redirected)
		}
		if p == 10 {
			time.Sleep(2 * time.Millisecond) // a window closes: still far below the threshold
		}
	}
	total, _, mice := l.batchCounters(t)
	if mice != 20 || total != 0 {
		t.Errorf("mice %d (want 20), batches %d (want 0)", mice, total)
	}
	st, _ := l.flowOf(t, frame)
	if st.Elephant != 0 || st.Seq != 0 || st.Pkts != 20 {
		t.Errorf("flow state %+v: want a mouse with 20 packets and none numbered", st)
	}

	// Mice with affinity: redirected on the flow's hashed slot, never numbered into batches.
	l.configureMFlow(t, 2, MFlow{Batch: 4, ElephantPPS: 1e9, Window: time.Millisecond, MiceAffine: true})
	base, _, _, _ := modelChoice(frame, 2, DefaultVXLANPorts)
	for p := 0; p < 10; p++ {
		if r := l.run(t, frame); r.action != xdpRedirect || r.slot != base {
			t.Fatalf("affine mouse %d: action %d slot %d, want redirect to slot %d", p, r.action, r.slot, base)
		}
	}
}

func TestMFlowElephantThreshold(t *testing.T) {
	l := load(t)
	// 1000 packets/s over 1 ms windows: 50 packets within a few ms is far above, an idle 300 ms
	// window far below (and below half, so the flow is demoted).
	l.configureMFlow(t, 2, MFlow{Batch: 8, ElephantPPS: 1000, Window: time.Millisecond})
	frame := vxlan4(51000, 4789, innerTCP4(40000, 5201))
	if r := l.run(t, frame); r.action != xdpPass {
		t.Fatalf("a new flow starts as a mouse: action %d", r.action)
	}
	deadline := time.Now().Add(2 * time.Second)
	redirected := false
	for time.Now().Before(deadline) && !redirected {
		redirected = l.run(t, frame).action == xdpRedirect
	}
	if !redirected {
		t.Fatal("a flow far above 1000 pkt/s was never promoted")
	}
	st, _ := l.flowOf(t, frame)
	if st.Elephant != 1 || st.Promotions != 1 || st.RatePps < 1000 {
		t.Errorf("after promotion: %+v", st)
	}
	time.Sleep(300 * time.Millisecond)
	if r := l.run(t, frame); r.action != xdpPass {
		t.Errorf("after 300 ms idle the window rate is ~3 pkt/s: want demotion to a mouse, got action %d", r.action)
	}
	st, _ = l.flowOf(t, frame)
	if st.Elephant != 0 || st.Demotions != 1 {
		t.Errorf("after idling: %+v", st)
	}
}

func TestMFlowConfigChecks(t *testing.T) {
	for name, c := range map[string]Config{
		"batch 0":          {Device: "eth0", CPUs: []int{0}, MFlow: &MFlow{Batch: 0, Window: time.Second}},
		"batch too big":    {Device: "eth0", CPUs: []int{0}, MFlow: &MFlow{Batch: MaxMFlowBatch + 1, Window: time.Second}},
		"no window":        {Device: "eth0", CPUs: []int{0}, MFlow: &MFlow{Batch: 4}},
		"both batch modes": {Device: "eth0", CPUs: []int{0}, Batch: 4, MFlow: &MFlow{Batch: 4, Window: time.Second}},
	} {
		if _, err := c.withDefaults(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestMFlowRingGuardDivertsNeverDrops(t *testing.T) {
	l := load(t)
	possible, _ := ebpf.PossibleCPU()
	if possible < 2 {
		t.Skip("needs 2 CPUs")
	}
	c := gsGsCfg{N_cpus: 2, RingGuard: 10}
	copy(c.VxlanPorts[:], DefaultVXLANPorts)
	c.Cpus[0], c.Cpus[1] = 0, 1
	(&MFlow{Batch: 1000, Window: time.Second}).fill(&c)
	if err := l.objs.PrgGsCfg.Update(uint32(0), &c, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	l.n = 2
	frame := vxlan4(51000, 4789, innerTCP4(40000, 5201))
	base, _, _, _ := modelChoice(frame, 2, DefaultVXLANPorts)
	setRing := func(cpu int, inRing uint64) {
		if err := l.objs.PrgGsRings.Put(uint32(cpu), gsGsRing{Enq: 100 + inRing, Deq: 100}); err != nil {
			t.Fatal(err)
		}
	}
	setRing(0, 0)
	setRing(1, 0)
	if r := l.run(t, frame); r.action != xdpRedirect || r.slot != base {
		t.Fatalf("rings empty: action %d slot %d, want redirect to slot %d", r.action, r.slot, base)
	}
	setRing(base, 10) // the batch's ring is at the guard: the next split CPU takes the frame
	if r := l.run(t, frame); r.action != xdpRedirect || r.slot != 1-base {
		t.Errorf("batch's ring full: action %d slot %d, want redirect to slot %d", r.action, r.slot, 1-base)
	}
	setRing(1-base, 10) // every ring full: the normal path, never a drop
	if r := l.run(t, frame); r.action != xdpPass {
		t.Errorf("every ring full: action %d, want a pass", r.action)
	}
	s, _ := readStats(l.objs.PrgGsStats)
	if sum := s.Sum(); sum.Diverted < 1 || sum.Overflow != 1 {
		t.Errorf("diverted %d (want >= 1), overflow %d (want 1)", sum.Diverted, sum.Overflow)
	}
}
